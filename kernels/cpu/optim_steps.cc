// adamw_step, adamw_step_multi and sgd_step on contiguous shards of f32 master weights
// (loom/ops.h), keyed on the grad's dtype, and grad_norm_clip (keyed on f64).
//   reference: element by element, bias corrections in f64.
//   fast: OpenMP over chunks; the same f32 arithmetic, vectorised by the compiler.
// AdamW's moments may be bf16: both kernels widen them to f32, run the f32 code unchanged
// and round the results back (the fast kernel through a chunk of f32 scratch), so a bf16
// moment gets the f32 moment's arithmetic followed by a cast, bit for bit.
// adamw_step_multi runs each shard through adamw_step's own code (adamw_shard_ref,
// adamw_chunk_fast), so its results are those of K adamw_step calls bit for bit. A call's
// step scalars (its last input, when present) are read when it runs (loom/cpp/adamw_coef.h,
// loom/cpp/step_scalars.h), as a device kernel reads them.
#include <loom/cpp/adamw_coef.h>
#include <loom/cpp/op_checks/optim.h>
#include <loom/cpp/step_scalars.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kChunk = 2048;

int64_t check_adamw(const OpCall* call, bool shapes_only) {
  return op_checks::check_adamw_step(call, shapes_only, DeviceType::kCpu);
}

int64_t check_adamw_multi(const OpCall* call, bool shapes_only) {
  return op_checks::check_adamw_step_multi(call, shapes_only, DeviceType::kCpu);
}

int64_t check_sgd(const OpCall* call, bool shapes_only) {
  return op_checks::check_sgd_step(call, shapes_only, DeviceType::kCpu);
}

using AdamCoef = AdamWCoef;  // loom/cpp/adamw_coef.h: shared with every kernel library

// The tensors of one AdamW shard of a call: grad = input `in`, master, exp_avg, exp_avg_sq
// and param (empty or not) = outputs [out, out + 4). The moments are f32 or bf16.
struct AdamShard {
  const TensorView& grad;
  float* w;
  const TensorView &m, &v;
  const TensorView& param;
  int64_t n;
};

AdamShard adam_shard(const OpCall* call, int32_t in, int32_t out) {
  return AdamShard{call->inputs[in],       f32_mut(call->outputs[out]), call->outputs[out + 1],
                   call->outputs[out + 2], call->outputs[out + 3],      numel(call->inputs[in])};
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

// The coefficients of an adamw_step call: its attrs', with lr, grad scale and step from its
// step scalars `s` when it has them.
AdamCoef call_coef(const ops::AdamWAttrs& a, const double* s) {
  AdamCoef c = adamw_coef(a);
  return s != nullptr ? adamw_coef(c, s) : c;
}

// adamw_step's reference over one shard.
void adamw_shard_ref(const AdamCoef& c, const AdamShard& s) {
  bool cast = s.param.data != nullptr;
  for (int64_t i = 0; i < s.n; ++i) {
    float m = load(s.m, i), v = load(s.v, i);
    adam_point(c, load(s.grad, i), s.w[i], m, v);
    store(s.m, i, m);
    store(s.v, i, v);
    if (cast) store(s.param, i, s.w[i]);
  }
}

Status adamw_step_ref(const OpCall* call) {
  return guard([&] {
    check_adamw(call, false);
    const double* s = op_checks::step_scalars(call, 1);
    if (step_skipped(s)) return;
    adamw_shard_ref(call_coef(*static_cast<const ops::AdamWAttrs*>(call->attrs), s),
                    adam_shard(call, 0, 0));
  });
}

Status adamw_step_multi_ref(const OpCall* call) {
  return guard([&] {
    check_adamw_multi(call, false);
    const auto& a = *static_cast<const ops::AdamWMultiAttrs*>(call->attrs);
    const double* s = op_checks::step_scalars(call, a.count);
    if (step_skipped(s)) return;
    for (int32_t i = 0; i < a.count; ++i)
      adamw_shard_ref(s != nullptr ? adamw_coef(adamw_coef(a, i), s) : adamw_coef(a, i),
                      adam_shard(call, i, 4 * i));
  });
}

Status sgd_step_ref(const OpCall* call) {
  return guard([&] {
    int64_t n = check_sgd(call, false);
    const double* s = op_checks::step_scalars(call, 1);
    if (step_skipped(s)) return;
    const ops::SgdAttrs a = sgd_attrs(*static_cast<const ops::SgdAttrs*>(call->attrs), s);
    float *w = f32_mut(call->outputs[0]), *buf = f32_mut(call->outputs[1]);
    bool cast = call->outputs[2].data != nullptr;
    for (int64_t i = 0; i < n; ++i) {
      sgd_point(a, load(call->inputs[0], i), w[i], a.momentum != 0.0f ? &buf[i] : nullptr);
      if (cast) store(call->outputs[2], i, w[i]);
    }
  });
}

LOOM_CPU_FAST_BEGIN

// adamw_step's fast code over elements [c0, c0 + min(kChunk, n - c0)) of one shard. Never
// inlined: adamw_step and adamw_step_multi then run the very same machine code (GCC
// contracts a * b + c into FMAs in this AVX2 code, and an inlined copy could decide
// otherwise in another caller), which keeps them bit-identical.
[[gnu::noinline]] void adamw_chunk_fast(const AdamCoef& c, const AdamShard& s, int64_t c0) {
  float g[kChunk], m_buf[kChunk], v_buf[kChunk];
  int64_t len = std::min(kChunk, s.n - c0);
  load_row(s.grad.data, s.grad.dtype, c0, len, g);
  // A moment in place when f32, else widened into its scratch (and rounded back below).
  auto moment = [&](const TensorView& t, float* buf) {
    if (t.dtype == DType::kF32) return f32_mut(t) + c0;
    load_row(t.data, t.dtype, c0, len, buf);
    return buf;
  };
  float *w = s.w + c0, *m = moment(s.m, m_buf), *v = moment(s.v, v_buf);
  for (int64_t i = 0; i < len; ++i) adam_point(c, g[i], w[i], m[i], v[i]);
  if (m == m_buf) store_row(s.m.data, s.m.dtype, c0, len, m_buf);
  if (v == v_buf) store_row(s.v.data, s.v.dtype, c0, len, v_buf);
  if (s.param.data != nullptr) store_row(s.param.data, s.param.dtype, c0, len, w);
}

Status adamw_step_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_adamw(call, false);
    const double* scalars = op_checks::step_scalars(call, 1);
    if (step_skipped(scalars)) return;
    AdamCoef c = call_coef(*static_cast<const ops::AdamWAttrs*>(call->attrs), scalars);
    AdamShard s = adam_shard(call, 0, 0);
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) adamw_chunk_fast(c, s, c0);
  });
}

// One parallel loop over the chunks of every shard together, so that many small shards (norm
// weights, biases) share the threads as well as one large shard does.
Status adamw_step_multi_fast(const OpCall* call) {
  return guard([&] {
    check_adamw_multi(call, false);
    const auto& a = *static_cast<const ops::AdamWMultiAttrs*>(call->attrs);
    const double* scalars = op_checks::step_scalars(call, a.count);
    if (step_skipped(scalars)) return;
    std::vector<AdamCoef> coef;
    std::vector<AdamShard> shards;
    std::vector<int64_t> first_chunk{0};  // (K + 1) prefix sums of the shards' chunks
    for (int32_t i = 0; i < a.count; ++i) {
      coef.push_back(scalars != nullptr ? adamw_coef(adamw_coef(a, i), scalars) : adamw_coef(a, i));
      shards.push_back(adam_shard(call, i, 4 * i));
      first_chunk.push_back(first_chunk.back() + (shards.back().n + kChunk - 1) / kChunk);
    }
    const int64_t chunks = first_chunk.back();
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < chunks; ++j) {
      // The shard holding chunk j: the last one whose first chunk is <= j (empty shards have
      // none and are skipped over).
      auto s =
          std::upper_bound(first_chunk.begin(), first_chunk.end(), j) - first_chunk.begin() - 1;
      adamw_chunk_fast(coef[s], shards[s], (j - first_chunk[s]) * kChunk);
    }
  });
}

Status sgd_step_fast(const OpCall* call) {
  return guard([&] {
    int64_t n = check_sgd(call, false);
    const double* s = op_checks::step_scalars(call, 1);
    if (step_skipped(s)) return;
    const ops::SgdAttrs a = sgd_attrs(*static_cast<const ops::SgdAttrs*>(call->attrs), s);
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

// The steps' costs by hand: they read the states they update in place as well as writing
// them (op_checks::step_cost), and adamw_step_multi's counts the elements of every shard
// (the sum of its K adamw_step calls' costs), not those of the largest tensor.
LOOM_CPU_SUPPORTS(adamw_step, check_adamw)
Status adamw_step_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    check_adamw(c, true);
    *out = op_checks::step_cost(c, 12.0 * static_cast<double>(max_numel(c)), 4);
  });
}
LOOM_CPU_SUPPORTS(adamw_step_multi, check_adamw_multi)
Status adamw_step_multi_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    *out = op_checks::step_cost(c, 12.0 * static_cast<double>(check_adamw_multi(c, true)), 4);
  });
}
LOOM_CPU_SUPPORTS(sgd_step, check_sgd)
Status sgd_step_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    check_sgd(c, true);
    *out = op_checks::step_cost(c, 6.0 * static_cast<double>(max_numel(c)), 3);
  });
}

// grad_norm_clip: a few f64 operations on the step scalars (loom/cpp/step_scalars.h).
Status grad_norm_clip_ref(const OpCall* call) {
  return guard([&] {
    op_checks::check_grad_norm_clip(call, false, DeviceType::kCpu);
    const auto& a = *static_cast<const ops::GradNormClipAttrs*>(call->attrs);
    grad_norm_clip(*static_cast<const double*>(call->inputs[0].data), a.max_norm,
                   static_cast<double*>(call->outputs[0].data));
  });
}
bool grad_norm_clip_supports(const OpCall* c) {
  return passes([&] { op_checks::check_grad_norm_clip(c, true, DeviceType::kCpu); });
}
Status grad_norm_clip_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    op_checks::check_grad_norm_clip(c, true, DeviceType::kCpu);
    *out = io_cost(c, 8.0);
  });
}

}  // namespace

void add_optim_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kAdamWStep, adamw_step);
  LOOM_CPU_REGISTER(out, ops::kAdamWStepMulti, adamw_step_multi);
  LOOM_CPU_REGISTER(out, ops::kSgdStep, sgd_step);
  // A few scalar operations: the fast kernel is the reference's code.
  add_kernels(out, ops::kGradNormClip, kRefName, kRefPriority, grad_norm_clip_ref,
              grad_norm_clip_supports, grad_norm_clip_cost, {DType::kF64});
  add_kernels(out, ops::kGradNormClip, kFastName, kFastPriority, grad_norm_clip_ref,
              grad_norm_clip_supports, grad_norm_clip_cost, {DType::kF64});
}

}  // namespace loom::kernels::cpu
