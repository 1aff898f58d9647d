// The GEMM that both emulation tests check (emu_main.cc: the split form of 3xTF32;
// mma_main.cc: the split in registers): a problem, its random operands, the long double
// oracle with the scale of its error bound, and a plain f32 GEMM and one TF32 GEMM to set
// beside them. Y = alpha op(A) op(B) + beta Y (+ bias over Y's columns), gemm's semantics.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/gemm/tf32x3_plan.h"

namespace loom::kernels::cuda::gemm {

// x rounded to TF32 (11 significant bits), ties to even, in double: written here, apart from
// the kernels' bit arithmetic, for zero and normal x (what the low halves of the split are
// for finite f32 above 2^-113).
inline double rne_tf32(double x) {
  if (x == 0.0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| = m 2^e, m in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(x, 11 - e)), e - 11);
}

// The tensor cores' view of an f32 operand: truncated (the low 13 mantissa bits ignored) or
// rounded to nearest even; one TF32 GEMM's operands (direct) are rounded so.
enum class Tf32Mode { kTruncate, kNearest };
inline float to_tf32(float x, Tf32Mode mode) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  if (mode == Tf32Mode::kNearest) u += 0xfffu + ((u >> 13) & 1u);
  u &= 0xffffe000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

struct GemmCase {
  int64_t batch, m, n, k;
  bool ta, tb, shared_b;  // A stored (K, M); B stored (N, K); one B for every batch matrix
  float alpha, beta;
  bool bias;
};

inline std::string describe(const GemmCase& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "batch %lld%s M %lld N %lld K %lld ta %d tb %d alpha %g beta %g%s",
                static_cast<long long>(c.batch), c.shared_b ? " shared B" : "",
                static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.k), c.ta, c.tb, c.alpha, c.beta, c.bias ? " bias" : "");
  return buf;
}

// The case in the 3xTF32 driver's terms, in `form` (and `segments` for the split form).
inline Tf32x3Shape shape_of(const GemmCase& c, Tf32x3Form form, int segments = 0) {
  Tf32x3Shape s;
  s.batch = c.batch;
  s.m = c.m;
  s.n = c.n;
  s.k = c.k;
  s.trans_a = c.ta;
  s.trans_b = c.tb;
  s.shared_b = c.shared_b;
  s.form = form;
  s.segments = segments;
  return s;
}

// The operands; A and B with `guard` NaN floats before and after them (a kernel that reads
// past them shows). Y's start is NaN when beta is 0: a kernel must not read it then.
struct Problem {
  std::vector<float> a, b, y0, bias;
  size_t guard = 0;
  const float* A() const { return a.data() + guard; }
  const float* B() const { return b.data() + guard; }
};

inline Problem make(const GemmCase& c, std::mt19937& rng, size_t guard = 0) {
  std::normal_distribution<float> nd;
  Problem p;
  p.guard = guard;
  p.a.assign(static_cast<size_t>(c.batch * c.m * c.k) + 2 * guard, NAN);
  p.b.assign(static_cast<size_t>((c.shared_b ? 1 : c.batch) * c.k * c.n) + 2 * guard, NAN);
  p.y0.resize(static_cast<size_t>(c.batch * c.m * c.n));
  p.bias.resize(static_cast<size_t>(c.n));
  // Magnitudes spread over a few binades, as activations and gradients are.
  for (size_t i = guard; i + guard < p.a.size(); ++i)
    p.a[i] = nd(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 7) - 3));
  for (size_t i = guard; i + guard < p.b.size(); ++i) p.b[i] = nd(rng) * 0.02f;
  for (float& v : p.y0) v = c.beta == 0.0f ? NAN : nd(rng);
  for (float& v : p.bias) v = nd(rng);
  return p;
}

inline float a_at(const GemmCase& c, const Problem& p, int64_t b, int64_t i, int64_t t) {
  return p.A()[b * c.m * c.k + (c.ta ? t * c.m + i : i * c.k + t)];
}
inline float b_at(const GemmCase& c, const Problem& p, int64_t b, int64_t t, int64_t j) {
  const int64_t base = c.shared_b ? 0 : b * c.k * c.n;
  return p.B()[base + (c.tb ? j * c.k + t : t * c.n + j)];
}

// The long double oracle, and sum |alpha a b| + |beta y| + |bias| (the error bound's scale).
inline void oracle(const GemmCase& c, const Problem& p, std::vector<long double>* y,
                   std::vector<double>* scale) {
  y->assign(p.y0.size(), 0.0L);
  scale->assign(p.y0.size(), 0.0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        long double acc = 0.0L;
        double mag = 0.0;
        for (int64_t t = 0; t < c.k; ++t) {
          const long double prod =
              static_cast<long double>(a_at(c, p, b, i, t)) * b_at(c, p, b, t, j);
          acc += prod;
          mag += std::fabs(static_cast<double>(prod));
        }
        const size_t at = static_cast<size_t>((b * c.m + i) * c.n + j);
        const double y0 = c.beta != 0.0f ? p.y0[at] : 0.0;
        const float bias = c.bias ? p.bias[static_cast<size_t>(j)] : 0.0f;
        (*y)[at] = c.alpha * acc + static_cast<long double>(c.beta) * y0 + bias;
        (*scale)[at] = std::fabs(c.alpha) * mag + std::fabs(c.beta * y0) + std::fabs(bias);
      }
}

// One GEMM straight on the operands, each operand through `round` and the sum in f32 (fma):
// a plain f32 GEMM (identity) or one TF32 GEMM.
template <class Round>
std::vector<float> direct(const GemmCase& c, const Problem& p, Round round) {
  std::vector<float> y(p.y0.size());
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        float acc = 0.0f;
        for (int64_t t = 0; t < c.k; ++t)
          acc = std::fmaf(round(a_at(c, p, b, i, t)), round(b_at(c, p, b, t, j)), acc);
        const size_t at = static_cast<size_t>((b * c.m + i) * c.n + j);
        y[at] = c.alpha * acc + (c.beta != 0.0f ? c.beta * p.y0[at] : 0.0f) +
                (c.bias ? p.bias[static_cast<size_t>(j)] : 0.0f);
      }
  return y;
}

// max |y - oracle| / scale over the want.size() elements at y (NaN counts as infinite).
inline double rel_error(const float* y, const std::vector<long double>& want,
                        const std::vector<double>& scale) {
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(std::fabs(static_cast<long double>(y[i]) - want[i]));
    worst = std::max(worst, std::isnan(y[i]) ? INFINITY : scale[i] > 0 ? e / scale[i] : e);
  }
  return worst;
}
inline double rel_error(const std::vector<float>& y, const std::vector<long double>& want,
                        const std::vector<double>& scale) {
  return rel_error(y.data(), want, scale);
}

// What a 3xTF32 result is set beside: the errors of the plain f32 GEMM (the level it must
// reach) and of one TF32 GEMM (far above it: the check must tell them apart).
struct Baselines {
  double f32, one_tf32;
};
inline Baselines baselines(const GemmCase& c, const Problem& p,
                           const std::vector<long double>& want, const std::vector<double>& scale) {
  return {
      rel_error(direct(c, p, [](float x) { return x; }), want, scale),
      rel_error(direct(c, p, [](float x) { return to_tf32(x, Tf32Mode::kNearest); }), want, scale)};
}

}  // namespace loom::kernels::cuda::gemm
