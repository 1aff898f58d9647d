#include "core/schema/schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <regex>
#include <utility>
#include <vector>

#include "core/schema/did_you_mean.h"
#include "loom/cpp/json_input.h"

namespace loom::core {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxValueChars = 60;
// Bounds that keep std::regex (recursive in both its compiler and its executor) far from
// the end of the stack: the text a pattern is matched against, the pattern's length and
// its nesting of groups.
constexpr std::size_t kMaxPatternText = 4096;
constexpr std::size_t kMaxPattern = 1024;
constexpr int kMaxPatternNesting = 32;

// The deepest nesting of '(' in a regular expression (escaped and bracketed ones aside).
int paren_depth(const std::string& pattern) {
  int depth = 0, deepest = 0;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\') {
      ++i;
    } else if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (c == '(') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ')' && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

const std::vector<std::string> kKeywords = {"type",
                                            "properties",
                                            "required",
                                            "additionalProperties",
                                            "default",
                                            "description",
                                            "enum",
                                            "const",
                                            "minimum",
                                            "maximum",
                                            "exclusiveMinimum",
                                            "exclusiveMaximum",
                                            "minLength",
                                            "maxLength",
                                            "pattern",
                                            "items",
                                            "minItems",
                                            "maxItems",
                                            "oneOf",
                                            "anyOf",
                                            "x-loom-component",
                                            "title",
                                            "examples"};

const std::vector<std::string> kTypes = {"object", "array",   "string", "integer",
                                         "number", "boolean", "null"};

// Keywords that change nothing about which values are valid.
const std::vector<std::string> kAnnotations = {"description", "title", "default", "examples"};

bool contains(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The type of `value` as a schema spells it; integers are "integer", other numbers
// "number".
const char* type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::binary:
      return "binary";
    case json::value_t::discarded:
      return "discarded";
  }
  return "unknown";
}

bool has_type(const json& value, std::string_view type) {
  if (type == "number") return value.is_number();
  return type == type_name(value);
}

// "string \"12\"", "integer 3", "null": the type first, because a wrong type is the most
// common mistake and "12" versus 12 is easy to miss.
std::string describe(const json& value) {
  if (value.is_null()) return "null";
  return fmt::format("{} {}", type_name(value), compact_value(value));
}

// A value named in a list of choices: strings single-quoted like keys ('cosine'), anything
// else as compact JSON.
std::string choice(const json& value) {
  if (value.is_string() && value.get_ref<const std::string&>().size() <= kMaxValueChars) {
    return "'" + value.get<std::string>() + "'";
  }
  return compact_value(value);
}

// "a", "a or b", "a, b or c": like join_names but unquoted, for types and indices.
std::string join_plain(const std::vector<std::string>& words, std::string_view last = " or ") {
  std::string out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? last : ", ";
    out += words[i];
  }
  return out;
}

std::string plural(std::uint64_t count, std::string_view noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

std::vector<std::string> schema_types(const json& schema) {
  std::vector<std::string> types;
  auto it = schema.find("type");
  if (it == schema.end()) return types;
  if (it->is_string()) {
    types.push_back(it->get<std::string>());
  } else {
    for (const json& type : *it) types.push_back(type.get<std::string>());
  }
  return types;
}

// Compares two JSON numbers exactly where both are integers (int64 and uint64 mixed),
// as doubles otherwise. Returns <0, 0 or >0.
int compare_numbers(const json& a, const json& b) {
  if (a.is_number_integer() && b.is_number_integer()) {
    auto negative = [](const json& x) {
      return !x.is_number_unsigned() && x.get<std::int64_t>() < 0;
    };
    const bool a_negative = negative(a);
    const bool b_negative = negative(b);
    if (a_negative != b_negative) return a_negative ? -1 : 1;
    if (a_negative) {
      const std::int64_t x = a.get<std::int64_t>(), y = b.get<std::int64_t>();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const std::uint64_t x = a.get<std::uint64_t>(), y = b.get<std::uint64_t>();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  const double x = a.get<double>(), y = b.get<double>();
  return x < y ? -1 : (x > y ? 1 : 0);
}

// JSON Schema counts string length in code points, not bytes: count the bytes that do not
// continue a UTF-8 sequence.
std::size_t code_points(const std::string& text) {
  return static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

std::string index_pointer(std::string_view pointer, std::size_t index) {
  return fmt::format("{}/{}", pointer, index);
}

std::size_t depth(const std::string& pointer) {
  return static_cast<std::size_t>(std::count(pointer.begin(), pointer.end(), '/'));
}

// Walks a value and its schema together. `progress_` counts the checks that passed, so that
// when no alternative of a oneOf/anyOf matches, the one that got furthest names the error.
class Validator {
 public:
  explicit Validator(const SchemaHooks& hooks) : hooks_(hooks) {}

  std::size_t progress() const { return progress_; }

  void run(const json& schema, json& value, const std::string& pointer) {
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) {
        throw SpecError(pointer, "no value is allowed here, got " + describe(value));
      }
      return;
    }
    if (auto it = schema.find("x-loom-component"); it != schema.end()) {
      check_component(it->get<std::string>(), value, pointer);
      ++progress_;
      return;
    }
    check_type(schema, value, pointer);
    check_choices(schema, value, pointer);
    if (value.is_number()) check_number(schema, value, pointer);
    if (value.is_string()) check_string(schema, value, pointer);
    if (value.is_array()) check_array(schema, value, pointer);
    if (value.is_object()) check_object(schema, value, pointer);
    check_alternatives(schema, value, pointer, "anyOf");
    check_alternatives(schema, value, pointer, "oneOf");
  }

 private:
  void check_component(const std::string& kind, json& value, const std::string& pointer) {
    if (hooks_.component) {
      hooks_.component(kind, value, pointer);
      return;
    }
    if (!value.is_object()) {
      throw SpecError(pointer, fmt::format("expected a {} component (an object with a string "
                                           "'impl'), got {}",
                                           kind, describe(value)));
    }
    auto impl = value.find("impl");
    if (impl == value.end()) {
      throw SpecError(
          pointer, fmt::format("missing required key 'impl' (the {} implementation to use)", kind));
    }
    if (!impl->is_string()) {
      throw SpecError(child_pointer(pointer, "impl"), "expected string, got " + describe(*impl));
    }
  }

  void check_type(const json& schema, const json& value, const std::string& pointer) {
    if (!schema.contains("type")) return;
    const std::vector<std::string> types = schema_types(schema);
    for (const std::string& type : types) {
      if (has_type(value, type)) {
        ++progress_;
        return;
      }
    }
    throw SpecError(pointer,
                    fmt::format("expected {}, got {}", join_plain(types), describe(value)));
  }

  void check_choices(const json& schema, const json& value, const std::string& pointer) {
    if (auto it = schema.find("const"); it != schema.end()) {
      if (value != *it) {
        throw SpecError(pointer, fmt::format("expected {}, got {}", choice(*it), choice(value)));
      }
      ++progress_;
    }
    if (auto it = schema.find("enum"); it != schema.end()) {
      if (std::find(it->begin(), it->end(), value) == it->end()) {
        std::vector<std::string> listed;
        std::vector<std::string> names;  // the string members, for the suggestion
        for (const json& member : *it) {
          listed.push_back(choice(member));
          if (member.is_string()) names.push_back(member.get<std::string>());
        }
        const std::string hint =
            value.is_string() ? did_you_mean(value.get_ref<const std::string&>(), names) : "";
        throw SpecError(pointer, fmt::format("expected one of {}, got {}{}",
                                             fmt::join(listed, ", "), choice(value), hint));
      }
      ++progress_;
    }
  }

  void check_number(const json& schema, const json& value, const std::string& pointer) {
    // Every bound is named in the message, so a user fixing one does not then trip the other.
    std::vector<std::string> bounds;
    bool violated = false;
    auto bound = [&](const char* keyword, const char* op, auto&& breaks) {
      auto it = schema.find(keyword);
      if (it == schema.end()) return;
      bounds.push_back(fmt::format("{} {}", op, it->dump()));
      violated = violated || breaks(compare_numbers(value, *it));
    };
    bound("minimum", ">=", [](int c) { return c < 0; });
    bound("exclusiveMinimum", ">", [](int c) { return c <= 0; });
    bound("maximum", "<=", [](int c) { return c > 0; });
    bound("exclusiveMaximum", "<", [](int c) { return c >= 0; });
    if (bounds.empty()) return;
    if (violated) {
      const std::vector<std::string> types = schema_types(schema);
      const bool integer = contains(types, "integer") && !contains(types, "number");
      throw SpecError(pointer, fmt::format("expected {} {}, got {}", integer ? "integer" : "number",
                                           fmt::join(bounds, " and "), compact_value(value)));
    }
    ++progress_;
  }

  void check_string(const json& schema, const json& value, const std::string& pointer) {
    const std::string& text = value.get_ref<const std::string&>();
    auto min = schema.find("minLength");
    auto max = schema.find("maxLength");
    const std::size_t length = code_points(text);
    const bool too_short = min != schema.end() && length < min->get<std::uint64_t>();
    const bool too_long = max != schema.end() && length > max->get<std::uint64_t>();
    if (too_short || too_long) {
      std::string expected;
      if (min != schema.end() && max != schema.end()) {
        expected = fmt::format("{} to {}", min->get<std::uint64_t>(),
                               plural(max->get<std::uint64_t>(), "character"));
      } else if (too_short) {
        expected = "at least " + plural(min->get<std::uint64_t>(), "character");
      } else {
        expected = "at most " + plural(max->get<std::uint64_t>(), "character");
      }
      throw SpecError(pointer, fmt::format("expected string of {}, got {} ({})", expected,
                                           compact_value(value), plural(length, "character")));
    }
    if (auto it = schema.find("pattern"); it != schema.end()) {
      const std::string& pattern = it->get_ref<const std::string&>();
      // libstdc++'s regex executor recurses once per character: a long enough text
      // overflows the stack (SIGSEGV from about 20,000 characters under ASan).
      if (text.size() > kMaxPatternText)
        throw SpecError(pointer, fmt::format("a string checked against pattern '{}' may have at "
                                             "most {} characters, got {}",
                                             pattern, kMaxPatternText, text.size()));
      bool matched = false;
      try {
        matched = std::regex_search(text, std::regex(pattern, std::regex::ECMAScript));
      } catch (const std::regex_error& e) {
        throw SpecError(pointer, fmt::format("cannot match pattern '{}' against {}: {}", pattern,
                                             compact_value(value), e.what()));
      }
      if (!matched) {
        throw SpecError(pointer, fmt::format("expected string matching pattern '{}', got {}",
                                             pattern, compact_value(value)));
      }
      ++progress_;
    }
  }

  void check_array(const json& schema, json& value, const std::string& pointer) {
    auto min = schema.find("minItems");
    auto max = schema.find("maxItems");
    const std::size_t size = value.size();
    const bool too_few = min != schema.end() && size < min->get<std::uint64_t>();
    const bool too_many = max != schema.end() && size > max->get<std::uint64_t>();
    if (too_few || too_many) {
      std::string expected;
      if (min != schema.end() && max != schema.end()) {
        expected = fmt::format("{} to {}", min->get<std::uint64_t>(),
                               plural(max->get<std::uint64_t>(), "item"));
      } else if (too_few) {
        expected = "at least " + plural(min->get<std::uint64_t>(), "item");
      } else {
        expected = "at most " + plural(max->get<std::uint64_t>(), "item");
      }
      throw SpecError(pointer, fmt::format("expected array of {}, got {} ({})", expected,
                                           compact_value(value), plural(size, "item")));
    }
    if (auto items = schema.find("items"); items != schema.end()) {
      for (std::size_t i = 0; i < value.size(); ++i) {
        run(*items, value[i], index_pointer(pointer, i));
        ++progress_;
      }
    }
  }

  void check_object(const json& schema, json& value, const std::string& pointer) {
    static const json kNoProperties = json::object();
    auto properties_it = schema.find("properties");
    const json& properties = properties_it != schema.end() ? *properties_it : kNoProperties;
    auto additional = schema.find("additionalProperties");

    // Unknown keys first: a misspelt key ("stpes") would otherwise be reported as a missing
    // required one ("steps"), which hides the typo.
    if (additional != schema.end() && additional->is_boolean() && !additional->get<bool>()) {
      for (const auto& [key, member] : value.items()) {
        if (properties.contains(key)) continue;
        std::vector<std::string> allowed;
        for (const auto& [name, property] : properties.items()) allowed.push_back(name);
        std::string problem = fmt::format("unknown key '{}'{}", key, did_you_mean(key, allowed));
        problem +=
            allowed.empty() ? "; this object takes no keys" : "; allowed: " + join_names(allowed);
        throw SpecError(child_pointer(pointer, key), problem);
      }
      ++progress_;
    }

    for (const auto& [name, property] : properties.items()) {
      if (value.contains(name) || !property.is_object()) continue;
      if (auto def = property.find("default"); def != property.end()) value[name] = *def;
    }

    if (auto required = schema.find("required"); required != schema.end()) {
      for (const json& name : *required) {
        const std::string& key = name.get_ref<const std::string&>();
        if (!value.contains(key)) {
          throw SpecError(pointer, fmt::format("missing required key '{}'", key));
        }
        ++progress_;
      }
    }

    for (const auto& [name, property] : properties.items()) {
      auto member = value.find(name);
      if (member == value.end()) continue;
      run(property, *member, child_pointer(pointer, name));
      ++progress_;
    }

    if (additional != schema.end() && !additional->is_boolean()) {
      for (auto& [key, member] : value.items()) {
        if (properties.contains(key)) continue;
        run(*additional, member, child_pointer(pointer, key));
        ++progress_;
      }
    }
  }

  void check_alternatives(const json& schema, json& value, const std::string& pointer,
                          const char* keyword) {
    auto branches = schema.find(keyword);
    if (branches == schema.end()) return;
    const bool exactly_one = std::string_view(keyword) == "oneOf";

    std::vector<std::size_t> matched;
    json chosen;
    std::size_t chosen_progress = 0;
    std::optional<SpecError> best;
    std::size_t best_progress = 0;
    for (std::size_t i = 0; i < branches->size(); ++i) {
      // Each alternative fills defaults into its own copy; only the one that matches is kept.
      Validator branch(hooks_);
      json copy = value;
      try {
        branch.run((*branches)[i], copy, pointer);
      } catch (const SpecError& e) {
        if (!best || branch.progress() > best_progress ||
            (branch.progress() == best_progress && depth(e.pointer()) > depth(best->pointer()))) {
          best.emplace(e);
          best_progress = branch.progress();
        }
        continue;
      }
      matched.push_back(i);
      if (matched.size() == 1) {
        chosen = std::move(copy);
        chosen_progress = branch.progress();
      }
      if (!exactly_one) break;
    }

    if (matched.size() > 1) {
      std::vector<std::string> indices;
      for (std::size_t i : matched) indices.push_back(std::to_string(i));
      throw SpecError(pointer, fmt::format("matches alternatives {} of oneOf; it must match "
                                           "exactly one",
                                           join_plain(indices, " and ")));
    }
    if (matched.size() == 1) {
      value = std::move(chosen);
      progress_ += chosen_progress + 1;
      return;
    }
    if (branches->empty()) throw SpecError(pointer, fmt::format("{} has no alternatives", keyword));

    // When the value has none of the types the alternatives take, say so in one line
    // ("expected integer or string") rather than quoting one alternative.
    std::vector<std::string> types;
    bool type_mismatch_everywhere = true;
    for (const json& branch : *branches) {
      if (!branch.is_object() || !branch.contains("type") || branch.contains("x-loom-component")) {
        type_mismatch_everywhere = false;
        break;
      }
      for (const std::string& type : schema_types(branch)) {
        if (has_type(value, type)) type_mismatch_everywhere = false;
        if (!contains(types, type)) types.push_back(type);
      }
    }
    if (type_mismatch_everywhere) {
      throw SpecError(pointer,
                      fmt::format("expected {}, got {}", join_plain(types), describe(value)));
    }
    throw *best;
  }

  const SchemaHooks& hooks_;
  std::size_t progress_ = 0;
};

// Checks a schema node by node, so that a mistake in a component's declared options is
// reported against the component at load time, not as a puzzling spec error later.
class SchemaChecker {
 public:
  explicit SchemaChecker(const std::string& origin) : origin_(origin) {}

  void check(const json& schema, const std::string& pointer) {
    if (schema.is_boolean()) return;
    if (!schema.is_object()) {
      fail_at(pointer, "a schema must be an object or a boolean, got " + describe(schema));
    }
    for (const auto& [keyword, argument] : schema.items()) {
      check_keyword(keyword, argument, child_pointer(pointer, keyword));
    }

    if (schema.contains("x-loom-component")) {
      for (const auto& [keyword, argument] : schema.items()) {
        if (keyword == "x-loom-component" || contains(kAnnotations, keyword)) continue;
        fail_at(child_pointer(pointer, keyword),
                fmt::format("'{}' has no effect beside 'x-loom-component' (the component "
                            "validates its own options); remove it",
                            keyword));
      }
    }

    auto additional = schema.find("additionalProperties");
    auto required = schema.find("required");
    if (required != schema.end() && additional != schema.end() && *additional == false) {
      auto properties = schema.find("properties");
      for (std::size_t i = 0; i < required->size(); ++i) {
        const std::string& name = (*required)[i].get_ref<const std::string&>();
        if (properties != schema.end() && properties->contains(name)) continue;
        fail_at(index_pointer(child_pointer(pointer, "required"), i),
                fmt::format("required key '{}' is not among the properties and "
                            "additionalProperties is false, so no value can satisfy the schema",
                            name));
      }
    }

    // A default that breaks its own schema would be filled in and then rejected, blaming the
    // user's spec for the schema's mistake.
    if (auto def = schema.find("default"); def != schema.end()) {
      json copy = *def;
      try {
        validate(schema, copy, "");
      } catch (const SpecError& e) {
        fail_at(child_pointer(pointer, "default"),
                fmt::format("the default {} does not satisfy the schema: {}{}", compact_value(*def),
                            e.pointer().empty() ? "" : "at " + e.pointer() + ": ", e.problem()));
      }
    }
  }

 private:
  [[noreturn]] void fail_at(const std::string& pointer, const std::string& problem) const {
    fail(Code::kInvalidArgument, fmt::format("{}: invalid schema{}: {}", origin_,
                                             pointer.empty() ? "" : " at " + pointer, problem));
  }

  void expect(bool ok, const std::string& pointer, const std::string& keyword,
              std::string_view what, const json& argument) const {
    if (!ok) {
      fail_at(pointer, fmt::format("'{}' must be {}, got {}", keyword, what, describe(argument)));
    }
  }

  void check_keyword(const std::string& keyword, const json& argument, const std::string& pointer) {
    if (!contains(kKeywords, keyword)) {
      fail_at(pointer, fmt::format("unknown keyword '{}'{}; allowed: {}", keyword,
                                   did_you_mean(keyword, kKeywords), join_names(kKeywords)));
    }
    if (keyword == "type") {
      const bool list = argument.is_array() && !argument.empty();
      expect(argument.is_string() || list, pointer, keyword,
             "a type name or a non-empty array of them", argument);
      const json names = argument.is_string() ? json::array({argument}) : argument;
      std::vector<std::string> seen;
      for (std::size_t i = 0; i < names.size(); ++i) {
        const std::string at = list ? index_pointer(pointer, i) : pointer;
        expect(names[i].is_string(), at, keyword, "a type name or a non-empty array of them",
               names[i]);
        const std::string& name = names[i].get_ref<const std::string&>();
        if (!contains(kTypes, name)) {
          fail_at(at, fmt::format("unknown type '{}'{}; allowed: {}", name,
                                  did_you_mean(name, kTypes), join_names(kTypes)));
        }
        if (contains(seen, name)) fail_at(at, fmt::format("type '{}' is listed twice", name));
        seen.push_back(name);
      }
    } else if (keyword == "properties") {
      expect(argument.is_object(), pointer, keyword, "an object of schemas", argument);
      for (const auto& [name, property] : argument.items()) {
        check(property, child_pointer(pointer, name));
      }
    } else if (keyword == "required") {
      expect(argument.is_array(), pointer, keyword, "an array of key names", argument);
      std::vector<std::string> seen;
      for (std::size_t i = 0; i < argument.size(); ++i) {
        const std::string at = index_pointer(pointer, i);
        expect(argument[i].is_string(), at, keyword, "an array of key names", argument[i]);
        const std::string& name = argument[i].get_ref<const std::string&>();
        if (contains(seen, name)) fail_at(at, fmt::format("key '{}' is listed twice", name));
        seen.push_back(name);
      }
    } else if (keyword == "additionalProperties" || keyword == "items") {
      check(argument, pointer);
    } else if (keyword == "description" || keyword == "title") {
      expect(argument.is_string(), pointer, keyword, "a string", argument);
    } else if (keyword == "x-loom-component") {
      expect(argument.is_string() && !argument.get_ref<const std::string&>().empty(), pointer,
             keyword, "a component kind (a non-empty string)", argument);
    } else if (keyword == "examples") {
      expect(argument.is_array(), pointer, keyword, "an array", argument);
    } else if (keyword == "enum") {
      expect(argument.is_array() && !argument.empty(), pointer, keyword, "a non-empty array",
             argument);
    } else if (keyword == "minimum" || keyword == "maximum" || keyword == "exclusiveMinimum" ||
               keyword == "exclusiveMaximum") {
      expect(argument.is_number(), pointer, keyword, "a number", argument);
    } else if (keyword == "minLength" || keyword == "maxLength" || keyword == "minItems" ||
               keyword == "maxItems") {
      const bool count = argument.is_number_unsigned() ||
                         (argument.is_number_integer() && argument.get<std::int64_t>() >= 0);
      expect(count, pointer, keyword, "a non-negative integer", argument);
    } else if (keyword == "pattern") {
      expect(argument.is_string(), pointer, keyword, "a string", argument);
      // std::regex compiles by recursive descent, a level per nested group: bound the
      // pattern before compiling it.
      if (argument.get_ref<const std::string&>().size() > kMaxPattern ||
          paren_depth(argument.get_ref<const std::string&>()) > kMaxPatternNesting)
        fail_at(pointer, fmt::format("pattern {} is longer than {} characters or nests groups "
                                     "deeper than {}; write a simpler pattern",
                                     compact_value(argument), kMaxPattern, kMaxPatternNesting));
      try {
        std::regex(argument.get<std::string>(), std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        fail_at(pointer, fmt::format("pattern {} is not an ECMAScript regular expression: {}",
                                     compact_value(argument), e.what()));
      }
    } else if (keyword == "oneOf" || keyword == "anyOf") {
      expect(argument.is_array() && !argument.empty(), pointer, keyword,
             "a non-empty array of schemas", argument);
      for (std::size_t i = 0; i < argument.size(); ++i) {
        check(argument[i], index_pointer(pointer, i));
      }
    }
    // "default" and "const" take any value.
  }

  const std::string& origin_;
};

}  // namespace

void check_schema(const json& schema, const std::string& origin) {
  SchemaChecker(origin).check(schema, "");
}

void validate(const json& schema, json& value, const std::string& pointer,
              const SchemaHooks& hooks) {
  Validator(hooks).run(schema, value, pointer);
}

std::string child_pointer(std::string_view pointer, std::string_view key) {
  return std::string(pointer) + '/' + json_pointer_token(key);
}

std::string compact_value(const json& value) {
  // Replace invalid UTF-8 rather than throw: a message must never fail to print.
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() <= kMaxValueChars) return text;
  std::size_t cut = kMaxValueChars - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return text + "...";
}

}  // namespace loom::core
