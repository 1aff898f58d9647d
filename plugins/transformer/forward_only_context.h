// ForwardOnlyContext: a forward context that forwards everything to another one except
// `save`, which it drops (and `drop_saved`, which has nothing to drop). Under full recomputation a
// layer runs its children's forward through it (nothing of theirs is kept), saves only its own
// input, and reruns the forward on the real context in backward, where every child saves what its
// backward needs. The random streams are the real context's, so dropout masks are identical in both
// runs. grads_ready is dropped too: a forward pass has no backward, so a signal through this
// wrapper could only be early, and an early one would let the core reduce gradients that
// are still being accumulated; a dropped one only loses overlap.
#pragma once

#include <loom/sdk.h>

#include "plugins/transformer/views.h"

namespace loom::transformer {

class ForwardOnlyContext final : public IForwardContext {
 public:
  explicit ForwardOnlyContext(IForwardContext& inner) : inner_(inner) {}
  InterfaceInfo interface_info() const noexcept override { return kinds::kForwardContext; }
  bool training() const noexcept override { return inner_.training(); }
  RecomputePolicy recompute() const noexcept override { return inner_.recompute(); }
  int32_t micro_batch() const noexcept override { return inner_.micro_batch(); }
  Status allocate(DType dtype, int32_t ndim, const int64_t* shape, Device device,
                  TensorView* out) noexcept override {
    return inner_.allocate(dtype, ndim, shape, device, out);
  }
  Status save(const void*, int32_t, const TensorView*) noexcept override { return ok_status(); }
  Status load(const void* owner, int32_t slot, TensorView* out) noexcept override {
    return inner_.load(owner, slot, out);
  }
  void rng(const void* owner, uint64_t purpose, uint64_t* key,
           uint64_t* counter) noexcept override {
    inner_.rng(owner, purpose, key, counter);
  }
  IKvCache* kv_cache() noexcept override { return kv_cache_of(inner_); }
  void grads_ready(const void*) noexcept override {}
  // Releases reach the real context: what a child hands back is freed at once, since its
  // saves were dropped here.
  Status release(const TensorView* tensor) noexcept override {
    if (inner_.interface_info().minor < 3) return ok_status();
    return inner_.release(tensor);
  }
  void drop_saved(const void*) noexcept override {}  // nothing was saved through this wrapper

 private:
  IForwardContext& inner_;
};

}  // namespace loom::transformer
