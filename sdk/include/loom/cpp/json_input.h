// Reading JSON that comes from outside (specs, --set values, tokenizer files, checkpoint
// metadata, safetensors headers, HF configs, plugin manifests) without trusting it
// (header-only; nothing here crosses the boundary).
//
// Two rules, for every such read:
//   1. Parse with `parse_json_input`: it refuses nesting deeper than `kMaxJsonDepth` before
//      nlohmann sees the text (a value nested 100,000 deep overflows the stack of any
//      recursive walk: dump, schema validation, a checksum over a re-dump), and it turns
//      every nlohmann exception (syntax, a number beyond double such as 1e309) into a
//      loom::Error that names the file and the line and column.
//   2. Read values through `JsonIn`: every accessor checks the type (and, for integers, the
//      range) and a failure names the file and the JSON pointer of the value, e.g.
//        metadata.json: /tensors/3/shape: expected an array of integers, got false
//      instead of nlohmann's "type_error.302" surfacing as an internal error.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/cpp/error.h"

namespace loom {

/// The deepest nesting of arrays and objects that outside JSON may have. Every format loom
/// reads is a few levels deep; 256 leaves room and keeps every recursive walk of the parsed
/// value far from the stack's end.
inline constexpr int kMaxJsonDepth = 256;

/// The largest size (element count, vocabulary id, dimension) accepted from outside JSON
/// before anything is allocated from it: 2^40. Callers with a tighter bound check it too.
inline constexpr int64_t kMaxJsonSize = int64_t{1} << 40;

namespace json_input_detail {

/// 1-based line and column of byte `offset` in `text`.
inline std::pair<size_t, size_t> line_column(std::string_view text, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

/// nlohmann's message without its "[json.exception.parse_error.101] parse error at line
/// 3, column 5: " prefix.
inline std::string problem_of(const nlohmann::json::exception& e) {
  std::string what = e.what();
  size_t close = what.find("] ");
  if (close != std::string::npos) what = what.substr(close + 2);
  size_t colon = what.find(": ");
  if (what.rfind("parse error", 0) == 0 && colon != std::string::npos)
    what = what.substr(colon + 2);
  return what;
}

/// A short rendering of a value for messages: its JSON, cut at 60 characters.
inline std::string brief(const nlohmann::json& value) {
  std::string text;
  if (value.is_object()) {
    text = value.empty() ? "{}" : "an object";
  } else if (value.is_array()) {
    text = value.empty() ? "[]" : "an array";
  } else {
    text = value.dump();
  }
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

}  // namespace json_input_detail

/// The byte offset at which `text` first nests arrays and objects deeper than `max_depth`
/// (brackets inside strings do not count), or std::string_view::npos when it never does.
inline size_t json_too_deep_at(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // skip the escaped character
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return std::string_view::npos;
}

/// Parses JSON from outside loom.
/// \param text   the whole text
/// \param where  names the source in messages: a file path, "spec configs/x.json",
///               "--set train.lr=..."
/// \param code   the error's code: kInvalidArgument for user input (specs, --set),
///               kDataLoss for stored data (checkpoints, tokenizer copies)
/// \param hint   appended to every message when not empty: how to fix it
/// \throws Error(code) naming `where`, the line and column, and the problem, for a syntax
///         error, a number out of range, or nesting deeper than kMaxJsonDepth
inline nlohmann::json parse_json_input(std::string_view text, const std::string& where,
                                       Code code = Code::kInvalidArgument,
                                       const std::string& hint = {}) {
  auto fail_at = [&](size_t offset, const std::string& problem) {
    auto [line, column] = json_input_detail::line_column(text, offset);
    std::string message = where + ":" + std::to_string(line) + ":" + std::to_string(column) +
                          ": " + problem;
    if (!hint.empty()) message += "; " + hint;
    throw Error(code, message);
  };
  size_t deep = json_too_deep_at(text);
  if (deep != std::string_view::npos)
    fail_at(deep, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels (no loom file nests that deep; the file is damaged or not meant "
                      "for loom)");
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based and points just past the offending character.
    fail_at(e.byte > 0 ? e.byte - 1 : 0, json_input_detail::problem_of(e));
  } catch (const nlohmann::json::exception& e) {
    // out_of_range.406: a number beyond double ("number overflow parsing '1e309'"), which
    // carries no position: the number's first occurrence in the text gives it.
    std::string problem = json_input_detail::problem_of(e);
    size_t open = problem.find('\''), close = problem.rfind('\'');
    size_t at = open != std::string::npos && close > open
                    ? text.find(problem.substr(open + 1, close - open - 1))
                    : std::string_view::npos;
    fail_at(at != std::string_view::npos ? at : 0, problem);
  }
  return {};  // not reached
}

/// `key` as one reference token of a JSON pointer (RFC 6901): '~' becomes "~0", '/' "~1".
inline std::string json_pointer_token(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

/// A read-only view of one value inside outside JSON, that knows where it is: the source's
/// name and the value's JSON pointer. Every accessor checks the type and throws an Error
/// naming both; none throws nlohmann's exceptions.
///
///   JsonIn root(metadata, "ckpt/metadata.json", Code::kDataLoss, "re-save the checkpoint");
///   int64_t step = root["trainer"]["step"].int64(0, kMaxJsonSize);
///   for (JsonIn t : root["tensors"].elements()) names.push_back(t["name"].string());
class JsonIn {
 public:
  /// \param value  the parsed value; must outlive this view and every view taken from it
  /// \param where  the source's name for messages (a file path)
  /// \param code   the code of every error thrown (kInvalidArgument or kDataLoss)
  /// \param hint   appended to messages when not empty: how to fix it
  JsonIn(const nlohmann::json& value, std::string where, Code code = Code::kInvalidArgument,
         std::string hint = {})
      : value_(&value), where_(std::move(where)), code_(code), hint_(std::move(hint)) {}

  /// The underlying value (for checks this class does not offer).
  const nlohmann::json& json() const { return *value_; }
  /// The JSON pointer of this value ("" for the root).
  const std::string& pointer() const { return pointer_; }
  /// "file: /pointer" (or just "file" at the root), the prefix of every message.
  std::string place() const { return pointer_.empty() ? where_ : where_ + ": " + pointer_; }

  bool is_object() const { return value_->is_object(); }
  bool is_array() const { return value_->is_array(); }
  bool is_string() const { return value_->is_string(); }
  bool is_null() const { return value_->is_null(); }
  /// Whether this is an object holding `key` (false for any other type).
  bool has(const std::string& key) const { return value_->is_object() && value_->contains(key); }

  /// Member `key` of this object; throws when this is no object or `key` is missing.
  JsonIn operator[](const std::string& key) const {
    expect_object();
    auto it = value_->find(key);
    if (it == value_->end()) fail("has no entry \"" + key + "\"");
    return child(*it, "/" + escape(key));
  }
  /// Element `index` of this array; throws when this is no array or is too short.
  JsonIn operator[](size_t index) const {
    expect_array();
    if (index >= value_->size())
      fail("has " + std::to_string(value_->size()) + " elements, element " +
           std::to_string(index) + " was asked for");
    return child((*value_)[index], "/" + std::to_string(index));
  }
  /// The number of elements (array) or entries (object); throws for other types.
  size_t size() const {
    if (!value_->is_array() && !value_->is_object())
      fail("expected an array or an object, got " + json_input_detail::brief(*value_));
    return value_->size();
  }
  /// The elements of this array, as views; throws when this is no array.
  std::vector<JsonIn> elements() const {
    expect_array();
    std::vector<JsonIn> out;
    out.reserve(value_->size());
    for (size_t i = 0; i < value_->size(); ++i)
      out.push_back(child((*value_)[i], "/" + std::to_string(i)));
    return out;
  }
  /// The (key, value) entries of this object in key order; throws when this is no object.
  std::vector<std::pair<std::string, JsonIn>> items() const {
    expect_object();
    std::vector<std::pair<std::string, JsonIn>> out;
    out.reserve(value_->size());
    for (auto it = value_->begin(); it != value_->end(); ++it)
      out.emplace_back(it.key(), child(it.value(), "/" + escape(it.key())));
    return out;
  }

  /// This value as a string; throws for any other type.
  std::string string() const {
    if (!value_->is_string()) fail("expected a string, got " + json_input_detail::brief(*value_));
    return value_->get<std::string>();
  }
  /// This value as a bool; throws for any other type.
  bool boolean() const {
    if (!value_->is_boolean())
      fail("expected true or false, got " + json_input_detail::brief(*value_));
    return value_->get<bool>();
  }
  /// This value as a finite number; throws for any other type.
  double number() const {
    if (!value_->is_number() || !std::isfinite(value_->get<double>()))
      fail("expected a finite number, got " + json_input_detail::brief(*value_));
    return value_->get<double>();
  }
  /// This value as an integer in [min, max] (a float with an integral value counts, as
  /// 3.0 is 3); throws for any other type or an integer out of range.
  int64_t int64(int64_t min = std::numeric_limits<int64_t>::min(),
                int64_t max = std::numeric_limits<int64_t>::max()) const {
    int64_t v = 0;
    if (value_->is_number_unsigned()) {
      uint64_t u = value_->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) out_of(min, max);
      v = static_cast<int64_t>(u);
    } else if (value_->is_number_integer()) {
      v = value_->get<int64_t>();
    } else if (value_->is_number_float()) {
      double d = value_->get<double>();
      if (!(d == std::floor(d)) || !(d >= -9.2e18 && d <= 9.2e18))
        fail("expected an integer, got " + json_input_detail::brief(*value_));
      v = static_cast<int64_t>(d);
    } else {
      fail("expected an integer, got " + json_input_detail::brief(*value_));
    }
    if (v < min || v > max) out_of(min, max);
    return v;
  }
  /// This value as an array of integers, each in [min, max].
  std::vector<int64_t> int64_array(int64_t min = std::numeric_limits<int64_t>::min(),
                                   int64_t max = std::numeric_limits<int64_t>::max()) const {
    if (!value_->is_array())
      fail("expected an array of integers, got " + json_input_detail::brief(*value_));
    std::vector<int64_t> out;
    out.reserve(value_->size());
    for (JsonIn e : elements()) out.push_back(e.int64(min, max));
    return out;
  }
  /// This value as an array of strings.
  std::vector<std::string> string_array() const {
    if (!value_->is_array())
      fail("expected an array of strings, got " + json_input_detail::brief(*value_));
    std::vector<std::string> out;
    out.reserve(value_->size());
    for (JsonIn e : elements()) out.push_back(e.string());
    return out;
  }

  /// Throws unless this is an object.
  void expect_object() const {
    if (!value_->is_object())
      fail("expected an object, got " + json_input_detail::brief(*value_));
  }
  /// Throws unless this is an array.
  void expect_array() const {
    if (!value_->is_array()) fail("expected an array, got " + json_input_detail::brief(*value_));
  }

  /// Throws Error(code) "<file>: <pointer>: <problem>; <hint>".
  [[noreturn]] void fail(const std::string& problem) const {
    std::string message = place() + ": " + problem;
    if (!hint_.empty()) message += "; " + hint_;
    throw Error(code_, message);
  }

 private:
  JsonIn child(const nlohmann::json& value, const std::string& step) const {
    JsonIn out(value, where_, code_, hint_);
    out.pointer_ = pointer_ + step;
    return out;
  }
  [[noreturn]] void out_of(int64_t min, int64_t max) const {
    fail("integer " + value_->dump() + " is outside [" + std::to_string(min) + ", " +
         std::to_string(max) + "]");
  }
  static std::string escape(const std::string& key) { return json_pointer_token(key); }

  const nlohmann::json* value_;
  std::string where_;
  std::string pointer_;
  Code code_;
  std::string hint_;
};

}  // namespace loom
