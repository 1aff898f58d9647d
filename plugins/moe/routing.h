// Host-side routing plans: which rows the experts at hand get, in which order, and how
// each token finds its rows again (the index arrays of moe_permute / moe_unpermute).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::moe {

/// The rows of a set of experts [first, first + count) for tokens choosing K experts each.
/// Rows are expert-major, tokens ascending within an expert (Megatron-Core's permute).
struct RowPlan {
  std::vector<int32_t> src;        ///< (M) the token of each row
  std::vector<int32_t> slot_rows;  ///< (N, K) the row of each (token, choice), -1 elsewhere
  std::vector<int32_t> row_slots;  ///< (M) the slot t * K + k of each row
  std::vector<int64_t> counts;     ///< (count) rows per expert
};

/// \param experts  (N, K) global expert ids, -1 for a dropped choice
RowPlan plan_rows(const std::vector<int32_t>& experts, int64_t k, int32_t first, int32_t count);

/// Capacity dropping (Megatron-Core's apply_router_token_dropping): each expert keeps at
/// most `capacity` of the (token, choice) pairs that chose it, the highest probs (policy
/// "probs", ties to the lower token) or the lowest tokens ("position"); dropped pairs get
/// expert -1 and prob 0 (the others are not renormalised).
void drop_over_capacity(std::vector<int32_t>& experts, std::vector<float>& probs,
                        int64_t num_experts, int64_t capacity, bool by_probs);

}  // namespace loom::moe
