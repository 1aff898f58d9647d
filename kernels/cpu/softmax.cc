// masked_softmax_fwd / masked_softmax_bwd: P = softmax(scale * S + mask) over the last
// dimension, dS = scale * P * (dP - sum(dP * P)) (loom/ops.h). The reference attention
// core; a fully masked row gives zeros.
//   reference: row by row in f64.
//   fast: OpenMP over rows, AVX2 exp / reductions.
#include <immintrin.h>
#include <loom/cpp/op_checks/softmax.h>

#include <algorithm>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::SoftmaxShape;

SoftmaxShape check_softmax_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_softmax_fwd(call, shapes_only, DeviceType::kCpu);
}
SoftmaxShape check_softmax_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_softmax_bwd(call, shapes_only, DeviceType::kCpu);
}

const int32_t* segment_row(const OpCall* call, const SoftmaxShape& s, int64_t b) {
  const TensorView& seg = call->inputs[1];
  return seg.data != nullptr ? i32(seg) + b * s.t : nullptr;
}

Status masked_softmax_fwd_ref(const OpCall* call) {
  return guard([&] {
    SoftmaxShape s = check_softmax_fwd(call, false);
    const TensorView &S = call->inputs[0], &P = call->outputs[0];
    std::vector<double> v(static_cast<size_t>(s.sk));
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t t = 0; t < s.t; ++t) {
          int64_t row = ((b * s.h + h) * s.t + t) * s.sk;
          const int32_t* seg = segment_row(call, s, b);
          double m = -INFINITY;
          for (int64_t k = 0; k < s.sk; ++k) {
            v[k] = attention_masked(s.attrs.causal, t, k, s.t, s.sk, seg, seg)
                       ? -INFINITY
                       : static_cast<double>(s.attrs.scale) * load(S, row + k);
            m = std::max(m, v[k]);
          }
          double sum = 0.0;
          for (int64_t k = 0; k < s.sk; ++k) {
            v[k] = m == -INFINITY ? 0.0 : std::exp(v[k] - m);
            sum += v[k];
          }
          for (int64_t k = 0; k < s.sk; ++k)
            // A fully masked row is zeros; a NaN score makes its whole row NaN (sum is at
            // least 1 otherwise: the max contributes exp(0)).
            store(P, row + k, m == -INFINITY ? 0.0f : static_cast<float>(v[k] / sum));
        }
  });
}

Status masked_softmax_bwd_ref(const OpCall* call) {
  return guard([&] {
    SoftmaxShape s = check_softmax_bwd(call, false);
    const TensorView &dP = call->inputs[0], &P = call->inputs[1], &dS = call->outputs[0];
    for (int64_t r = 0; r < s.b * s.h * s.t; ++r) {
      double dot = 0.0;
      for (int64_t k = 0; k < s.sk; ++k)
        dot += static_cast<double>(load(dP, r * s.sk + k)) * load(P, r * s.sk + k);
      for (int64_t k = 0; k < s.sk; ++k)
        store(dS, r * s.sk + k,
              static_cast<float>(s.attrs.scale * load(P, r * s.sk + k) *
                                 (load(dP, r * s.sk + k) - dot)));
    }
  });
}

LOOM_CPU_FAST_BEGIN

Status masked_softmax_fwd_fast(const OpCall* call) {
  return guard([&] {
    SoftmaxShape s = check_softmax_fwd(call, false);
    const TensorView &S = call->inputs[0], &P = call->outputs[0];
    int64_t rows = s.b * s.h * s.t;
#pragma omp parallel
    {
      std::vector<float> buf(static_cast<size_t>(s.sk));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        int64_t b = r / (s.h * s.t), t = r % s.t;
        const int32_t* seg = segment_row(call, s, b);
        float* v = buf.data();
        load_row(S.data, S.dtype, r * s.sk, s.sk, v);
        simd::scal(s.attrs.scale, v, s.sk);
        if (s.attrs.causal || seg != nullptr)
          for (int64_t k = 0; k < s.sk; ++k)
            if (attention_masked(s.attrs.causal, t, k, s.t, s.sk, seg, seg)) v[k] = -INFINITY;
        float m = simd::max(v, s.sk);
        if (m == -INFINITY) {
          std::fill(buf.begin(), buf.end(), 0.0f);
        } else {
          float sum = simd::exp_shift_sum(v, m, s.sk);
          simd::scal(1.0f / sum, v, s.sk);
        }
        store_row(P.data, P.dtype, r * s.sk, s.sk, v);
      }
    }
  });
}

Status masked_softmax_bwd_fast(const OpCall* call) {
  return guard([&] {
    SoftmaxShape s = check_softmax_bwd(call, false);
    const TensorView &dP = call->inputs[0], &P = call->inputs[1], &dS = call->outputs[0];
    int64_t rows = s.b * s.h * s.t;
#pragma omp parallel
    {
      std::vector<float> dp(static_cast<size_t>(s.sk)), p(static_cast<size_t>(s.sk));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        load_row(dP.data, dP.dtype, r * s.sk, s.sk, dp.data());
        load_row(P.data, P.dtype, r * s.sk, s.sk, p.data());
        float dot = simd::dot(dp.data(), p.data(), s.sk);
        __m256 vd = _mm256_set1_ps(dot), vs = _mm256_set1_ps(s.attrs.scale);
        int64_t k = 0;
        for (; k + 8 <= s.sk; k += 8) {
          __m256 pv = _mm256_mul_ps(vs, _mm256_loadu_ps(&p[k]));
          _mm256_storeu_ps(&dp[k], _mm256_mul_ps(pv, _mm256_sub_ps(_mm256_loadu_ps(&dp[k]), vd)));
        }
        for (; k < s.sk; ++k) dp[k] = s.attrs.scale * p[k] * (dp[k] - dot);
        store_row(dS.data, dS.dtype, r * s.sk, s.sk, dp.data());
      }
    }
  });
}

LOOM_CPU_FAST_END

LOOM_CPU_HOOKS(masked_softmax_fwd, check_softmax_fwd, 5)
LOOM_CPU_HOOKS(masked_softmax_bwd, check_softmax_bwd, 4)

}  // namespace

void add_softmax_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kMaskedSoftmaxFwd, masked_softmax_fwd);
  LOOM_CPU_REGISTER(out, ops::kMaskedSoftmaxBwd, masked_softmax_bwd);
}

}  // namespace loom::kernels::cpu
