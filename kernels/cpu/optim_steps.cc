// adamw_step and sgd_step on contiguous f32 shards (loom/ops.h), keyed on the grad's dtype.
//   reference: element by element, bias corrections in f64.
//   fast: OpenMP over chunks; the same f32 arithmetic, vectorised by the compiler.
#include <loom/cpp/op_checks/optim.h>

#include <algorithm>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kChunk = 2048;

int64_t check_adamw(const OpCall* call, bool shapes_only) {
  return op_checks::check_adamw_step(call, shapes_only, DeviceType::kCpu);
}

int64_t check_sgd(const OpCall* call, bool shapes_only) {
  return op_checks::check_sgd_step(call, shapes_only, DeviceType::kCpu);
}

struct AdamCoef {
  float lr, b1, b2, eps, wd, gs, bc1,
      bc2_sqrt;  // bc1 = 1 / (1 - b1^t), bc2_sqrt = 1 / sqrt(1 - b2^t)
};

AdamCoef adam_coef(const ops::AdamWAttrs& a) {
  double t = static_cast<double>(a.step);
  return AdamCoef{
      a.lr,
      a.beta1,
      a.beta2,
      a.eps,
      a.weight_decay,
      a.grad_scale,
      static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(a.beta1), t))),
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(a.beta2), t)))};
}

// One element: the same f32 arithmetic in both kernels.
inline void adam_point(const AdamCoef& c, float g, float& w, float& m, float& v) {
  g *= c.gs;
  m = c.b1 * m + (1.0f - c.b1) * g;
  v = c.b2 * v + (1.0f - c.b2) * g * g;
  w -= c.lr * (m * c.bc1 / (std::sqrt(v) * c.bc2_sqrt + c.eps) + c.wd * w);
}

inline void sgd_point(const ops::SgdAttrs& a, float g, float& w, float* buf) {
  g = g * a.grad_scale + a.weight_decay * w;
  float update = g;
  if (a.momentum != 0.0f) {
    *buf = a.step == 1 ? g : a.momentum * *buf + g;
    update = a.nesterov ? g + a.momentum * *buf : *buf;
  }
  w -= a.lr * update;
}

Status adamw_step_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_adamw(call, false);
    AdamCoef c = adam_coef(*static_cast<const ops::AdamWAttrs*>(call->attrs));
    float *w = f32_mut(call->outputs[0]), *m = f32_mut(call->outputs[1]);
    float* v = f32_mut(call->outputs[2]);
    bool cast = call->outputs[3].data != nullptr;
    for (int64_t i = 0; i < n; ++i) {
      adam_point(c, load(call->inputs[0], i), w[i], m[i], v[i]);
      if (cast) store(call->outputs[3], i, w[i]);
    }
  });
}

Status sgd_step_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_sgd(call, false);
    const ops::SgdAttrs& a = *static_cast<const ops::SgdAttrs*>(call->attrs);
    float *w = f32_mut(call->outputs[0]), *buf = f32_mut(call->outputs[1]);
    bool cast = call->outputs[2].data != nullptr;
    for (int64_t i = 0; i < n; ++i) {
      sgd_point(a, load(call->inputs[0], i), w[i], a.momentum != 0.0f ? &buf[i] : nullptr);
      if (cast) store(call->outputs[2], i, w[i]);
    }
  });
}

LOOM_CPU_FAST_BEGIN

Status adamw_step_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_adamw(call, false);
    AdamCoef c = adam_coef(*static_cast<const ops::AdamWAttrs*>(call->attrs));
    float *w = f32_mut(call->outputs[0]), *m = f32_mut(call->outputs[1]);
    float* v = f32_mut(call->outputs[2]);
    const TensorView &G = call->inputs[0], &P = call->outputs[3];
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      float g[kChunk];
      int64_t len = std::min(kChunk, n - c0);
      load_row(G.data, G.dtype, c0, len, g);
      for (int64_t i = 0; i < len; ++i) adam_point(c, g[i], w[c0 + i], m[c0 + i], v[c0 + i]);
      if (P.data != nullptr) store_row(P.data, P.dtype, c0, len, w + c0);
    }
  });
}

Status sgd_step_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_sgd(call, false);
    const ops::SgdAttrs& a = *static_cast<const ops::SgdAttrs*>(call->attrs);
    float *w = f32_mut(call->outputs[0]), *buf = f32_mut(call->outputs[1]);
    const TensorView &G = call->inputs[0], &P = call->outputs[2];
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      float g[kChunk];
      int64_t len = std::min(kChunk, n - c0);
      load_row(G.data, G.dtype, c0, len, g);
      for (int64_t i = 0; i < len; ++i)
        sgd_point(a, g[i], w[c0 + i], a.momentum != 0.0f ? &buf[c0 + i] : nullptr);
      if (P.data != nullptr) store_row(P.data, P.dtype, c0, len, w + c0);
    }
  });
}

LOOM_CPU_FAST_END

LOOM_CPU_HOOKS(adamw_step, check_adamw, 12)
LOOM_CPU_HOOKS(sgd_step, check_sgd, 6)

}  // namespace

void add_optim_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kAdamWStep, adamw_step);
  LOOM_CPU_REGISTER(out, ops::kSgdStep, sgd_step);
}

}  // namespace loom::kernels::cpu
