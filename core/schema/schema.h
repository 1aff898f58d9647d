// Validation of specs and component options against a JSON Schema subset.
//
// Every component declares the schema of its options and the core declares one for each
// of its own spec sections, so the whole spec is checked once, up front, and a mistake is
// reported as one line that names the place (a JSON pointer into the spec) and the fix,
// before anything is built or allocated.
//
// Supported keywords: type (object, array, string, integer, number, boolean, null; one or
// an array of them), properties, required, additionalProperties (a boolean or a schema),
// default, enum, const, minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, as
// in draft 6 and later), minLength, maxLength (in code points), pattern (ECMAScript,
// unanchored), items (one schema for every element), minItems, maxItems, oneOf, anyOf and
// x-loom-component; description, title and examples are annotations. A schema may also be
// `true` (anything) or `false` (nothing). "integer" accepts only JSON integers (2.0 is a
// number, not an integer); "number" accepts both.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/util/errors.h"

namespace loom::core {

/// Callbacks for the parts of a spec that the schema hands to someone else.
struct SchemaHooks {
  /// Called for a value whose schema has "x-loom-component": "<kind>", in place of every
  /// other check on that value; it must validate (and fill the defaults of) `value` itself,
  /// throwing SpecError with pointers under `pointer`. When empty, such a value must be an
  /// object with a string "impl" and nothing else about it is checked. Under oneOf/anyOf it
  /// is called once per alternative tried, on a copy.
  std::function<void(const std::string& kind, nlohmann::json& value, const std::string& pointer)>
      component;
};

/// Checks that `schema` itself is well formed: known keywords only, each with a value of
/// the right type, patterns that compile, and defaults that satisfy their own schema.
/// Throws loom::Error(kInvalidArgument) "<origin>: invalid schema at <pointer>: <problem>",
/// where <pointer> is that of the bad keyword inside the schema.
/// \param schema  the schema to check
/// \param origin  who declared it, e.g. "plugin 'hello' component (norm, scale_norm)"
void check_schema(const nlohmann::json& schema, const std::string& origin);

/// Validates `value`, which sits at `pointer` in the spec, against `schema`, and fills in
/// place the "default" of every absent property that has one (recursively, so the
/// defaults inside a filled-in or present object are filled too). Nothing is invented for
/// an absent property without a "default". `schema` must have passed check_schema.
/// Throws SpecError for the first violation found.
/// \param schema   the schema (an object, or true/false)
/// \param value    the spec value; defaults are written into it
/// \param pointer  its JSON pointer, "" for the root of the spec
/// \param hooks    handlers for x-loom-component values
void validate(const nlohmann::json& schema, nlohmann::json& value, const std::string& pointer,
              const SchemaHooks& hooks = {});

/// Returns `pointer` extended by the object key `key`, escaped per RFC 6901 ("~" becomes
/// "~0", "/" becomes "~1"): child_pointer("/model", "a/b") is "/model/a~1b".
std::string child_pointer(std::string_view pointer, std::string_view key);

/// Returns `value` as compact JSON for a message (strings keep their double quotes),
/// shortened to about 60 characters with "..." when longer.
std::string compact_value(const nlohmann::json& value);

}  // namespace loom::core
