// causal_conv1d / causal_conv1d_bwd: Mamba-2's depthwise causal convolution along T with an
// optional SiLU (loom/ops/mamba.h).
//   u[b, t, c] = bias[c] + sum_j weight[c, j] * xe[b, t + j - (W - 1), c], y = silu(u) or u
//   du = dy * silu'(u);  dx[s] = sum_j weight[c, j] du[s - j + W - 1];
//   dweight[c, j] += sum_{b,t} du[b, t, c] xe[b, t + j - (W - 1), c];  dbias[c] += sum du
// where xe is x preceded by the W - 1 rows of initial_state (or zeros).
//   reference: element by element in f64.
//   fast: x converted to f32 once, OpenMP over the (b, t) rows, a row of Cc channels at a
//   time (W <= 8 taps), per-thread dweight / dbias partials.
#include <loom/cpp/op_checks/mamba.h>
#include <loom/cpp/tensor.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::CausalConv1dShape;

CausalConv1dShape check_conv(const OpCall* call, bool shapes_only) {
  return op_checks::check_causal_conv1d(call, shapes_only, DeviceType::kCpu);
}
CausalConv1dShape check_conv_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_causal_conv1d_bwd(call, shapes_only, DeviceType::kCpu);
}

// xe[b, s, c] of the reference: x for s >= 0, the initial state (or 0) for s in [-(W-1), 0).
double xe_ref(const TensorView& x, const TensorView* init, const CausalConv1dShape& s, int64_t b,
              int64_t t, int64_t c) {
  if (t >= 0) return load(x, (b * s.t + t) * s.c + c);
  if (init == nullptr) return 0.0;
  return load(*init, (b * (s.w - 1) + (s.w - 1 + t)) * s.c + c);
}

double silu(double u) { return u / (1.0 + std::exp(-u)); }
double silu_grad(double u) {
  const double sg = 1.0 / (1.0 + std::exp(-u));
  return sg * (1.0 + u * (1.0 - sg));
}

// u[b, t, c] of the reference, before the activation.
double conv_ref(const OpCall* call, int xi, const CausalConv1dShape& s, int64_t b, int64_t t,
                int64_t c) {
  const TensorView &x = call->inputs[xi], &w = call->inputs[xi + 1];
  const TensorView* bias = present(call->inputs[xi + 2]) ? &call->inputs[xi + 2] : nullptr;
  const TensorView* init = present(call->inputs[xi + 3]) ? &call->inputs[xi + 3] : nullptr;
  double u = bias != nullptr ? load(*bias, c) : 0.0;
  for (int64_t j = 0; j < s.w; ++j)
    u += static_cast<double>(load(w, c * s.w + j)) * xe_ref(x, init, s, b, t + j - (s.w - 1), c);
  return u;
}

Status causal_conv1d_ref(const OpCall* call) {
  return guard([&] {
    CausalConv1dShape s = check_conv(call, false);
    const TensorView& x = call->inputs[0];
    const TensorView* init = present(call->inputs[3]) ? &call->inputs[3] : nullptr;
    const TensorView &y = call->outputs[0], &fin = call->outputs[1];
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t t = 0; t < s.t; ++t)
        for (int64_t c = 0; c < s.c; ++c) {
          const double u = conv_ref(call, 0, s, b, t, c);
          store(y, (b * s.t + t) * s.c + c, static_cast<float>(s.attrs.activation ? silu(u) : u));
        }
    if (present(fin))
      for (int64_t b = 0; b < s.b; ++b)
        for (int64_t k = 0; k < s.w - 1; ++k)
          for (int64_t c = 0; c < s.c; ++c)
            store(fin, (b * (s.w - 1) + k) * s.c + c,
                  static_cast<float>(xe_ref(x, init, s, b, s.t - (s.w - 1) + k, c)));
  });
}

Status causal_conv1d_bwd_ref(const OpCall* call) {
  return guard([&] {
    CausalConv1dShape s = check_conv_bwd(call, false);
    const TensorView &dy = call->inputs[0], &x = call->inputs[1], &w = call->inputs[2];
    const TensorView* init = present(call->inputs[4]) ? &call->inputs[4] : nullptr;
    const TensorView& dx = call->outputs[0];
    std::vector<double> du(static_cast<size_t>(s.b * s.t * s.c));  // (B, T, Cc)
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t t = 0; t < s.t; ++t)
        for (int64_t c = 0; c < s.c; ++c) {
          const int64_t i = (b * s.t + t) * s.c + c;
          du[i] = load(dy, i);
          if (s.attrs.activation) du[i] *= silu_grad(conv_ref(call, 1, s, b, t, c));
        }
    std::vector<double> dw(static_cast<size_t>(s.c * s.w), 0.0), db(static_cast<size_t>(s.c), 0.0);
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t t = 0; t < s.t; ++t)
        for (int64_t c = 0; c < s.c; ++c) {
          double acc = 0.0;  // dx[b, t, c]: every output t' = t - j + W - 1 that reads x[t]
          for (int64_t j = 0; j < s.w; ++j) {
            const int64_t to = t - j + s.w - 1;
            if (to < s.t) acc += load(w, c * s.w + j) * du[(b * s.t + to) * s.c + c];
          }
          store(dx, (b * s.t + t) * s.c + c, static_cast<float>(acc));
          const double g = du[(b * s.t + t) * s.c + c];
          db[c] += g;
          for (int64_t j = 0; j < s.w; ++j)
            dw[c * s.w + j] += g * xe_ref(x, init, s, b, t + j - (s.w - 1), c);
        }
    float* dweight = f32_mut(call->outputs[1]);
    for (int64_t i = 0; i < s.c * s.w; ++i) dweight[i] += static_cast<float>(dw[i]);
    if (present(call->outputs[2]))
      for (int64_t c = 0; c < s.c; ++c) f32_mut(call->outputs[2])[c] += static_cast<float>(db[c]);
  });
}

LOOM_CPU_FAST_BEGIN

// The operands of a fast call in f32: x (B, T, Cc), weight transposed (W, Cc), bias (Cc),
// initial state (B, W - 1, Cc) or null.
struct ConvF32 {
  const CausalConv1dShape& s;
  F32Copy x;
  std::vector<float> wt, bias;
  const TensorView* init_view;
  std::vector<float> init;

  ConvF32(const OpCall* call, int xi, const CausalConv1dShape& shape)
      : s(shape),
        x(call->inputs[xi]),
        wt(static_cast<size_t>(shape.w * shape.c)),
        bias(static_cast<size_t>(shape.c), 0.0f),
        init_view(present(call->inputs[xi + 3]) ? &call->inputs[xi + 3] : nullptr) {
    std::vector<float> w(static_cast<size_t>(s.c * s.w));
    load_row(call->inputs[xi + 1].data, call->inputs[xi + 1].dtype, 0, s.c * s.w, w.data());
    for (int64_t c = 0; c < s.c; ++c)
      for (int64_t j = 0; j < s.w; ++j) wt[j * s.c + c] = w[c * s.w + j];
    if (present(call->inputs[xi + 2]))
      load_row(call->inputs[xi + 2].data, call->inputs[xi + 2].dtype, 0, s.c, bias.data());
    if (init_view != nullptr && s.w > 1) {
      init.resize(static_cast<size_t>(s.b * (s.w - 1) * s.c));
      load_row(init_view->data, init_view->dtype, 0, s.b * (s.w - 1) * s.c, init.data());
    }
  }
  // Row xe[b, t] (Cc values), or null for a row of zeros.
  const float* row(int64_t b, int64_t t) const {
    if (t >= 0) return x.data() + (b * s.t + t) * s.c;
    if (init.empty()) return nullptr;
    return init.data() + (b * (s.w - 1) + (s.w - 1 + t)) * s.c;
  }
  // u[b, t, :] into `u` (Cc).
  void conv_row(int64_t b, int64_t t, float* u) const {
    std::copy(bias.begin(), bias.end(), u);
    for (int64_t j = 0; j < s.w; ++j) {
      const float* xr = row(b, t + j - (s.w - 1));
      if (xr == nullptr) continue;
      const float* wr = wt.data() + j * s.c;
      for (int64_t c = 0; c < s.c; ++c) u[c] += wr[c] * xr[c];
    }
  }
};

Status causal_conv1d_fast(const OpCall* call) {
  return guard([&] {
    CausalConv1dShape s = check_conv(call, false);
    const ConvF32 op(call, 0, s);
    const TensorView &y = call->outputs[0], &fin = call->outputs[1];
#pragma omp parallel
    {
      std::vector<float> u(static_cast<size_t>(s.c));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < s.b * s.t; ++r) {
        op.conv_row(r / s.t, r % s.t, u.data());
        if (s.attrs.activation)
          for (float& v : u) v = v / (1.0f + std::exp(-v));
        store_row(y.data, y.dtype, r * s.c, s.c, u.data());
      }
    }
    if (present(fin)) {
      const std::vector<float> zeros(static_cast<size_t>(s.c), 0.0f);
      for (int64_t b = 0; b < s.b; ++b)
        for (int64_t k = 0; k < s.w - 1; ++k) {
          const float* src = op.row(b, s.t - (s.w - 1) + k);
          store_row(fin.data, fin.dtype, (b * (s.w - 1) + k) * s.c, s.c,
                    src != nullptr ? src : zeros.data());
        }
    }
  });
}

Status causal_conv1d_bwd_fast(const OpCall* call) {
  return guard([&] {
    CausalConv1dShape s = check_conv_bwd(call, false);
    const ConvF32 op(call, 1, s);
    const TensorView &dy = call->inputs[0], &dx = call->outputs[0];
    const int64_t rows = s.b * s.t;
    std::vector<float> du(static_cast<size_t>(rows * s.c));  // (B, T, Cc)
    const int threads = omp_get_max_threads();
    // (threads, W + 1, Cc): dweight transposed, then dbias
    std::vector<float> partial(static_cast<size_t>(threads * (s.w + 1) * s.c), 0.0f);
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> u(static_cast<size_t>(s.c)), acc(static_cast<size_t>(s.c));
      float* part = partial.data() + omp_get_thread_num() * (s.w + 1) * s.c;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        float* g = du.data() + r * s.c;
        load_row(dy.data, dy.dtype, r * s.c, s.c, g);
        if (s.attrs.activation) {
          op.conv_row(r / s.t, r % s.t, u.data());
          for (int64_t c = 0; c < s.c; ++c) {
            const float sg = 1.0f / (1.0f + std::exp(-u[c]));
            g[c] *= sg * (1.0f + u[c] * (1.0f - sg));
          }
        }
      }
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t b = r / s.t, t = r % s.t;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < s.w; ++j) {
          const int64_t to = t - j + s.w - 1;
          if (to >= s.t) continue;
          const float *wr = op.wt.data() + j * s.c, *g = du.data() + (b * s.t + to) * s.c;
          for (int64_t c = 0; c < s.c; ++c) acc[c] += wr[c] * g[c];
        }
        store_row(dx.data, dx.dtype, r * s.c, s.c, acc.data());
        const float* g = du.data() + r * s.c;
        for (int64_t j = 0; j < s.w; ++j) {
          const float* xr = op.row(b, t + j - (s.w - 1));
          if (xr == nullptr) continue;
          float* pw = part + j * s.c;
          for (int64_t c = 0; c < s.c; ++c) pw[c] += g[c] * xr[c];
        }
        float* pb = part + s.w * s.c;
        for (int64_t c = 0; c < s.c; ++c) pb[c] += g[c];
      }
    }
    float* dweight = f32_mut(call->outputs[1]);
    float* dbias = present(call->outputs[2]) ? f32_mut(call->outputs[2]) : nullptr;
    for (int th = 0; th < threads; ++th) {
      const float* part = partial.data() + th * (s.w + 1) * s.c;
      for (int64_t c = 0; c < s.c; ++c) {
        for (int64_t j = 0; j < s.w; ++j) dweight[c * s.w + j] += part[j * s.c + c];
        if (dbias != nullptr) dbias[c] += part[s.w * s.c + c];
      }
    }
  });
}

LOOM_CPU_FAST_END

bool causal_conv1d_supports(const OpCall* c) {
  return passes([&] { check_conv(c, true); });
}
bool causal_conv1d_fast_supports(const OpCall* c) {
  return cpu_has_avx2() && causal_conv1d_supports(c);
}
bool causal_conv1d_bwd_supports(const OpCall* c) {
  return passes([&] { check_conv_bwd(c, true); });
}
bool causal_conv1d_bwd_fast_supports(const OpCall* c) {
  return cpu_has_avx2() && causal_conv1d_bwd_supports(c);
}
// 2 W FLOPs per output (a multiply-add per tap), 4 W per gradient element (dx and dweight).
Status causal_conv1d_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    CausalConv1dShape s = check_conv(c, true);
    *out = io_cost(c, 2.0 * static_cast<double>(s.w) * static_cast<double>(s.b * s.t * s.c));
  });
}
Status causal_conv1d_bwd_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    CausalConv1dShape s = check_conv_bwd(c, true);
    *out = io_cost(c, 6.0 * static_cast<double>(s.w) * static_cast<double>(s.b * s.t * s.c));
  });
}

}  // namespace

void add_causal_conv1d_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kCausalConv1d, causal_conv1d);
  LOOM_CPU_REGISTER(out, ops::kCausalConv1dBwd, causal_conv1d_bwd);
}

}  // namespace loom::kernels::cpu
