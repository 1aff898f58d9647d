// rope_fwd / rope_bwd: rotary position embedding, GPT-NeoX / Llama layout (channel i pairs
// with i + rotary_dim / 2), angle = position * inv_freq[i] (loom/ops.h). Backward rotates
// by the opposite angle (a rotation's gradient is its transpose).
//   reference: element pairs, angle in f64.
//   fast: OpenMP over (b, t); cos / sin computed once per position and reused by every
//         head; AVX2 rotation.
#include "kernels/cpu/rope.h"

#include <immintrin.h>
#include <loom/cpp/op_checks/rope.h>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::RopeShape;

RopeShape check_rope_fwd(const OpCall* c, bool s) {
  return op_checks::check_rope_fwd(c, s, DeviceType::kCpu);
}
RopeShape check_rope_bwd(const OpCall* c, bool s) {
  return op_checks::check_rope_bwd(c, s, DeviceType::kCpu);
}

double position(const OpCall* call, const RopeShape& s, int64_t b, int64_t t) {
  const TensorView& pos = call->inputs[1];
  return pos.data != nullptr ? static_cast<double>(i32(pos)[b * s.t + t]) : static_cast<double>(t);
}

}  // namespace

void rope_ref_pair(double pos, float inv_freq, double sign, double x1, double x2, float* y1,
                   float* y2) {
  const double angle = pos * static_cast<double>(inv_freq);
  const double c = std::cos(angle), sn = sign * std::sin(angle);
  *y1 = static_cast<float>(x1 * c - x2 * sn);
  *y2 = static_cast<float>(x2 * c + x1 * sn);
}

namespace {

// sign = +1 rotates by +angle (forward), -1 by -angle (backward).
void rope_ref_impl(const OpCall* call, const RopeShape& s, double sign) {
  const TensorView &X = call->inputs[0], &Y = call->outputs[0];
  const float* inv_freq = f32(call->inputs[2]);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t t = 0; t < s.t; ++t)
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t xb = s.x.at(b, t, h), yb = s.y.at(b, t, h);  // the rows (maybe strided)
        for (int64_t i = 0; i < s.half; ++i) {
          float y1, y2;
          rope_ref_pair(position(call, s, b, t), inv_freq[i], sign, load(X, xb + i),
                        load(X, xb + i + s.half), &y1, &y2);
          store(Y, yb + i, y1);
          store(Y, yb + i + s.half, y2);
        }
        for (int64_t i = 2 * s.half; i < s.d; ++i) store(Y, yb + i, load(X, xb + i));
      }
}

Status rope_fwd_ref(const OpCall* call) {
  return guard([&] { rope_ref_impl(call, check_rope_fwd(call, false), 1.0); });
}
Status rope_bwd_ref(const OpCall* call) {
  return guard([&] { rope_ref_impl(call, check_rope_bwd(call, false), -1.0); });
}

}  // namespace

void rope_cos_sin_fast(double pos, const float* inv_freq, int64_t half, double sign, float* cs,
                       float* sn) {
  for (int64_t i = 0; i < half; ++i) {
    const double angle = pos * static_cast<double>(inv_freq[i]);
    cs[i] = static_cast<float>(std::cos(angle));
    sn[i] = static_cast<float>(sign * std::sin(angle));
  }
}

LOOM_CPU_FAST_BEGIN

void rope_rotate_fast(float* x, const float* cs, const float* sn, int64_t half) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + i + half);
    __m256 c = _mm256_loadu_ps(cs + i), si = _mm256_loadu_ps(sn + i);
    _mm256_storeu_ps(x + i, _mm256_fnmadd_ps(x2, si, _mm256_mul_ps(x1, c)));
    _mm256_storeu_ps(x + i + half, _mm256_fmadd_ps(x1, si, _mm256_mul_ps(x2, c)));
  }
  for (; i < half; ++i) {
    float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cs[i] - x2 * sn[i];
    x[i + half] = x2 * cs[i] + x1 * sn[i];
  }
}

namespace {

void rope_fast_impl(const OpCall* call, const RopeShape& s, double sign) {
  const TensorView &X = call->inputs[0], &Y = call->outputs[0];
  const float* inv_freq = f32(call->inputs[2]);
#pragma omp parallel
  {
    std::vector<float> cs(static_cast<size_t>(s.half)), sn(static_cast<size_t>(s.half));
    std::vector<float> row(static_cast<size_t>(s.d));
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < s.b * s.t; ++bt) {
      rope_cos_sin_fast(position(call, s, bt / s.t, bt % s.t), inv_freq, s.half, sign, cs.data(),
                        sn.data());
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t b = bt / s.t, t = bt % s.t;
        float* x = row.data();
        load_row(X.data, X.dtype, s.x.at(b, t, h), s.d, x);
        rope_rotate_fast(x, cs.data(), sn.data(), s.half);
        store_row(Y.data, Y.dtype, s.y.at(b, t, h), s.d, x);
      }
    }
  }
}

Status rope_fwd_fast(const OpCall* call) {
  return guard([&] { rope_fast_impl(call, check_rope_fwd(call, false), 1.0); });
}
Status rope_bwd_fast(const OpCall* call) {
  return guard([&] { rope_fast_impl(call, check_rope_bwd(call, false), -1.0); });
}

LOOM_CPU_FAST_END

LOOM_CPU_HOOKS(rope_fwd, check_rope_fwd, 3)
LOOM_CPU_HOOKS(rope_bwd, check_rope_bwd, 3)

}  // namespace

void add_rope_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kRopeFwd, rope_fwd);
  LOOM_CPU_REGISTER(out, ops::kRopeBwd, rope_bwd);
}

}  // namespace loom::kernels::cpu
