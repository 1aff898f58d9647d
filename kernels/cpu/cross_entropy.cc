// cross_entropy_fwd / cross_entropy_bwd (loom/ops.h): per-row loss = lse - logit[label]
// without materialising probabilities, the masked mean, and its gradient
// dlogits = dmean * mask / sum(mask) * (softmax - onehot), softmax recomputed from lse.
//   reference: row by row in f64.
//   fast: OpenMP over rows, AVX2 max / exp / sum.
#include <immintrin.h>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

struct CeShape {
  int64_t n, v;
};

CeShape check_ce(const Args& a, int mask_index) {
  const TensorView& logits = a.float_in(0);
  a.rank_in(0, 1, "(N, V)");
  CeShape s{rows_of(logits), last_dim(logits)};
  a.i32_in(1);
  a.numel_in(1, s.n, "(N)");
  if (a.opt_f32_in(mask_index)) a.numel_in(mask_index, s.n, "(N)");
  return s;
}

CeShape check_ce_fwd(const OpCall* call, bool shapes_only) {
  Args a(call, ops::kCrossEntropyFwd, {"logits", "labels", "mask"}, {"loss", "lse", "mean"},
         shapes_only);
  CeShape s = check_ce(a, 2);
  a.f32_out(0);
  a.numel_out(0, s.n, "(N)");
  a.f32_out(1);
  a.numel_out(1, s.n, "(N)");
  a.f32_out(2);
  a.shape_out(2, {1}, "(1)");
  return s;
}

CeShape check_ce_bwd(const OpCall* call, bool shapes_only) {
  Args a(call, ops::kCrossEntropyBwd, {"logits", "labels", "mask", "lse", "dmean"}, {"dlogits"},
         shapes_only);
  CeShape s = check_ce(a, 2);
  a.f32_in(3);
  a.numel_in(3, s.n, "(N)");
  a.f32_in(4);
  a.shape_in(4, {1}, "(1)");
  a.float_out(0);
  a.numel_out(0, s.n * s.v, "logits' shape (N, V)");
  return s;
}

float mask_at(const OpCall* call, int64_t n) {
  const TensorView& m = call->inputs[2];
  return m.data != nullptr ? f32(m)[n] : 1.0f;
}

// Labels outside [0, V) are an error unless masked out; returns sum(mask) in f64.
double check_labels_and_mask(const OpCall* call, const CeShape& s, const char* op) {
  const int32_t* labels = i32(call->inputs[1]);
  double total = 0.0;
  for (int64_t n = 0; n < s.n; ++n) {
    float m = mask_at(call, n);
    total += m;
    if (m != 0.0f && (labels[n] < 0 || labels[n] >= s.v))
      throw Error(Code::kOutOfRange, std::string(op) + ": labels[" + std::to_string(n) +
                                         "] = " + std::to_string(labels[n]) + " is outside [0, " +
                                         std::to_string(s.v) +
                                         ") (the vocabulary); fix the data or set its mask to 0");
  }
  return total;
}

bool label_ok(int32_t label, const CeShape& s) { return label >= 0 && label < s.v; }

// mean = sum mask * loss / sum mask (0 when the mask is all zero).
void write_mean(const OpCall* call, const CeShape& s, double mask_total) {
  const float* loss = f32(call->outputs[0]);
  double acc = 0.0;
  for (int64_t n = 0; n < s.n; ++n) {
    float m = mask_at(call, n);
    if (m != 0.0f) acc += static_cast<double>(m) * loss[n];
  }
  f32_mut(call->outputs[2])[0] = mask_total != 0.0 ? static_cast<float>(acc / mask_total) : 0.0f;
}

Status cross_entropy_fwd_ref(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_fwd(call, false);
    double mask_total = check_labels_and_mask(call, s, ops::kCrossEntropyFwd);
    const TensorView& X = call->inputs[0];
    const int32_t* labels = i32(call->inputs[1]);
    for (int64_t n = 0; n < s.n; ++n) {
      double m = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < s.v; ++j) m = std::max(m, static_cast<double>(load(X, n * s.v + j)));
      for (int64_t j = 0; j < s.v; ++j) sum += std::exp(load(X, n * s.v + j) - m);
      double lse = m + std::log(sum);
      f32_mut(call->outputs[1])[n] = static_cast<float>(lse);
      f32_mut(call->outputs[0])[n] =
          label_ok(labels[n], s) ? static_cast<float>(lse - load(X, n * s.v + labels[n])) : 0.0f;
    }
    write_mean(call, s, mask_total);
  });
}

Status cross_entropy_bwd_ref(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_bwd(call, false);
    double mask_total = check_labels_and_mask(call, s, ops::kCrossEntropyBwd);
    const TensorView &X = call->inputs[0], &dX = call->outputs[0];
    const int32_t* labels = i32(call->inputs[1]);
    const float* lse = f32(call->inputs[3]);
    double dmean = f32(call->inputs[4])[0];
    for (int64_t n = 0; n < s.n; ++n) {
      double w = mask_total != 0.0 ? dmean * mask_at(call, n) / mask_total : 0.0;
      for (int64_t j = 0; j < s.v; ++j) {
        double p = w == 0.0 ? 0.0 : std::exp(load(X, n * s.v + j) - static_cast<double>(lse[n]));
        store(dX, n * s.v + j, static_cast<float>(w * (p - (j == labels[n] ? 1.0 : 0.0))));
      }
    }
  });
}

LOOM_CPU_FAST_BEGIN

Status cross_entropy_fwd_fast(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_fwd(call, false);
    double mask_total = check_labels_and_mask(call, s, ops::kCrossEntropyFwd);
    const TensorView& X = call->inputs[0];
    const int32_t* labels = i32(call->inputs[1]);
    float *loss = f32_mut(call->outputs[0]), *lse_out = f32_mut(call->outputs[1]);
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.v));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        float* x = row.data();
        load_row(X.data, X.dtype, n * s.v, s.v, x);
        float label_logit = label_ok(labels[n], s) ? x[labels[n]] : 0.0f;
        float m = simd::max(x, s.v);
        float lse = m + std::log(simd::exp_shift_sum(x, m, s.v));
        lse_out[n] = lse;
        loss[n] = label_ok(labels[n], s) ? lse - label_logit : 0.0f;
      }
    }
    write_mean(call, s, mask_total);
  });
}

Status cross_entropy_bwd_fast(const OpCall* call) {
  return guard([&] {
    CeShape s = check_ce_bwd(call, false);
    double mask_total = check_labels_and_mask(call, s, ops::kCrossEntropyBwd);
    const TensorView &X = call->inputs[0], &dX = call->outputs[0];
    const int32_t* labels = i32(call->inputs[1]);
    const float* lse = f32(call->inputs[3]);
    double dmean = f32(call->inputs[4])[0];
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.v));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        float* x = row.data();
        float w =
            mask_total != 0.0 ? static_cast<float>(dmean * mask_at(call, n) / mask_total) : 0.0f;
        if (w == 0.0f) {
          std::fill(row.begin(), row.end(), 0.0f);
        } else {
          load_row(X.data, X.dtype, n * s.v, s.v, x);
          simd::exp_shift_sum(x, lse[n], s.v);
          simd::scal(w, x, s.v);
          if (label_ok(labels[n], s)) x[labels[n]] -= w;
        }
        store_row(dX.data, dX.dtype, n * s.v, s.v, x);
      }
    }
  });
}

LOOM_CPU_FAST_END

// Forward: max, exp, sum per logit; backward: exp, scale, store.
LOOM_CPU_HOOKS(cross_entropy_fwd, check_ce_fwd, 4)
LOOM_CPU_HOOKS(cross_entropy_bwd, check_ce_bwd, 4)

}  // namespace

void add_cross_entropy_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kCrossEntropyFwd, cross_entropy_fwd);
  LOOM_CPU_REGISTER(out, ops::kCrossEntropyBwd, cross_entropy_bwd);
}

}  // namespace loom::kernels::cpu
