// cross_entropy_fwd / cross_entropy_bwd (loom/ops.h): per-row loss = lse - logit[label]
// without materialising probabilities, the masked mean, and its gradient
// dlogits = dmean * mask / sum(mask) * (softmax - onehot), softmax recomputed from lse. The
// backward also serves one shard of vocab-parallel logits (CrossEntropyShardAttrs; lse then
// comes from cross_entropy_combine, cross_entropy_shard.cc). And masked_sum, the (sum,
// count) a model reports its loss with. Padding columns (CeShape::valid, loom/ops/loss.h) are
// left out of the max and the sum, and get gradient 0. cross_entropy_fwd_bwd does both in one
// pass over each row, with the forward's lse (stored f32) feeding the gradient as the
// backward would read it back, so its results are the two ops' bit for bit; in place (dlogits
// = logits) each row is read whole before it is written.
//   reference: row by row in f64.
//   fast: OpenMP over rows, AVX2 max / exp / sum.
#include "kernels/cpu/cross_entropy.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {

double ce_check_labels(const OpCall* call, int64_t n, int64_t vocab, const char* op) {
  const int32_t* labels = i32(call->inputs[1]);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float m = ce_mask_at(call, i);
    total += m;
    if (m != 0.0f && (labels[i] < 0 || labels[i] >= vocab))
      throw Error(Code::kOutOfRange,
                  op_checks::label_out_of_range_message(op, i, labels[i], vocab));
  }
  return total;
}

void ce_write_mean(const OpCall* call, int64_t n, double mask_total) {
  const float* loss = f32(call->outputs[0]);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float m = ce_mask_at(call, i);
    if (m != 0.0f) acc += static_cast<double>(m) * loss[i];
  }
  f32_mut(call->outputs[2])[0] = mask_total != 0.0 ? static_cast<float>(acc / mask_total) : 0.0f;
}

namespace {

CeShape check_ce_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_cross_entropy_fwd(call, shapes_only, DeviceType::kCpu);
}

CeShape check_ce_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_cross_entropy_bwd(call, shapes_only, DeviceType::kCpu);
}

CeShape check_ce_fwd_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_cross_entropy_fwd_bwd(call, shapes_only, DeviceType::kCpu);
}

// Row n of the reference forward: lse and loss (in f64, stored f32), from the logits X.
void ce_row_ref(const TensorView& X, const CeShape& s, int64_t n, int32_t label_id, float* loss,
                float* lse_out) {
  double m = -INFINITY, sum = 0.0;
  for (int64_t j = 0; j < s.valid; ++j) m = std::max(m, static_cast<double>(load(X, n * s.v + j)));
  for (int64_t j = 0; j < s.valid; ++j) sum += std::exp(load(X, n * s.v + j) - m);
  double lse = m + std::log(sum);
  int64_t label = s.column(label_id);
  *lse_out = static_cast<float>(lse);
  *loss = label >= 0 ? static_cast<float>(lse - load(X, n * s.v + label)) : 0.0f;
}

// Row n of the reference backward: dX[n, j] = w (exp(X[n, j] - lse) - onehot), each element
// read before it is written (in place is safe).
void ce_grad_row_ref(const TensorView& X, const TensorView& dX, const CeShape& s, int64_t n,
                     int32_t label_id, double w, float lse) {
  int64_t label = s.column(label_id);
  for (int64_t j = 0; j < s.v; ++j) {
    double p =
        w == 0.0 || j >= s.valid ? 0.0 : std::exp(load(X, n * s.v + j) - static_cast<double>(lse));
    store(dX, n * s.v + j, static_cast<float>(w * (p - (j == label ? 1.0 : 0.0))));
  }
}

// The gradient's weight of row n: dmean * mask[n] / sum(mask) (0 when the mask sums to 0).
double ce_weight(const OpCall* call, double dmean, int64_t n, double mask_total) {
  return mask_total != 0.0 ? dmean * ce_mask_at(call, n) / mask_total : 0.0;
}

Status cross_entropy_fwd_ref(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_fwd(call, false);
    double mask_total = ce_check_labels(call, s.n, s.vocab, ops::kCrossEntropyFwd);
    const int32_t* labels = i32(call->inputs[1]);
    for (int64_t n = 0; n < s.n; ++n)
      ce_row_ref(call->inputs[0], s, n, labels[n], &f32_mut(call->outputs[0])[n],
                 &f32_mut(call->outputs[1])[n]);
    ce_write_mean(call, s.n, mask_total);
  });
}

Status cross_entropy_bwd_ref(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_bwd(call, false);
    double mask_total = ce_check_labels(call, s.n, s.vocab, ops::kCrossEntropyBwd);
    const int32_t* labels = i32(call->inputs[1]);
    const float* lse = f32(call->inputs[3]);
    double dmean = f32(call->inputs[4])[0];
    for (int64_t n = 0; n < s.n; ++n)
      ce_grad_row_ref(call->inputs[0], call->outputs[0], s, n, labels[n],
                      ce_weight(call, dmean, n, mask_total), lse[n]);
  });
}

Status cross_entropy_fwd_bwd_ref(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_fwd_bwd(call, false);
    double mask_total = ce_check_labels(call, s.n, s.vocab, ops::kCrossEntropyFwdBwd);
    const int32_t* labels = i32(call->inputs[1]);
    float *loss = f32_mut(call->outputs[0]), *lse = f32_mut(call->outputs[1]);
    double dmean = f32(call->inputs[3])[0];
    for (int64_t n = 0; n < s.n; ++n) {
      ce_row_ref(call->inputs[0], s, n, labels[n], &loss[n], &lse[n]);
      ce_grad_row_ref(call->inputs[0], call->outputs[3], s, n, labels[n],
                      ce_weight(call, dmean, n, mask_total), lse[n]);
    }
    ce_write_mean(call, s.n, mask_total);
  });
}

LOOM_CPU_FAST_BEGIN

// Row n of the fast forward, through the scratch row x (V floats; left holding exp(x - max)).
void ce_row_fast(const TensorView& X, const CeShape& s, int64_t n, int32_t label_id, float* x,
                 float* loss, float* lse_out) {
  load_row(X.data, X.dtype, n * s.v, s.v, x);
  int64_t label = s.column(label_id);
  float label_logit = label >= 0 ? x[label] : 0.0f;
  float m = simd::max(x, s.valid);
  float lse = m + std::log(simd::exp_shift_sum(x, m, s.valid));
  *lse_out = lse;
  *loss = label >= 0 ? lse - label_logit : 0.0f;
}

// Row n of the fast backward with weight w, through the scratch row x (V floats).
void ce_grad_row_fast(const TensorView& X, const TensorView& dX, const CeShape& s, int64_t n,
                      int32_t label_id, float w, float lse, float* x) {
  if (w == 0.0f) {
    std::fill(x, x + s.v, 0.0f);
  } else {
    load_row(X.data, X.dtype, n * s.v, s.v, x);
    simd::exp_shift_sum(x, lse, s.valid);
    simd::scal(w, x, s.valid);
    std::fill(x + s.valid, x + s.v, 0.0f);  // padding
    int64_t label = s.column(label_id);
    if (label >= 0) x[label] -= w;
  }
  store_row(dX.data, dX.dtype, n * s.v, s.v, x);
}

Status cross_entropy_fwd_fast(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_fwd(call, false);
    double mask_total = ce_check_labels(call, s.n, s.vocab, ops::kCrossEntropyFwd);
    const TensorView& X = call->inputs[0];
    const int32_t* labels = i32(call->inputs[1]);
    float *loss = f32_mut(call->outputs[0]), *lse_out = f32_mut(call->outputs[1]);
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.v));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n)
        ce_row_fast(X, s, n, labels[n], row.data(), &loss[n], &lse_out[n]);
    }
    ce_write_mean(call, s.n, mask_total);
  });
}

Status cross_entropy_bwd_fast(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_bwd(call, false);
    double mask_total = ce_check_labels(call, s.n, s.vocab, ops::kCrossEntropyBwd);
    const TensorView &X = call->inputs[0], &dX = call->outputs[0];
    const int32_t* labels = i32(call->inputs[1]);
    const float* lse = f32(call->inputs[3]);
    double dmean = f32(call->inputs[4])[0];
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.v));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n)
        ce_grad_row_fast(X, dX, s, n, labels[n],
                         static_cast<float>(ce_weight(call, dmean, n, mask_total)), lse[n],
                         row.data());
    }
  });
}

Status cross_entropy_fwd_bwd_fast(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_fwd_bwd(call, false);
    double mask_total = ce_check_labels(call, s.n, s.vocab, ops::kCrossEntropyFwdBwd);
    const TensorView &X = call->inputs[0], &dX = call->outputs[3];
    const int32_t* labels = i32(call->inputs[1]);
    float *loss = f32_mut(call->outputs[0]), *lse = f32_mut(call->outputs[1]);
    double dmean = f32(call->inputs[3])[0];
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.v));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        // The forward leaves exp(x - max) in the row: the gradient reads the logits again
        // (from the cache; in place, row n is written only after that).
        ce_row_fast(X, s, n, labels[n], row.data(), &loss[n], &lse[n]);
        ce_grad_row_fast(X, dX, s, n, labels[n],
                         static_cast<float>(ce_weight(call, dmean, n, mask_total)), lse[n],
                         row.data());
      }
    }
    ce_write_mean(call, s.n, mask_total);
  });
}

LOOM_CPU_FAST_END

// ---- masked_sum: [sum mask x, sum mask] in f64 ------------------------------------------

int64_t check_masked_sum(const OpCall* call, bool shapes_only) {
  return op_checks::check_masked_sum(call, shapes_only, DeviceType::kCpu);
}

Status masked_sum_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_masked_sum(call, false);
    const float* x = f32(call->inputs[0]);
    const float* mask = call->inputs[1].data != nullptr ? f32(call->inputs[1]) : nullptr;
    double sum = 0.0, count = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      double m = mask != nullptr ? mask[i] : 1.0;
      sum += m * x[i];
      count += m;
    }
    f32_mut(call->outputs[0])[0] = static_cast<float>(sum);
    f32_mut(call->outputs[0])[1] = static_cast<float>(count);
  });
}

// Forward: max, exp, sum per logit; backward: exp, scale, store.
LOOM_CPU_HOOKS(cross_entropy_fwd, check_ce_fwd, 4)
LOOM_CPU_HOOKS(cross_entropy_bwd, check_ce_bwd, 4)
LOOM_CPU_HOOKS(cross_entropy_fwd_bwd, check_ce_fwd_bwd, 8)
LOOM_CPU_HOOKS(masked_sum, check_masked_sum, 2)

}  // namespace

void add_cross_entropy_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kCrossEntropyFwd, cross_entropy_fwd);
  LOOM_CPU_REGISTER(out, ops::kCrossEntropyBwd, cross_entropy_bwd);
  LOOM_CPU_REGISTER(out, ops::kCrossEntropyFwdBwd, cross_entropy_fwd_bwd);
  // A reduction of N floats once per micro-batch: the fast kernel is the reference itself.
  add_kernels(out, ops::kMaskedSum, kRefName, kRefPriority, masked_sum_ref, masked_sum_supports,
              masked_sum_cost, {DType::kF32});
  add_kernels(out, ops::kMaskedSum, kFastName, kFastPriority, masked_sum_ref,
              masked_sum_fast_supports, masked_sum_cost, {DType::kF32});
}

}  // namespace loom::kernels::cpu
