// Small helpers over loom::TensorView for the transformer modules: shape checks with
// messages, flat 2-D views of contiguous activations, allocation of a tensor shaped like
// another, and saving / loading through the forward context.
#pragma once

#include <loom/cpp/tensor.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace loom::transformer {

/// Throws kInvalidArgument unless `view` is contiguous with exactly `shape` (-1 matches
/// any extent) and dtype `dtype`.
void expect(const TensorView& view, std::vector<int64_t> shape, DType dtype, const char* what);

/// The contiguous `view` seen as (numel / cols, cols).
TensorView rows(const TensorView& view, int64_t cols);

/// A new activation with the shape of `like` and `dtype` (like's dtype when kInvalid).
TensorView allocate_like(IForwardContext& ctx, const TensorView& like,
                         DType dtype = DType::kInvalid);

/// A new activation of any rank.
TensorView allocate_shape(IForwardContext& ctx, DType dtype, const std::vector<int64_t>& shape,
                          Device device);

/// ctx.save / ctx.load, throwing on failure.
void save(IForwardContext& ctx, const void* owner, int32_t slot, const TensorView& view);
TensorView load(IForwardContext& ctx, const void* owner, int32_t slot);

/// ctx.kv_cache() when the context is new enough to have it (forward_context 1.1), else
/// null: a core built before incremental decoding has no such method in its table.
inline IKvCache* kv_cache_of(IForwardContext& ctx) {
  InterfaceInfo info = ctx.interface_info();
  return info.major == 1 && info.minor >= 1 ? ctx.kv_cache() : nullptr;
}

/// ctx.grads_ready(owner) when the context is new enough to have it (forward_context 1.2),
/// else nothing: an older core reduces every gradient after backward anyway.
inline void signal_grads_ready(IForwardContext& ctx, const void* owner) {
  InterfaceInfo info = ctx.interface_info();
  if (info.major == 1 && info.minor >= 2) ctx.grads_ready(owner);
}

/// Hands activations the caller is done with back to the context (loom::release: freed
/// once nothing saved refers to them), each allocation once: views sharing a data pointer
/// count once, and a view whose data is that of one of `keep` stays (a pass-through such
/// as dropout at p = 0, or a tensor-parallel region of one rank, returns its input).
/// Ownership: a module releases what it allocated and the outputs its children returned to
/// it, never its own inputs or outputs; the base releases nothing.
void release_all(IForwardContext& ctx, std::initializer_list<TensorView> tensors,
                 std::initializer_list<TensorView> keep = {});

/// Checks the number of inputs / outputs a module was called with.
void expect_count(const char* what, int32_t got, int32_t at_least);

}  // namespace loom::transformer
