// Suggestions for misspelt names, and name lists, for user-facing error messages.
//
// Every message about an unknown key, an unknown component or a value outside an enum
// names the closest allowed name, so that a typo costs one glance, not a trip to the docs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom::core {

/// Returns the edit distance between `a` and `b` where an insertion, a deletion, a
/// substitution and a swap of two adjacent characters each cost 1 (Damerau-Levenshtein,
/// optimal string alignment variant), on bytes.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// Returns " (did you mean 'x'?)" for the candidate `x` closest to `word`, or "" when none
/// is close. A candidate is close when its distance is at most max(2, word.size() / 3) and
/// smaller than the length of the longer of the two (so "ab" never suggests "xy"). Ties
/// go to the earlier candidate; a candidate equal to `word` is skipped.
/// \param word        what the user wrote
/// \param candidates  the names that are allowed there
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

/// Returns the names quoted and joined for a sentence: "" for none, "'a'" for one,
/// "'a' or 'b'" for two and "'a', 'b' or 'c'" for more.
std::string join_names(const std::vector<std::string>& names);

}  // namespace loom::core
