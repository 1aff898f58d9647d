// Full activation recomputation (RecomputePolicy::kFull) inside one module: forward runs its
// children through a ForwardOnlyContext, which drops their saves, and keeps only its own
// input; backward reruns that forward on a RerunContext over the real context, where every
// child saves what its backward needs, then goes back through them.
//
// Both wrappers forward every method to the real context except:
//   ForwardOnlyContext  save (dropped: nothing of the children is kept), drop_saved (nothing
//                       was saved through it), grads_ready (a forward pass has no backward,
//                       so a signal through it could only be early, and an early one would
//                       let the core reduce gradients still being accumulated; a dropped
//                       one only loses overlap)
//   RerunContext        metric (the first forward reported this micro-batch's values
//                       already; the rerun would count them twice)
// The random streams are the real context's, so dropout masks are identical in both runs.
#pragma once

#include <loom/cpp/nn/views.h>

namespace loom::nn {

/// Forwards every IForwardContext method to `inner` (a base for the two filters below).
class ContextForwarder : public IForwardContext {
 public:
  explicit ContextForwarder(IForwardContext& inner) : inner_(inner) {}
  InterfaceInfo interface_info() const noexcept override { return kinds::kForwardContext; }
  bool training() const noexcept override { return inner_.training(); }
  RecomputePolicy recompute() const noexcept override { return inner_.recompute(); }
  int32_t micro_batch() const noexcept override { return inner_.micro_batch(); }
  Status allocate(DType dtype, int32_t ndim, const int64_t* shape, Device device,
                  TensorView* out) noexcept override {
    return inner_.allocate(dtype, ndim, shape, device, out);
  }
  Status save(const void* owner, int32_t slot, const TensorView* tensor) noexcept override {
    return inner_.save(owner, slot, tensor);
  }
  Status load(const void* owner, int32_t slot, TensorView* out) noexcept override {
    return inner_.load(owner, slot, out);
  }
  void rng(const void* owner, uint64_t purpose, uint64_t* key,
           uint64_t* counter) noexcept override {
    inner_.rng(owner, purpose, key, counter);
  }
  IKvCache* kv_cache() noexcept override { return kv_cache_of(inner_); }
  void grads_ready(const void* owner) noexcept override { signal_grads_ready(inner_, owner); }
  // Releases reach the real context (a no-op there before forward_context 1.3).
  Status release(const TensorView* tensor) noexcept override {
    if (!context_has(inner_, 3)) return ok_status();
    return inner_.release(tensor);
  }
  void drop_saved(const void* owner) noexcept override {
    if (context_has(inner_, 3)) inner_.drop_saved(owner);
  }
  bool defer_weight_grads() const noexcept override {
    return weight_grads_deferred(const_cast<IForwardContext&>(inner_));
  }
  Status metric(StringView name, const TensorView* value, MetricReduce reduce) noexcept override {
    if (!context_has(inner_, 4)) return ok_status();
    return inner_.metric(name, value, reduce);
  }
  double aux_loss_weight() const noexcept override {
    return context_has(const_cast<IForwardContext&>(inner_), 5) ? inner_.aux_loss_weight() : 0.0;
  }
  const TensorView* loss_grad() const noexcept override {
    return context_has(const_cast<IForwardContext&>(inner_), 7) ? inner_.loss_grad() : nullptr;
  }
  int32_t grad_first_write(const TensorView* grad) noexcept override {
    return context_has(inner_, 8) ? inner_.grad_first_write(grad) : 0;
  }
  uint64_t param_version() const noexcept override {
    return context_has(const_cast<IForwardContext&>(inner_), 9) ? inner_.param_version() : 0;
  }

 protected:
  IForwardContext& inner_;
};

/// The context of a forward pass whose children keep nothing (see the top of this file).
class ForwardOnlyContext final : public ContextForwarder {
 public:
  using ContextForwarder::ContextForwarder;
  Status save(const void*, int32_t, const TensorView*) noexcept override { return ok_status(); }
  void grads_ready(const void*) noexcept override {}
  void drop_saved(const void*) noexcept override {}  // nothing was saved through this wrapper
};

/// The context of the forward pass rerun in backward (see the top of this file).
class RerunContext final : public ContextForwarder {
 public:
  using ContextForwarder::ContextForwarder;
  Status metric(StringView, const TensorView*, MetricReduce) noexcept override {
    return ok_status();
  }
};

}  // namespace loom::nn
