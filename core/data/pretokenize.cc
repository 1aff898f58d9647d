#include "core/data/pretokenize.h"

#include <array>
#include <cstdint>

#include "core/data/unicode.h"

namespace loom::core {
namespace {

using unicode::CharClass;

// Classes of the ASCII characters, to skip the table lookup for the common case.
constexpr std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      t[c] = CharClass::kLetter;
    else if (c >= '0' && c <= '9')
      t[c] = CharClass::kNumber;
    else if (c == ' ' || (c >= 0x09 && c <= 0x0D))
      t[c] = CharClass::kSpace;
    else
      t[c] = CharClass::kOther;
  }
  return t;
}
constexpr std::array<CharClass, 128> kAsciiClasses = make_ascii_classes();

// A character of the text: code point, byte length and class.
struct Char {
  uint32_t cp;
  uint32_t len;
  CharClass cls;
};

// Reads characters of one string; positions are byte offsets.
class Scanner {
 public:
  explicit Scanner(std::string_view text) : p_(text.data()), n_(text.size()) {}

  size_t size() const { return n_; }

  Char at(size_t pos) const {
    auto c = static_cast<unsigned char>(p_[pos]);
    if (c < 0x80) return {c, 1, kAsciiClasses[c]};
    unicode::Utf8Char u = unicode::decode_utf8(p_ + pos, p_ + n_);
    return {u.cp, u.len, unicode::char_class(u.cp)};
  }

  // The ASCII byte at `pos` lower-cased, or 0 past the end or for a non-ASCII byte.
  char lower_ascii(size_t pos) const {
    if (pos >= n_) return 0;
    char c = p_[pos];
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  }
  char byte(size_t pos) const { return pos < n_ ? p_[pos] : 0; }

  // The end of the run of characters of class `cls` that starts at `pos`.
  size_t run_end(size_t pos, CharClass cls) const {
    while (pos < n_) {
      Char c = at(pos);
      if (c.cls != cls) break;
      pos += c.len;
    }
    return pos;
  }

  // For a run of white space starting at `pos`: its end, the start of its last character,
  // and the end of its last '\r' or '\n' (0 when it has none).
  struct SpaceRun {
    size_t end;
    size_t last_start;
    size_t newline_end;
  };
  SpaceRun space_run(size_t pos) const {
    SpaceRun r{pos, pos, 0};
    while (r.end < n_) {
      Char c = at(r.end);
      if (c.cls != CharClass::kSpace) break;
      r.last_start = r.end;
      r.end += c.len;
      if (c.cp == '\r' || c.cp == '\n') r.newline_end = r.end;
    }
    return r;
  }

 private:
  const char* p_;
  size_t n_;
};

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_end(const Scanner& s, size_t pos) {
  Char c = s.at(pos);
  if (c.cp == '\'') {
    char a = s.byte(pos + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    char b = s.byte(pos + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
  }
  if (c.cp == ' ' && pos + 1 < s.size()) {
    // " ?X+" with X the class of the character after the space (letters, numbers, other).
    Char d = s.at(pos + 1);
    if (d.cls != CharClass::kSpace) return s.run_end(pos + 1, d.cls);
  }
  if (c.cls != CharClass::kSpace) return s.run_end(pos, c.cls);
  // \s+(?!\S): a run followed by a non-space character gives back its last character, which
  // then starts the next pre-token (as " ?X+" when it is a space, else as \s+ alone).
  Scanner::SpaceRun run = s.space_run(pos);
  if (run.end == s.size() || run.last_start == pos) return run.end;
  return run.last_start;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
size_t llama3_end(const Scanner& s, size_t pos) {
  Char c = s.at(pos);
  if (c.cp == '\'' && pos + 1 < s.size()) {
    // Case-insensitive as Oniguruma folds case: U+017F (long s) matches 's' too.
    char a = s.lower_ascii(pos + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (s.at(pos + 1).cp == 0x17F) return pos + 3;
    char b = s.lower_ascii(pos + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
  }
  if (c.cls == CharClass::kLetter) return s.run_end(pos, CharClass::kLetter);
  bool newline = c.cp == '\r' || c.cp == '\n';
  if (c.cls != CharClass::kNumber && !newline && pos + c.len < s.size() &&
      s.at(pos + c.len).cls == CharClass::kLetter)
    return s.run_end(pos + c.len, CharClass::kLetter);
  if (c.cls == CharClass::kNumber) {
    size_t end = pos + c.len;
    for (int i = 1; i < 3 && end < s.size(); ++i) {
      Char d = s.at(end);
      if (d.cls != CharClass::kNumber) break;
      end += d.len;
    }
    return end;
  }
  size_t other = pos;
  if (c.cp == ' ' && pos + 1 < s.size() && s.at(pos + 1).cls == CharClass::kOther)
    other = pos + 1;
  else if (c.cls != CharClass::kOther)
    other = std::string_view::npos;
  if (other != std::string_view::npos) {
    size_t end = s.run_end(other, CharClass::kOther);
    while (s.byte(end) == '\r' || s.byte(end) == '\n') ++end;
    return end;
  }
  // White space: \s*[\r\n]+ ends after the run's last newline; then as in GPT-2.
  Scanner::SpaceRun run = s.space_run(pos);
  if (run.newline_end != 0) return run.newline_end;
  if (run.end == s.size() || run.last_start == pos) return run.end;
  return run.last_start;
}

}  // namespace

size_t pretoken_end(PreTokenPattern pattern, std::string_view text, size_t pos) {
  Scanner s(text);
  return pattern == PreTokenPattern::kGpt2 ? gpt2_end(s, pos) : llama3_end(s, pos);
}

std::vector<std::string_view> pretokenize(PreTokenPattern pattern, std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = pretoken_end(pattern, text, pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

}  // namespace loom::core
