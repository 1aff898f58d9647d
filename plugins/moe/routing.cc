#include "plugins/moe/routing.h"

#include <algorithm>

namespace loom::moe {

RowPlan plan_rows(const std::vector<int32_t>& experts, int64_t k, int32_t first, int32_t count) {
  RowPlan p;
  const int64_t n = static_cast<int64_t>(experts.size()) / k;
  p.counts.assign(static_cast<size_t>(count), 0);
  for (int32_t e : experts)
    if (e >= first && e < first + count) ++p.counts[static_cast<size_t>(e - first)];
  std::vector<int64_t> next(static_cast<size_t>(count), 0);  // first row of each expert
  for (int32_t i = 1; i < count; ++i) next[i] = next[i - 1] + p.counts[i - 1];
  const int64_t m = count > 0 ? next[count - 1] + p.counts[count - 1] : 0;
  p.src.assign(static_cast<size_t>(m), 0);
  p.row_slots.assign(static_cast<size_t>(m), -1);
  p.slot_rows.assign(experts.size(), -1);
  for (int64_t t = 0; t < n; ++t)  // tokens ascending: each expert's rows come in order
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = experts[t * k + j];
      if (e < first || e >= first + count) continue;
      const int64_t row = next[e - first]++;
      p.src[row] = static_cast<int32_t>(t);
      p.row_slots[row] = static_cast<int32_t>(t * k + j);
      p.slot_rows[t * k + j] = static_cast<int32_t>(row);
    }
  return p;
}

void drop_over_capacity(std::vector<int32_t>& experts, std::vector<float>& probs,
                        int64_t num_experts, int64_t capacity, bool by_probs) {
  std::vector<std::vector<int64_t>> chose(static_cast<size_t>(num_experts));
  for (int64_t s = 0; s < static_cast<int64_t>(experts.size()); ++s)
    if (experts[s] >= 0) chose[experts[s]].push_back(s);  // slots, tokens ascending
  for (auto& slots : chose) {
    if (static_cast<int64_t>(slots.size()) <= capacity) continue;
    if (by_probs)
      std::stable_sort(slots.begin(), slots.end(),
                       [&](int64_t a, int64_t b) { return probs[a] > probs[b]; });
    for (size_t i = static_cast<size_t>(capacity); i < slots.size(); ++i) {
      experts[slots[i]] = -1;
      probs[slots[i]] = 0.0f;
    }
  }
}

void pad_to_capacity(const std::vector<int32_t>& experts, const std::vector<float>& probs,
                     int64_t k, int64_t num_experts, int64_t capacity,
                     std::vector<int32_t>& padded, std::vector<float>& padded_probs) {
  const int64_t n = static_cast<int64_t>(experts.size()) / k, e = num_experts;
  padded.assign(static_cast<size_t>(n * e), -1);
  padded_probs.assign(static_cast<size_t>(n * e), 0.0f);
  std::vector<int64_t> rows(static_cast<size_t>(e), 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t x = experts[t * k + j];
      if (x < 0) continue;
      padded[t * e + x] = x;
      padded_probs[t * e + x] = probs[t * k + j];
      ++rows[x];
    }
  const int64_t want = std::min(capacity, n);
  for (int64_t x = 0; x < e; ++x)
    for (int64_t t = 0; t < n && rows[x] < want; ++t)
      if (padded[t * e + x] < 0) {
        padded[t * e + x] = static_cast<int32_t>(x);
        ++rows[x];
      }
}

std::vector<float> unpad_probs_grad(const std::vector<int32_t>& experts,
                                    const std::vector<float>& padded_grad, int64_t k,
                                    int64_t num_experts) {
  std::vector<float> out(experts.size(), 0.0f);
  for (size_t s = 0; s < experts.size(); ++s)
    if (experts[s] >= 0)
      out[s] = padded_grad[(s / static_cast<size_t>(k)) * static_cast<size_t>(num_experts) +
                           static_cast<size_t>(experts[s])];
  return out;
}

}  // namespace loom::moe
