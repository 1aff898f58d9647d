// rmsnorm_gated / rmsnorm_gated_bwd: Mamba-2's gated RMSNorm, the gate applied before the
// norm, over groups of group_size channels (loom/ops/mamba.h).
//   g = y * silu(z);  out = g * rstd * weight,  rstd = 1 / sqrt(mean(g^2 over the group) + eps)
//   dg = rstd * (dout * weight - ghat * mean(dout * weight * ghat)),  ghat = g * rstd
//   dy = dg * silu(z);  dz = dg * y * silu'(z);  dweight += dout * ghat
//   reference: row by row in f64.
//   fast: OpenMP over rows, f32 rows, per-thread dweight partials.
#include <loom/cpp/op_checks/mamba.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::RmsNormGatedShape;

RmsNormGatedShape check_norm(const OpCall* call, bool shapes_only) {
  return op_checks::check_rmsnorm_gated(call, shapes_only, DeviceType::kCpu);
}
RmsNormGatedShape check_norm_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_rmsnorm_gated_bwd(call, shapes_only, DeviceType::kCpu);
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

Status rmsnorm_gated_ref(const OpCall* call) {
  return guard([&] {
    RmsNormGatedShape s = check_norm(call, false);
    const TensorView &Y = call->inputs[0], &Z = call->inputs[1], &W = call->inputs[2];
    const TensorView& out = call->outputs[0];
    float* rstd = f32_mut(call->outputs[1]);
    const int64_t k = s.group_size, groups = s.c / k;
    std::vector<double> g(static_cast<size_t>(k));
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t q = 0; q < groups; ++q) {
        const int64_t i0 = n * s.c + q * k;
        double ms = 0.0;
        for (int64_t c = 0; c < k; ++c) {
          const double z = load(Z, i0 + c);
          g[c] = load(Y, i0 + c) * z * sigmoid(z);
          ms += g[c] * g[c];
        }
        const double r = 1.0 / std::sqrt(ms / static_cast<double>(k) + s.attrs.eps);
        for (int64_t c = 0; c < k; ++c)
          store(out, i0 + c, static_cast<float>(g[c] * r * load(W, q * k + c)));
        rstd[n * groups + q] = static_cast<float>(r);
      }
  });
}

Status rmsnorm_gated_bwd_ref(const OpCall* call) {
  return guard([&] {
    RmsNormGatedShape s = check_norm_bwd(call, false);
    const TensorView &dO = call->inputs[0], &Y = call->inputs[1], &Z = call->inputs[2],
                     &W = call->inputs[3];
    const float* rstd = f32(call->inputs[4]);
    const TensorView &dY = call->outputs[0], &dZ = call->outputs[1];
    const int64_t k = s.group_size, groups = s.c / k;
    std::vector<double> dw(static_cast<size_t>(s.c), 0.0), gh(static_cast<size_t>(k)),
        gw(static_cast<size_t>(k));
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t q = 0; q < groups; ++q) {
        const int64_t i0 = n * s.c + q * k;
        const double r = rstd[n * groups + q];
        double mean = 0.0;
        for (int64_t c = 0; c < k; ++c) {
          const double z = load(Z, i0 + c), d = load(dO, i0 + c);
          gh[c] = load(Y, i0 + c) * z * sigmoid(z) * r;
          gw[c] = d * load(W, q * k + c);
          mean += gw[c] * gh[c];
          dw[q * k + c] += d * gh[c];
        }
        mean /= static_cast<double>(k);
        for (int64_t c = 0; c < k; ++c) {
          const double dg = r * (gw[c] - gh[c] * mean);
          const double y = load(Y, i0 + c), z = load(Z, i0 + c), sg = sigmoid(z);
          store(dY, i0 + c, static_cast<float>(dg * z * sg));
          store(dZ, i0 + c, static_cast<float>(dg * y * sg * (1.0 + z * (1.0 - sg))));
        }
      }
    float* dweight = f32_mut(call->outputs[2]);
    for (int64_t c = 0; c < s.c; ++c) dweight[c] += static_cast<float>(dw[c]);
  });
}

LOOM_CPU_FAST_BEGIN

Status rmsnorm_gated_fast(const OpCall* call) {
  return guard([&] {
    RmsNormGatedShape s = check_norm(call, false);
    const TensorView &Y = call->inputs[0], &Z = call->inputs[1], &out = call->outputs[0];
    std::vector<float> w(static_cast<size_t>(s.c));
    load_row(call->inputs[2].data, call->inputs[2].dtype, 0, s.c, w.data());
    float* rstd = f32_mut(call->outputs[1]);
    const int64_t k = s.group_size, groups = s.c / k;
#pragma omp parallel
    {
      std::vector<float> y(static_cast<size_t>(s.c)), z(static_cast<size_t>(s.c));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        load_row(Y.data, Y.dtype, n * s.c, s.c, y.data());
        load_row(Z.data, Z.dtype, n * s.c, s.c, z.data());
        for (int64_t c = 0; c < s.c; ++c) y[c] *= z[c] / (1.0f + std::exp(-z[c]));  // g
        for (int64_t q = 0; q < groups; ++q) {
          float* g = y.data() + q * k;
          float ms = 0.0f;
          for (int64_t c = 0; c < k; ++c) ms += g[c] * g[c];
          const float r = 1.0f / std::sqrt(ms / static_cast<float>(k) + s.attrs.eps);
          for (int64_t c = 0; c < k; ++c) g[c] *= r * w[q * k + c];
          rstd[n * groups + q] = r;
        }
        store_row(out.data, out.dtype, n * s.c, s.c, y.data());
      }
    }
  });
}

Status rmsnorm_gated_bwd_fast(const OpCall* call) {
  return guard([&] {
    RmsNormGatedShape s = check_norm_bwd(call, false);
    const TensorView &dO = call->inputs[0], &Y = call->inputs[1], &Z = call->inputs[2];
    const TensorView &dY = call->outputs[0], &dZ = call->outputs[1];
    std::vector<float> w(static_cast<size_t>(s.c));
    load_row(call->inputs[3].data, call->inputs[3].dtype, 0, s.c, w.data());
    const float* rstd = f32(call->inputs[4]);
    const int64_t k = s.group_size, groups = s.c / k;
    const int threads = omp_get_max_threads();
    std::vector<float> partial(static_cast<size_t>(threads) * s.c, 0.0f);  // (threads, C)
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> d(static_cast<size_t>(s.c)), y(static_cast<size_t>(s.c)),
          z(static_cast<size_t>(s.c)), gh(static_cast<size_t>(s.c));
      float* dw = partial.data() + omp_get_thread_num() * s.c;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        load_row(dO.data, dO.dtype, n * s.c, s.c, d.data());
        load_row(Y.data, Y.dtype, n * s.c, s.c, y.data());
        load_row(Z.data, Z.dtype, n * s.c, s.c, z.data());
        for (int64_t q = 0; q < groups; ++q) {
          const float r = rstd[n * groups + q];
          float mean = 0.0f;
          for (int64_t c = q * k; c < (q + 1) * k; ++c) {
            gh[c] = y[c] * z[c] / (1.0f + std::exp(-z[c])) * r;
            dw[c] += d[c] * gh[c];
            d[c] *= w[c];  // dout * weight
            mean += d[c] * gh[c];
          }
          mean /= static_cast<float>(k);
          for (int64_t c = q * k; c < (q + 1) * k; ++c) {
            const float dg = r * (d[c] - gh[c] * mean), sg = 1.0f / (1.0f + std::exp(-z[c]));
            d[c] = dg * z[c] * sg;                                // dy
            y[c] = dg * y[c] * sg * (1.0f + z[c] * (1.0f - sg));  // dz
          }
        }
        store_row(dY.data, dY.dtype, n * s.c, s.c, d.data());
        store_row(dZ.data, dZ.dtype, n * s.c, s.c, y.data());
      }
    }
    float* dweight = f32_mut(call->outputs[2]);
    for (int th = 0; th < threads; ++th)
      for (int64_t c = 0; c < s.c; ++c) dweight[c] += partial[th * s.c + c];
  });
}

LOOM_CPU_FAST_END

LOOM_CPU_HOOKS(rmsnorm_gated, check_norm, 10)
LOOM_CPU_HOOKS(rmsnorm_gated_bwd, check_norm_bwd, 20)

}  // namespace

void add_rmsnorm_gated_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kRmsNormGated, rmsnorm_gated);
  LOOM_CPU_REGISTER(out, ops::kRmsNormGatedBwd, rmsnorm_gated_bwd);
}

}  // namespace loom::kernels::cpu
