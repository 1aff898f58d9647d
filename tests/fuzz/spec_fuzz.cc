// The spec: parse the text, then validate it as `loom spec validate` does without --load
// (core/spec resolve_spec: the core schema, defaults, every {"impl": NAME} node). Plugin
// manifests are not read here: every component NAME is known, with one fixed options schema
// that uses the keywords components use (so option validation is exercised too). Its
// sub-component "child" has no default: a default {"impl": ...} under a schema that every
// name shares would nest without end (a plugin could write such a schema too; see README).
#include <nlohmann/json.hpp>

#include "core/spec/spec.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

const nlohmann::json& options_schema() {
  static const nlohmann::json schema = nlohmann::json::parse(R"({
    "type": "object",
    "additionalProperties": false,
    "properties": {
      "impl": {"type": "string"},
      "size": {"type": "integer", "minimum": 1, "maximum": 1000000, "default": 8},
      "rate": {"type": "number", "exclusiveMinimum": 0, "default": 0.5},
      "mode": {"enum": ["a", "b", "c"], "default": "a"},
      "name": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-z_]+$"},
      "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 8},
      "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
      "either": {"oneOf": [{"type": "integer"}, {"type": "string", "enum": ["auto"]}]},
      "child": {"x-loom-component": "child"},
      "nested": {
        "type": "object",
        "properties": {"depth": {"type": "integer", "default": 2}},
        "additionalProperties": {"type": ["string", "null"]}
      }
    }
  })");
  return schema;
}

}  // namespace

LOOM_FUZZ_TARGET(spec) {
  nlohmann::json spec =
      loom::core::parse_spec_text(std::string(loom::fuzz::as_text(data, size)), "fuzz.json");
  auto lookup = [](const std::string&, const std::string& name, nlohmann::json* schema) {
    if (name == "unknown") return false;
    *schema = options_schema();
    return true;
  };
  auto names_of_kind = [](const std::string&) {
    return std::vector<std::string>{"gpt", "llama", "adamw", "sharded"};
  };
  auto provider_of = [](const std::string&, const std::string&) { return std::string("fuzz"); };
  std::vector<loom::core::ImplUse> uses =
      loom::core::resolve_spec(spec, lookup, names_of_kind, provider_of, "(fuzz)");
  // What `spec validate` does with the result: print it and write the resolved spec.
  (void)spec.dump(2);
}
