// HTML pages reduced to text for preprocessing (text_source.h). Not a conforming HTML
// parser: a single pass over tags and text that is right for the pages people train on
// (documentation, articles) and never fails, whatever the input.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/data/text_source.h"

namespace loom::core {

namespace {

// HTML 4's Latin-1 entities, U+00A0 to U+00FF in order.
constexpr const char* kLatin1[96] = {
    "nbsp",   "iexcl",  "cent",   "pound",  "curren", "yen",    "brvbar", "sect",   "uml",
    "copy",   "ordf",   "laquo",  "not",    "shy",    "reg",    "macr",   "deg",    "plusmn",
    "sup2",   "sup3",   "acute",  "micro",  "para",   "middot", "cedil",  "sup1",   "ordm",
    "raquo",  "frac14", "frac12", "frac34", "iquest", "Agrave", "Aacute", "Acirc",  "Atilde",
    "Auml",   "Aring",  "AElig",  "Ccedil", "Egrave", "Eacute", "Ecirc",  "Euml",   "Igrave",
    "Iacute", "Icirc",  "Iuml",   "ETH",    "Ntilde", "Ograve", "Oacute", "Ocirc",  "Otilde",
    "Ouml",   "times",  "Oslash", "Ugrave", "Uacute", "Ucirc",  "Uuml",   "Yacute", "THORN",
    "szlig",  "agrave", "aacute", "acirc",  "atilde", "auml",   "aring",  "aelig",  "ccedil",
    "egrave", "eacute", "ecirc",  "euml",   "igrave", "iacute", "icirc",  "iuml",   "eth",
    "ntilde", "ograve", "oacute", "ocirc",  "otilde", "ouml",   "divide", "oslash", "ugrave",
    "uacute", "ucirc",  "uuml",   "yacute", "thorn",  "yuml",
};

struct NamedEntity {
  const char* name;
  uint32_t code;
};

// The other entities common in real pages: markup, typography, arrows, maths, Greek.
constexpr NamedEntity kOther[] = {
    {"quot", 34},     {"amp", 38},      {"apos", 39},     {"lt", 60},       {"gt", 62},
    {"OElig", 338},   {"oelig", 339},   {"Scaron", 352},  {"scaron", 353},  {"Yuml", 376},
    {"fnof", 402},    {"circ", 710},    {"tilde", 732},   {"ensp", 8194},   {"emsp", 8195},
    {"thinsp", 8201}, {"zwnj", 8204},   {"zwj", 8205},    {"lrm", 8206},    {"rlm", 8207},
    {"ndash", 8211},  {"mdash", 8212},  {"lsquo", 8216},  {"rsquo", 8217},  {"sbquo", 8218},
    {"ldquo", 8220},  {"rdquo", 8221},  {"bdquo", 8222},  {"dagger", 8224}, {"Dagger", 8225},
    {"bull", 8226},   {"hellip", 8230}, {"permil", 8240}, {"prime", 8242},  {"Prime", 8243},
    {"lsaquo", 8249}, {"rsaquo", 8250}, {"euro", 8364},   {"trade", 8482},  {"larr", 8592},
    {"uarr", 8593},   {"rarr", 8594},   {"darr", 8595},   {"harr", 8596},   {"lArr", 8656},
    {"rArr", 8658},   {"hArr", 8660},   {"forall", 8704}, {"exist", 8707},  {"isin", 8712},
    {"sum", 8721},    {"prod", 8719},   {"minus", 8722},  {"lowast", 8727}, {"radic", 8730},
    {"infin", 8734},  {"and", 8743},    {"or", 8744},     {"cap", 8745},    {"cup", 8746},
    {"asymp", 8776},  {"ne", 8800},     {"equiv", 8801},  {"le", 8804},     {"ge", 8805},
    {"sub", 8834},    {"sup", 8835},    {"sdot", 8901},   {"loz", 9674},    {"hearts", 9829},
};

constexpr const char* kGreekUpper[] = {"Alpha", "Beta",  "Gamma",   "Delta", "Epsilon", "Zeta",
                                       "Eta",   "Theta", "Iota",    "Kappa", "Lambda",  "Mu",
                                       "Nu",    "Xi",    "Omicron", "Pi",    "Rho",     "",
                                       "Sigma", "Tau",   "Upsilon", "Phi",   "Chi",     "Psi",
                                       "Omega"};  // U+0391..U+03A9 (U+03A2 is unassigned)
constexpr const char* kGreekLower[] = {
    "alpha", "beta",   "gamma",   "delta", "epsilon", "zeta",    "eta",  "theta", "iota",
    "kappa", "lambda", "mu",      "nu",    "xi",      "omicron", "pi",   "rho",   "sigmaf",
    "sigma", "tau",    "upsilon", "phi",   "chi",     "psi",     "omega"};  // U+03B1..U+03C9

const std::unordered_map<std::string_view, uint32_t>& entity_table() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, uint32_t>();
    for (uint32_t i = 0; i < 96; ++i) t->emplace(kLatin1[i], 160 + i);
    for (const NamedEntity& e : kOther) t->emplace(e.name, e.code);
    for (uint32_t i = 0; i < 25; ++i) {
      if (*kGreekUpper[i] != '\0') t->emplace(kGreekUpper[i], 0x391 + i);
      t->emplace(kGreekLower[i], 0x3B1 + i);
    }
    return t;
  }();
  return *table;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes the entity at text[i] == '&' into `out`; returns the characters it spans, or 0
// when there is none (the '&' is then literal).
size_t decode_entity(std::string_view text, size_t i, std::string& out) {
  size_t semi = text.find(';', i + 1);
  if (semi == std::string_view::npos || semi - i > 40 || semi == i + 1) return 0;
  std::string_view body = text.substr(i + 1, semi - i - 1);
  if (body[0] == '#') {
    bool hex = body.size() > 1 && (body[1] == 'x' || body[1] == 'X');
    std::string_view digits = body.substr(hex ? 2 : 1);
    if (digits.empty() || digits.size() > 8) return 0;
    uint32_t cp = 0;
    for (char c : digits) {
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = static_cast<uint32_t>(c - '0');
      } else if (hex && c >= 'a' && c <= 'f') {
        d = static_cast<uint32_t>(c - 'a' + 10);
      } else if (hex && c >= 'A' && c <= 'F') {
        d = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return 0;
      }
      cp = cp * (hex ? 16 : 10) + d;
    }
    append_utf8(out, cp);
    return semi - i + 1;
  }
  const auto& table = entity_table();
  auto it = table.find(body);
  if (it == table.end()) return 0;
  append_utf8(out, it->second);
  return semi - i + 1;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == ':';
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// Accumulates text with HTML's whitespace rules: runs of whitespace become one space, block
// boundaries become one or two newlines, nothing leads or trails.
class TextBuilder {
 public:
  /// Text outside <pre>: whitespace (U+00A0 included) collapses.
  void text(std::string_view s) {
    for (size_t i = 0; i < s.size(); ++i) {
      if (nbsp_at(s, i)) {
        ++i;
        space_ = true;
      } else if (is_space(s[i])) {
        space_ = true;
      } else {
        emit(s[i]);
      }
    }
  }
  /// Text inside <pre>: kept as written (U+00A0 becomes a space, '\r' dropped).
  void pre_text(std::string_view s) {
    for (size_t i = 0; i < s.size(); ++i) {
      if (nbsp_at(s, i)) {
        ++i;
        emit(' ');
      } else if (s[i] != '\r') {
        emit(s[i]);
      }
    }
  }
  /// A block boundary: 1 a line break, 2 a blank line.
  void block(int level) { break_ = std::max(break_, level); }
  /// A boundary that separates words (table cells).
  void space() { space_ = true; }

  std::string finish() {
    while (!out_.empty() && is_space(out_.back())) out_.pop_back();
    return std::move(out_);
  }

 private:
  static bool nbsp_at(std::string_view s, size_t i) {
    return static_cast<unsigned char>(s[i]) == 0xC2 && i + 1 < s.size() &&
           static_cast<unsigned char>(s[i + 1]) == 0xA0;
  }
  void emit(char c) {
    if (out_.empty()) {
      if (is_space(c)) return;  // nothing leads
    } else if (break_ > 0) {
      while (!out_.empty() && (out_.back() == ' ' || out_.back() == '\t')) out_.pop_back();
      int have = 0;
      for (auto it = out_.rbegin(); it != out_.rend() && *it == '\n'; ++it) ++have;
      for (int i = have; i < break_; ++i) out_ += '\n';
    } else if (space_ && !is_space(out_.back())) {
      out_ += ' ';
    }
    break_ = 0;
    space_ = false;
    out_ += c;
  }

  std::string out_;
  int break_ = 0;
  bool space_ = false;
};

// Block elements: 2 starts and ends a paragraph, 1 a line.
int block_level(std::string_view tag) {
  static const std::unordered_map<std::string_view, int> kLevels = {
      {"p", 2},          {"h1", 2},      {"h2", 2},      {"h3", 2},         {"h4", 2},
      {"h5", 2},         {"h6", 2},      {"pre", 2},     {"blockquote", 2}, {"table", 2},
      {"ul", 2},         {"ol", 2},      {"dl", 2},      {"section", 2},    {"article", 2},
      {"aside", 2},      {"header", 2},  {"footer", 2},  {"nav", 2},        {"figure", 2},
      {"hr", 2},         {"main", 2},    {"address", 2}, {"details", 2},    {"br", 1},
      {"div", 1},        {"li", 1},      {"tr", 1},      {"dd", 1},         {"dt", 1},
      {"figcaption", 1}, {"caption", 1}, {"thead", 1},   {"tbody", 1},      {"tfoot", 1},
      {"summary", 1},    {"option", 1},
  };
  auto it = kLevels.find(tag);
  return it == kLevels.end() ? 0 : it->second;
}

// Elements dropped with everything inside them.
bool dropped(std::string_view tag) {
  return tag == "script" || tag == "style" || tag == "head" || tag == "template" || tag == "svg" ||
         tag == "title" || tag == "noscript";
}

// A tag at html[i] == '<': its lower-case name, whether it closes, its attributes (raw), and
// where it ends (one past '>'). name is empty when html[i] starts no tag.
struct Tag {
  std::string name;
  bool closing = false;
  std::string_view attributes;
  size_t end = 0;
};

Tag parse_tag(std::string_view html, size_t i) {
  Tag tag;
  size_t j = i + 1;
  if (j < html.size() && html[j] == '/') {
    tag.closing = true;
    ++j;
  }
  size_t name_begin = j;
  if (j >= html.size() ||
      !((html[j] >= 'a' && html[j] <= 'z') || (html[j] >= 'A' && html[j] <= 'Z')))
    return tag;
  while (j < html.size() && is_name_char(html[j])) ++j;
  tag.name = lower(html.substr(name_begin, j - name_begin));
  size_t attr_begin = j;
  char quote = 0;
  while (j < html.size()) {
    char c = html[j];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '>') {
      break;
    }
    ++j;
  }
  tag.attributes = html.substr(attr_begin, j - attr_begin);
  tag.end = j < html.size() ? j + 1 : html.size();
  return tag;
}

// Where the element opened at html[open] (named `name`) closes: the index of its closing
// tag's '<', counting nested elements of the same name; html.size() when it never closes.
// `lc` is html in lower case.
size_t matching_close(std::string_view lc, std::string_view name, size_t open) {
  int depth = 1;
  size_t i = lc.find('>', open);
  while (i != std::string_view::npos && i < lc.size()) {
    i = lc.find('<', i);
    if (i == std::string_view::npos) break;
    if (lc.compare(i, 4, "<!--") == 0) {
      i = lc.find("-->", i + 4);
      continue;
    }
    bool closing = i + 1 < lc.size() && lc[i + 1] == '/';
    size_t n = i + (closing ? 2 : 1);
    if (lc.compare(n, name.size(), name) == 0 &&
        (n + name.size() >= lc.size() || !is_name_char(lc[n + name.size()]))) {
      depth += closing ? -1 : 1;
      if (depth == 0) return i;
    }
    ++i;
  }
  return lc.size();
}

// The main content's range: the element with role="main" (Sphinx's <div class="body"
// role="main">), else a <main> element, else the whole page.
std::pair<size_t, size_t> main_range(std::string_view lc) {
  size_t role = lc.find("role=\"main\"");
  if (role == std::string_view::npos) role = lc.find("role='main'");
  size_t open = std::string_view::npos;
  if (role != std::string_view::npos) {
    size_t lt = lc.rfind('<', role);
    if (lt != std::string_view::npos && lc.find('>', lt) > role) open = lt;
  }
  if (open == std::string_view::npos) {
    size_t m = lc.find("<main");
    if (m != std::string_view::npos && (m + 5 >= lc.size() || !is_name_char(lc[m + 5]))) open = m;
  }
  if (open == std::string_view::npos) return {0, lc.size()};
  size_t n = open + 1;
  while (n < lc.size() && is_name_char(lc[n])) ++n;
  std::string_view name = lc.substr(open + 1, n - open - 1);
  size_t gt = lc.find('>', open);
  if (name.empty() || gt == std::string_view::npos) return {0, lc.size()};
  return {gt + 1, matching_close(lc, name, open)};
}

}  // namespace

std::string decode_html_entities(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '&') {
      size_t used = decode_entity(text, i, out);
      if (used > 0) {
        i += used - 1;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

std::string html_to_text(std::string_view page) {
  const std::string lc_page = lower(page);
  const auto [begin, end] = main_range(lc_page);
  const std::string_view html = page.substr(begin, end - begin);
  const std::string_view lc = std::string_view(lc_page).substr(begin, end - begin);

  TextBuilder out;
  int pre = 0;                  // depth of open <pre> elements
  bool after_pre_open = false;  // HTML drops a newline right after <pre>
  size_t i = 0;
  auto skip_past = [&](std::string_view needle, size_t from) {
    size_t at = lc.find(needle, from);
    return at == std::string_view::npos ? html.size() : at + needle.size();
  };
  while (i < html.size()) {
    if (html[i] != '<') {
      size_t next = html.find('<', i);
      if (next == std::string_view::npos) next = html.size();
      std::string text = decode_html_entities(html.substr(i, next - i));
      if (pre > 0) {
        std::string_view t = text;
        if (after_pre_open && t.starts_with("\r\n")) t.remove_prefix(2);
        if (after_pre_open && t.starts_with("\n")) t.remove_prefix(1);
        out.pre_text(t);
      } else {
        out.text(text);
      }
      after_pre_open = false;
      i = next;
      continue;
    }
    if (lc.compare(i, 4, "<!--") == 0) {
      i = skip_past("-->", i + 4);
      continue;
    }
    if (i + 1 < html.size() && (html[i + 1] == '!' || html[i + 1] == '?')) {
      i = skip_past(">", i);  // <!DOCTYPE ...>, <![CDATA[...]]> and <?xml ...?>
      continue;
    }
    Tag tag = parse_tag(html, i);
    if (tag.name.empty()) {  // a '<' that starts no tag ("a < b") is text
      if (pre > 0) {
        out.pre_text("<");
      } else {
        out.text("<");
      }
      ++i;
      continue;
    }
    i = tag.end;
    const bool self_closing = tag.attributes.ends_with("/");
    if (!tag.closing && !self_closing &&
        (dropped(tag.name) ||
         (tag.name == "a" && lower(tag.attributes).find("headerlink") != std::string::npos))) {
      size_t close = lc.find("</" + tag.name, i);
      i = close == std::string_view::npos ? html.size() : skip_past(">", close);
      continue;
    }
    if (tag.name == "pre") {
      if (tag.closing) {
        pre = std::max(0, pre - 1);
      } else if (!self_closing) {
        ++pre;
        after_pre_open = true;
      }
    }
    if (tag.name == "td" || tag.name == "th") {
      out.space();
    } else if (int level = block_level(tag.name); level > 0) {
      out.block(level);
    }
  }
  return out.finish();
}

}  // namespace loom::core
