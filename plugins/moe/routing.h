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

/// Pad-to-capacity (Megatron-Core's moe_pad_expert_input_to_capacity), after
/// drop_over_capacity: every expert gets exactly min(capacity, N) rows, its kept (token,
/// choice) pairs and then, as fillers, the lowest tokens that did not choose it (prob 0: they
/// run through the expert and add nothing). The routing comes out over all E experts, one
/// slot per (token, expert):
/// \param experts        (N, K) kept choices, -1 for dropped
/// \param probs          (N, K) their probs
/// \param[out] padded    (N, E): e when token t is one of expert e's rows, else -1
/// \param[out] padded_probs (N, E): the kept probs, 0 for fillers and elsewhere
void pad_to_capacity(const std::vector<int32_t>& experts, const std::vector<float>& probs,
                     int64_t k, int64_t num_experts, int64_t capacity,
                     std::vector<int32_t>& padded, std::vector<float>& padded_probs);

/// The gradient of the (N, K) probs from that of the padded (N, E) ones: slot (t, j) takes
/// (t, experts[t, j]); a dropped choice (-1) gets 0.
std::vector<float> unpad_probs_grad(const std::vector<int32_t>& experts,
                                    const std::vector<float>& padded_grad, int64_t k,
                                    int64_t num_experts);

}  // namespace loom::moe
