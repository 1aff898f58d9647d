// Vocab-parallel cross entropy (loom/ops.h): cross_entropy_shard_stats reduces this rank's
// (N, V) shard of the logits to per-row (max, sum of exp, label logit); after an
// all-gather, cross_entropy_combine turns the (P, N, 3) stats of every shard into the
// whole vocabulary's loss, lse and masked mean, those of cross_entropy_fwd.
//   reference: row by row in f64.
//   fast: shard stats OpenMP over rows, AVX2 max / exp / sum; combine OpenMP over rows
//         (the reference's arithmetic: it reads only P * N * 3 floats).
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::CombineShape;

CeShape check_shard_stats(const OpCall* call, bool shapes_only) {
  return op_checks::check_cross_entropy_shard_stats(call, shapes_only, DeviceType::kCpu);
}

CombineShape check_combine(const OpCall* call, bool shapes_only) {
  return op_checks::check_cross_entropy_combine(call, shapes_only, DeviceType::kCpu);
}

// One row of shard stats: (m, s, t) of x[0, v) (the shard's vocabulary columns; its padding
// after them is left out) with the label at column `label` (or none).
void shard_stats_row_ref(const TensorView& X, int64_t base, int64_t v, int64_t label, float* out) {
  double m = -INFINITY, sum = 0.0;
  for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(load(X, base + j)));
  for (int64_t j = 0; j < v; ++j) sum += std::exp(load(X, base + j) - m);
  out[0] = static_cast<float>(m);
  out[1] = static_cast<float>(sum);
  out[2] = label >= 0 ? load(X, base + label) : 0.0f;
}

Status cross_entropy_shard_stats_ref(const OpCall* call) {
  return guard([&] {
    CeShape s = check_shard_stats(call, false);
    ce_check_labels(call, s.n, s.vocab, ops::kCrossEntropyShardStats);
    const int32_t* labels = i32(call->inputs[1]);
    float* stats = f32_mut(call->outputs[0]);
    for (int64_t n = 0; n < s.n; ++n)
      shard_stats_row_ref(call->inputs[0], n * s.v, s.valid, s.column(labels[n]), stats + n * 3);
  });
}

// Row n of the combined result: writes lse[n] and loss[n]. Shards with no columns (m = -inf,
// s = 0) add nothing.
void combine_row(const CombineShape& c, const float* stats, const int32_t* labels, int64_t n,
                 float* loss, float* lse_out) {
  double m = -INFINITY, t = 0.0;
  for (int64_t p = 0; p < c.p; ++p) {
    const float* st = stats + (p * c.n + n) * 3;
    m = std::max(m, static_cast<double>(st[0]));
    t += st[2];
  }
  double sum = 0.0;
  for (int64_t p = 0; p < c.p; ++p) {
    const float* st = stats + (p * c.n + n) * 3;
    if (st[1] != 0.0f) sum += st[1] * std::exp(st[0] - m);
  }
  double lse = m + std::log(sum);
  lse_out[n] = static_cast<float>(lse);
  loss[n] = labels[n] >= 0 && labels[n] < c.vocab ? static_cast<float>(lse - t) : 0.0f;
}

Status cross_entropy_combine_ref(const OpCall* call) {
  return guard([&] {
    CombineShape c = check_combine(call, false);
    double mask_total = ce_check_labels(call, c.n, c.vocab, ops::kCrossEntropyCombine);
    const float* stats = f32(call->inputs[0]);
    const int32_t* labels = i32(call->inputs[1]);
    float *loss = f32_mut(call->outputs[0]), *lse = f32_mut(call->outputs[1]);
    for (int64_t n = 0; n < c.n; ++n) combine_row(c, stats, labels, n, loss, lse);
    ce_write_mean(call, c.n, mask_total);
  });
}

LOOM_CPU_FAST_BEGIN

Status cross_entropy_shard_stats_fast(const OpCall* call) {
  return guard([&] {
    CeShape s = check_shard_stats(call, false);
    ce_check_labels(call, s.n, s.vocab, ops::kCrossEntropyShardStats);
    const TensorView& X = call->inputs[0];
    const int32_t* labels = i32(call->inputs[1]);
    float* stats = f32_mut(call->outputs[0]);
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.v));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        float* x = row.data();
        load_row(X.data, X.dtype, n * s.v, s.v, x);
        int64_t label = s.column(labels[n]);
        float* st = stats + n * 3;
        st[2] = label >= 0 ? x[label] : 0.0f;
        st[0] = s.valid > 0 ? simd::max(x, s.valid) : -INFINITY;
        st[1] = s.valid > 0 ? simd::exp_shift_sum(x, st[0], s.valid) : 0.0f;
      }
    }
  });
}

Status cross_entropy_combine_fast(const OpCall* call) {
  return guard([&] {
    CombineShape c = check_combine(call, false);
    double mask_total = ce_check_labels(call, c.n, c.vocab, ops::kCrossEntropyCombine);
    const float* stats = f32(call->inputs[0]);
    const int32_t* labels = i32(call->inputs[1]);
    float *loss = f32_mut(call->outputs[0]), *lse = f32_mut(call->outputs[1]);
#pragma omp parallel for schedule(static) if (c.n * c.p > 4096)
    for (int64_t n = 0; n < c.n; ++n) combine_row(c, stats, labels, n, loss, lse);
    ce_write_mean(call, c.n, mask_total);
  });
}

LOOM_CPU_FAST_END

// Shard stats: max, exp, sum per logit; combine: a max, exp and sum per stats triple.
LOOM_CPU_HOOKS(cross_entropy_shard_stats, check_shard_stats, 3)
LOOM_CPU_HOOKS(cross_entropy_combine, check_combine, 1)

}  // namespace

void add_cross_entropy_shard_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kCrossEntropyShardStats, cross_entropy_shard_stats);
  // Combine reads only f32 stats: keyed on f32 alone.
  add_kernels(out, ops::kCrossEntropyCombine, kRefName, kRefPriority, cross_entropy_combine_ref,
              cross_entropy_combine_supports, cross_entropy_combine_cost, {DType::kF32});
  add_kernels(out, ops::kCrossEntropyCombine, kFastName, kFastPriority, cross_entropy_combine_fast,
              cross_entropy_combine_fast_supports, cross_entropy_combine_cost, {DType::kF32});
}

}  // namespace loom::kernels::cpu
