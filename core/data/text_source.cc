#include "core/data/text_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/util/errors.h"
#include "core/util/files.h"
#include "loom/cpp/error.h"

namespace loom::core {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

bool ends_with_ext(const std::string& name, const std::string& ext) {
  return name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0;
}

const char* const kKnownExtensions[] = {".jsonl", ".json", ".txt",  ".text",
                                        ".md",    ".rst",  ".html", ".htm"};

std::string known_extensions() {
  std::string out;
  for (const char* e : kKnownExtensions) out += out.empty() ? e : std::string(" ") + e;
  return out;
}

std::string looked_for(const TextSourceOptions& options) {
  if (options.extensions.empty()) return known_extensions();
  std::string out;
  for (const std::string& e : options.extensions) out += (out.empty() ? "" : " ") + e;
  return out;
}

bool wanted(const fs::path& file, const TextSourceOptions& options) {
  if (options.extensions.empty()) return input_kind(file).has_value();
  std::string name = lower(file.filename().string());
  for (const std::string& ext : options.extensions)
    if (ends_with_ext(name, lower(ext))) return input_kind(file).has_value();
  return false;
}

// Lines of a file, read with getline(3): any length, '\n' and a trailing '\r' removed.
class LineReader {
 public:
  explicit LineReader(const fs::path& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "rb");
    if (file_ == nullptr)
      throw IoError(fmt::format("{}: cannot open ({})", path.string(), std::strerror(errno)));
  }
  ~LineReader() {
    std::free(buffer_);
    if (file_ != nullptr) std::fclose(file_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  /// The next line, valid until the next call; false at the end of the file.
  bool next(std::string_view* line) {
    errno = 0;
    ssize_t n = ::getline(&buffer_, &capacity_, file_);
    if (n < 0) {
      if (std::ferror(file_))
        throw IoError(fmt::format("{}: read error ({})", path_.string(), std::strerror(errno)));
      return false;
    }
    bytes_ += n;
    ++number_;
    size_t size = static_cast<size_t>(n);
    if (size > 0 && buffer_[size - 1] == '\n') --size;
    if (size > 0 && buffer_[size - 1] == '\r') --size;
    *line = std::string_view(buffer_, size);
    return true;
  }
  int64_t number() const { return number_; }
  int64_t bytes() const { return bytes_; }

 private:
  fs::path path_;
  std::FILE* file_ = nullptr;
  char* buffer_ = nullptr;
  size_t capacity_ = 0;
  int64_t number_ = 0;
  int64_t bytes_ = 0;
};

// A SAX handler that keeps only the string at one top-level key, so that a line's other
// fields (often large metadata) are validated but never built into a DOM.
class KeySax {
 public:
  using json = nlohmann::json;
  KeySax(std::string_view key, std::string* out) : key_(key), out_(out) {}

  bool null() { return value("null"); }
  bool boolean(bool) { return value("a boolean"); }
  bool number_integer(json::number_integer_t) { return value("a number"); }
  bool number_unsigned(json::number_unsigned_t) { return value("a number"); }
  bool number_float(json::number_float_t, const std::string&) { return value("a number"); }
  bool binary(json::binary_t&) { return value("binary data"); }
  bool string(std::string& s) {
    if (depth_ == 0) return top_level("a string");
    if (want_ && depth_ == 1) {
      found_ = Found::kString;
      *out_ = std::move(s);
    }
    want_ = false;
    return true;
  }
  bool start_object(std::size_t) {
    if (want_ && depth_ == 1) other("an object");
    want_ = false;
    ++depth_;
    return true;
  }
  bool key(std::string& k) {
    if (depth_ == 1) {
      want_ = k == key_;
      if (keys_.size() < 8) keys_.push_back(k);
    }
    return true;
  }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (depth_ == 0) return top_level("an array");
    if (want_ && depth_ == 1) other("an array");
    want_ = false;
    ++depth_;
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..."
    std::string what = ex.what();
    size_t at = what.find("] ");
    if (at != std::string::npos) what = what.substr(at + 2);
    if (what.rfind("parse error at line 1, ", 0) == 0) what = what.substr(23);
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    error_ = "not JSON (" + what + ")";
    return false;
  }

  /// The message for a line that did not yield a string, after sax_parse.
  std::string problem() const {
    if (!error_.empty()) return error_;
    if (found_ == Found::kOther)
      return fmt::format("key \"{}\" holds {}, not a string", key_, other_type_);
    std::string keys;
    for (const std::string& k : keys_) keys += (keys.empty() ? "\"" : ", \"") + k + "\"";
    return fmt::format("no key \"{}\" (keys: {}); choose the field with --json-key", key_,
                       keys.empty() ? "none" : keys);
  }
  bool found_string() const { return found_ == Found::kString && error_.empty(); }

 private:
  enum class Found { kMissing, kString, kOther };
  bool value(const char* type) {
    if (depth_ == 0) return top_level(type);
    if (want_ && depth_ == 1) other(type);
    want_ = false;
    return true;
  }
  void other(const char* type) {
    found_ = Found::kOther;
    other_type_ = type;
  }
  bool top_level(const char* type) {
    error_ = fmt::format("not a JSON object but {}", type);
    return false;
  }

  std::string_view key_;
  std::string* out_;
  int depth_ = 0;
  bool want_ = false;
  Found found_ = Found::kMissing;
  const char* other_type_ = "";
  std::vector<std::string> keys_;
  std::string error_;
};

void read_text_file(const fs::path& file, InputKind kind, const TextSourceOptions& options,
                    const std::function<void(RawDocument&&)>& sink, TextSourceStats* stats) {
  const fs::path* name = &file;
  if (kind == InputKind::kJsonl ||
      (kind == InputKind::kText && options.txt_mode != TxtMode::kFile)) {
    LineReader reader(file);
    std::string_view line;
    RawDocument paragraph{kind, {name, 0}, {}};
    auto flush_paragraph = [&] {
      if (paragraph.origin.line != 0) sink(std::move(paragraph));
      paragraph = RawDocument{kind, {name, 0}, {}};
    };
    while (reader.next(&line)) {
      if (kind == InputKind::kJsonl) {
        if (!is_blank(line)) sink(RawDocument{kind, {name, reader.number()}, std::string(line)});
      } else if (options.txt_mode == TxtMode::kLine) {
        sink(RawDocument{kind, {name, reader.number()}, std::string(line)});
      } else if (is_blank(line)) {
        flush_paragraph();
      } else {
        if (paragraph.origin.line == 0) {
          paragraph.origin.line = reader.number();
        } else {
          paragraph.bytes += '\n';
        }
        paragraph.bytes += line;
      }
    }
    flush_paragraph();
    stats->bytes += reader.bytes();
  } else {
    RawDocument raw{kind, {name, 0}, read_file(file)};
    stats->bytes += static_cast<int64_t>(raw.bytes.size());
    sink(std::move(raw));
  }
  ++stats->files;
}

std::string describe_inputs(const std::vector<fs::path>& inputs) {
  std::string out;
  for (size_t i = 0; i < inputs.size() && i < 3; ++i) out += (i ? ", " : "") + inputs[i].string();
  if (inputs.size() > 3) out += fmt::format(" and {} more", inputs.size() - 3);
  return out;
}

}  // namespace

TxtMode parse_txt_mode(std::string_view text) {
  if (text == "file") return TxtMode::kFile;
  if (text == "line") return TxtMode::kLine;
  if (text == "paragraph") return TxtMode::kParagraph;
  fail(Code::kInvalidArgument,
       fmt::format("unknown text mode '{}'; choose file, line or paragraph", text));
}

std::string DocumentOrigin::describe() const {
  std::string name = file != nullptr ? file->string() : std::string("?");
  return line > 0 ? fmt::format("{}:{}", name, line) : name;
}

std::optional<InputKind> input_kind(const fs::path& file) {
  std::string name = lower(file.filename().string());
  if (ends_with_ext(name, ".jsonl") || ends_with_ext(name, ".json")) return InputKind::kJsonl;
  if (ends_with_ext(name, ".txt") || ends_with_ext(name, ".text") || ends_with_ext(name, ".md") ||
      ends_with_ext(name, ".rst"))
    return InputKind::kText;
  if (ends_with_ext(name, ".html") || ends_with_ext(name, ".htm")) return InputKind::kHtml;
  return std::nullopt;
}

bool is_blank(std::string_view text) {
  for (char c : text)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

std::vector<fs::path> list_input_files(const std::vector<fs::path>& inputs,
                                       const TextSourceOptions& options) {
  if (inputs.empty()) fail(Code::kInvalidArgument, "no inputs given");
  std::vector<fs::path> files;
  for (const fs::path& input : inputs) {
    std::error_code ec;
    fs::file_status status = fs::status(input, ec);
    if (ec || !fs::exists(status))
      throw IoError(fmt::format("{}: no such file or directory", input.string()));
    if (fs::is_directory(status)) {
      std::vector<fs::path> found;
      try {
        for (auto it = fs::recursive_directory_iterator(input); it != fs::end(it); ++it) {
          const fs::path& p = it->path();
          if (p.filename().string().starts_with(".")) {
            if (it->is_directory()) it.disable_recursion_pending();
            continue;
          }
          if (it->is_regular_file() && wanted(p, options)) found.push_back(p);
        }
      } catch (const fs::filesystem_error& e) {
        throw IoError(fmt::format("{}: cannot list ({})", e.path1().string(), e.code().message()));
      }
      if (found.empty())
        throw IoError(fmt::format("{}: no input files in this directory (looked for {})",
                                  input.string(), looked_for(options)));
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(status)) {
      if (!input_kind(input))
        fail(Code::kInvalidArgument, fmt::format("{}: unknown input kind; known extensions: {}",
                                                 input.string(), known_extensions()));
      files.push_back(input);
    } else {
      throw IoError(fmt::format("{}: not a regular file or directory", input.string()));
    }
  }
  return files;
}

void read_raw_documents(const std::vector<fs::path>& files, const TextSourceOptions& options,
                        const std::function<void(RawDocument&&)>& sink, TextSourceStats* stats) {
  for (const fs::path& file : files) {
    std::optional<InputKind> kind = input_kind(file);
    LOOM_CHECK(kind.has_value(), "input of unknown kind: ", file.string());
    read_text_file(file, *kind, options, sink, stats);
  }
}

std::optional<std::string_view> extract_text(const RawDocument& raw,
                                             const TextSourceOptions& options, std::string& scratch,
                                             std::string* error) {
  switch (raw.kind) {
    case InputKind::kText:
      return std::string_view(raw.bytes);
    case InputKind::kHtml:
      scratch = html_to_text(raw.bytes);
      return std::string_view(scratch);
    case InputKind::kJsonl: {
      scratch.clear();
      KeySax sax(options.json_key, &scratch);
      nlohmann::json::sax_parse(raw.bytes.begin(), raw.bytes.end(), &sax,
                                nlohmann::json::input_format_t::json, /*strict=*/true);
      if (sax.found_string()) return std::string_view(scratch);
      if (error != nullptr) *error = raw.origin.describe() + ": " + sax.problem();
      return std::nullopt;
    }
  }
  return std::nullopt;
}

TextSourceStats for_each_document(
    const std::vector<fs::path>& inputs, const TextSourceOptions& options,
    const std::function<void(std::string_view, const DocumentOrigin&)>& fn) {
  const std::vector<fs::path> files = list_input_files(inputs, options);
  TextSourceStats stats;
  std::string scratch, error;
  read_raw_documents(
      files, options,
      [&](RawDocument&& raw) {
        std::optional<std::string_view> text = extract_text(raw, options, scratch, &error);
        if (!text) {
          if (!options.skip_bad_lines)
            throw IoError(error + "; --skip-bad-lines skips and counts such lines");
          if (stats.bad_lines++ == 0) stats.first_bad_line = error;
          return;
        }
        if (is_blank(*text)) {
          ++stats.empty_documents;
          return;
        }
        ++stats.documents;
        fn(*text, raw.origin);
      },
      &stats);
  if (stats.documents == 0)
    throw IoError(fmt::format(
        "no documents in {} ({} files, {} bytes; {} empty documents and {} bad lines skipped)",
        describe_inputs(inputs), stats.files, stats.bytes, stats.empty_documents, stats.bad_lines));
  return stats;
}

}  // namespace loom::core
