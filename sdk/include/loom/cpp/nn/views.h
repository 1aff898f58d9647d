// Small helpers over loom::TensorView for modules: shape checks with messages, flat 2-D
// views of contiguous activations, allocation of a tensor shaped like another, saving and
// loading through the forward context, and the context methods newer than
// forward_context 1.0 behind a check of the context's minor.
#pragma once

#include <loom/cpp/tensor.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

namespace loom::nn {

/// Throws kInvalidArgument unless `view` is present and contiguous with exactly `shape`
/// (-1 matches any extent) and dtype `dtype`.
/// \param what  names the tensor in the message ("mlp input")
inline void expect(const TensorView& view, const std::vector<int64_t>& shape, DType dtype,
                   const char* what) {
  bool ok = view.data != nullptr && view.ndim == static_cast<int32_t>(shape.size()) &&
            view.dtype == dtype && is_contiguous(view);
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = shape[d] < 0 || view.shape[d] == shape[d];
  if (ok) return;
  std::string want = "(";
  for (size_t d = 0; d < shape.size(); ++d)
    want += (d ? ", " : "") + (shape[d] < 0 ? std::string("*") : std::to_string(shape[d]));
  want += ")";
  fail(Code::kInvalidArgument,
       detail::concat(what, ": expected a contiguous ", dtype_name(dtype), " tensor ", want,
                      ", got ", view.data == nullptr ? "none" : dtype_name(view.dtype),
                      shape_string(view), is_contiguous(view) ? "" : " (strided)"));
}

/// The contiguous `view` seen as (numel / cols, cols).
inline TensorView rows(const TensorView& view, int64_t cols) {
  LOOM_CHECK(cols > 0 && numel(view) % cols == 0, "cols=", cols, " numel=", numel(view));
  return make_view(view.data, view.dtype, {numel(view) / cols, cols}, view.device);
}

/// A new activation of any rank from `ctx`.
inline TensorView allocate_shape(IForwardContext& ctx, DType dtype,
                                 const std::vector<int64_t>& shape, Device device) {
  TensorView out{};
  throw_if_error(
      ctx.allocate(dtype, static_cast<int32_t>(shape.size()), shape.data(), device, &out));
  return out;
}

/// A new activation with the shape and device of `like` and `dtype` (like's when kInvalid).
inline TensorView allocate_like(IForwardContext& ctx, const TensorView& like,
                                DType dtype = DType::kInvalid) {
  std::vector<int64_t> shape(like.shape, like.shape + like.ndim);
  return allocate_shape(ctx, dtype == DType::kInvalid ? like.dtype : dtype, shape, like.device);
}

/// ctx.save, throwing on failure.
inline void save(IForwardContext& ctx, const void* owner, int32_t slot, const TensorView& view) {
  throw_if_error(ctx.save(owner, slot, &view));
}

/// ctx.load, throwing on failure (kNotFound when nothing was saved there).
inline TensorView load(IForwardContext& ctx, const void* owner, int32_t slot) {
  TensorView out{};
  throw_if_error(ctx.load(owner, slot, &out));
  return out;
}

/// True when `ctx` is at least forward_context 1.`minor` (its methods of that minor exist).
inline bool context_has(IForwardContext& ctx, int32_t minor) {
  InterfaceInfo info = ctx.interface_info();
  return info.major == 1 && info.minor >= minor;
}

/// True when `module` implements the module kinds' 1.`minor` (1.1: backward_weight and
/// step_end); a module built against an older SDK has no such methods in its table.
inline bool module_has(const IModule& module, int32_t minor) {
  InterfaceInfo info = module.interface_info();
  return info.major == 1 && info.minor >= minor;
}

/// ctx.kv_cache() when the context has it (forward_context 1.1), else null: a core built
/// before incremental decoding has no such method in its table.
inline IKvCache* kv_cache_of(IForwardContext& ctx) {
  return context_has(ctx, 1) ? ctx.kv_cache() : nullptr;
}

/// The decoding state (owner, slot) of `cache`, the kv cache of `ctx` (IKvCache::state: made
/// on first use, kept between passes; stale when the cache's past_length() is 0). Throws
/// kFailedPrecondition when the context is older than forward_context 1.6 (its cache has no
/// such method: the core is too old for this layer to decode).
inline TensorView kv_state_of(IForwardContext& ctx, IKvCache& cache, const void* owner,
                              int32_t slot, DType dtype, const std::vector<int64_t>& shape) {
  if (!context_has(ctx, 6))
    fail(Code::kFailedPrecondition,
         "this layer keeps a decoding state in the kv cache (forward_context 1.6, ABI 1.7); "
         "the core running it is older: decode with a newer loom");
  TensorView out{};
  throw_if_error(
      cache.state(owner, slot, dtype, static_cast<int32_t>(shape.size()), shape.data(), &out),
      "kv cache state");
  return out;
}

/// ctx.grads_ready(owner) when the context has it (forward_context 1.2), else nothing: an
/// older core reduces every gradient after backward anyway.
inline void signal_grads_ready(IForwardContext& ctx, const void* owner) {
  if (context_has(ctx, 2)) ctx.grads_ready(owner);
}

/// ctx.defer_weight_grads() when the context has it (forward_context 1.4), else false.
inline bool weight_grads_deferred(IForwardContext& ctx) {
  return context_has(ctx, 4) && ctx.defer_weight_grads();
}

/// Reports a number of this micro-batch to the run's log line and metrics.jsonl
/// (IForwardContext::metric, forward_context 1.4); does nothing on an older context.
/// \param name    e.g. "moe/aux_loss"
/// \param value   an f32 scalar (ndim 0 or one element) on the context's device
/// \param reduce  how the step combines the micro-batches' and the ranks' values
inline void report_metric(IForwardContext& ctx, const char* name, const TensorView& value,
                          MetricReduce reduce = MetricReduce::kMean) {
  if (!context_has(ctx, 4)) return;
  throw_if_error(ctx.metric(make_string_view(name), &value, reduce),
                 std::string("reporting metric ") + name);
}

/// ctx.loss_grad() (forward_context 1.7): the f32 scalar the backward will receive as the
/// loss's gradient, already set during the forward; null on an older core, outside training,
/// or where the core cannot know it before the forward (IForwardContext::loss_grad).
inline const TensorView* loss_grad_of(IForwardContext& ctx) {
  if (!ctx.training() || !context_has(ctx, 7)) return nullptr;
  const TensorView* g = ctx.loss_grad();
  return g != nullptr && g->data != nullptr ? g : nullptr;
}

/// The beta of a GEMM about to write `grad`, a kParamGradOverwrite parameter's gradient (or
/// a view of it from its first element): 0 (overwrite the whole gradient: the GEMM does not
/// read it) when the context says this is the step's first write (grad_first_write,
/// forward_context 1.8), else 1 (add). Call it once per write, right before it, and use the
/// answer: the gradient may hold an earlier step's values when it is 0.
inline float grad_write_beta(IForwardContext& ctx, const TensorView& grad) {
  return context_has(ctx, 8) && ctx.grad_first_write(&grad) != 0 ? 0.f : 1.f;
}

/// ctx.param_version() (forward_context 1.9): the id of the parameter values the pass
/// computes with, or 0 (keep nothing derived from them across passes) on an older core.
inline uint64_t param_version_of(IForwardContext& ctx) {
  return context_has(ctx, 9) ? ctx.param_version() : 0;
}

/// ctx.aux_loss_weight() (forward_context 1.5): the factor a module's own loss term's
/// gradient is seeded with. Throws when training on an older core, which cannot say it (a
/// term without its gradient would train silently wrong).
/// \param what  the module that asks, for the message
inline double aux_loss_weight_of(IForwardContext& ctx, const char* what) {
  if (!ctx.training()) return 0.0;
  if (!context_has(ctx, 5))
    fail(Code::kFailedPrecondition,
         std::string(what) +
             ": this loom core's forward context predates forward_context 1.5 "
             "(aux_loss_weight): use a loom built with SDK ABI 1.6 or later");
  return ctx.aux_loss_weight();
}

/// Hands activations the caller is done with back to the context (loom::release: freed
/// once nothing saved refers to them), each allocation once: views sharing a data pointer
/// count once, and a view whose data is that of one of `keep` stays (a pass-through such
/// as dropout at p = 0, or a tensor-parallel region of one rank, returns its input).
/// Ownership: a module releases what it allocated and the outputs its children returned to
/// it, never its own inputs or outputs; the base releases nothing.
inline void release_all(IForwardContext& ctx, std::initializer_list<TensorView> tensors,
                        std::initializer_list<TensorView> keep = {}) {
  std::vector<const void*> done;
  for (const TensorView& k : keep) done.push_back(k.data);
  for (const TensorView& t : tensors) {
    if (!present(t) || std::find(done.begin(), done.end(), t.data) != done.end()) continue;
    done.push_back(t.data);
    release(ctx, t);
  }
}

/// Throws kInvalidArgument unless a module was called with at least `at_least` tensors.
/// \param what  "mlp forward inputs"
inline void expect_count(const char* what, int32_t got, int32_t at_least) {
  if (got < at_least)
    fail(Code::kInvalidArgument,
         detail::concat(what, ": called with ", got, ", needs at least ", at_least));
}

}  // namespace loom::nn
