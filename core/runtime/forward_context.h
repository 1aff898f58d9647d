// ForwardContext: the core's IForwardContext, the state of one micro-batch between its
// forward and its backward (DESIGN.md section 4).
//
// Activations come from the host's allocator (so they count in the memory figures) and
// live until the context is reset or destroyed, or until the module that owns one releases
// it (release) and no saved entry refers to it any more (saved entries hold a reference
// to the allocation they point into, and drop_saved lets them go). That is how memory is
// freed during a pass: temporaries as soon as they are consumed, saved activations when
// the backward that needed them is done. Saved tensors are kept by (owner, slot);
// saving again under the same key replaces the entry (full recomputation reruns a
// forward inside backward). Random streams depend only on the run's seed, the step, the
// micro-batch, the module's stable id and the purpose, never on addresses, so a run is
// reproducible across processes. An inference context may carry a KV cache
// (set_kv_cache, core/runtime/kv_cache.h) for incremental decoding. A training context may
// carry a callback for grads_ready (set_grads_ready): the trainer sets one on the last
// micro-batch of a step to start the gradient reduction during backward; a flag that splits
// its backward (set_defer_weight_grads: zero-bubble schedules); a sink for the metrics
// modules report (set_metric_sink); the step's claims of first gradient writes
// (set_grad_claims: grad_first_write); and the id of the step's parameter values
// (set_param_version: param_version).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/host.h"
#include "loom/kinds/module.h"

namespace loom::core {

/// Where a forward context's metric reports go (IForwardContext::metric).
class MetricSink {
 public:
  virtual ~MetricSink() = default;
  /// Takes `value` (an f32 tensor of one element, on any device) for metric `name` of the
  /// current step; it may read it later (it copies it now if it must). Throws loom::Error.
  virtual void record(const std::string& name, const TensorView& value, MetricReduce reduce) = 0;
};

class ForwardContext final : public IForwardContext {
 public:
  /// \param host         allocator of activations
  /// \param training     dropout on and tensors saved for backward
  /// \param recompute    recomputation policy
  /// \param micro_batch  index of the micro-batch within the step
  /// \param seed         the run's seed
  /// \param step         1-based optimizer step (random streams differ per step)
  /// \param module_ids   stable ids of the model's modules (tree order), or null; other
  ///                     owners get ids in the order of their first rng call
  ForwardContext(IHost& host, bool training, RecomputePolicy recompute, int32_t micro_batch,
                 uint64_t seed, int64_t step,
                 const std::unordered_map<const void*, uint64_t>* module_ids = nullptr);
  ~ForwardContext();
  ForwardContext(const ForwardContext&) = delete;
  ForwardContext& operator=(const ForwardContext&) = delete;

  /// Frees every activation and forgets every saved tensor.
  void reset();
  /// Bytes currently allocated through this context (released memory not included).
  uint64_t bytes_allocated() const { return bytes_; }
  /// Allocations currently live.
  size_t live_blocks() const { return blocks_.size(); }
  /// Makes the forward passes in this context decode incrementally through `cache` (null:
  /// full-sequence passes, the default). The caller keeps ownership and advances the cache
  /// after each pass. Throws Error(kFailedPrecondition) on a training context: cached keys
  /// and values are not saved for backward.
  void set_kv_cache(IKvCache* cache);
  /// Calls `callback` with the owner on every grads_ready (an empty one, the default,
  /// ignores them). The callback runs on the thread of backward, inside it. What it
  /// throws is kept (grads_ready cannot fail) and rethrown by rethrow_grads_ready_error;
  /// after that it is not called again.
  void set_grads_ready(std::function<void(const void*)> callback);
  /// Rethrows the first exception of the grads_ready callback, if any (then forgets it).
  void rethrow_grads_ready_error();
  /// Splits the backward of this micro-batch (defer_weight_grads() answers it): set before
  /// the backward that computes input gradients only, followed by the model's
  /// backward_weight on this context.
  void set_defer_weight_grads(bool defer) { defer_weight_grads_ = defer; }
  /// Sends metric reports to `sink` (null: they are ignored, the default); only a training
  /// context records them.
  void set_metric_sink(MetricSink* sink) { metric_sink_ = sink; }
  /// The weight of the micro-batch's own loss terms (aux_loss_weight; 0 by default, and
  /// always 0 outside training): the trainer's per-micro-batch loss weight.
  void set_aux_loss_weight(double weight) { aux_loss_weight_ = weight; }
  /// The loss's gradient seed of this micro-batch, already holding its value (loss_grad;
  /// none by default): the caller passes this same view as the model's grad_outputs[0] in
  /// backward, and keeps its memory alive until then. Only a training context hands it out.
  void set_loss_grad(const TensorView& grad) { loss_grad_ = grad; }
  /// Answers grad_first_write with `claim` (the step's parameter set: ParameterSet::
  /// claim_grad; empty, the default: every write adds). Only a training context asks it.
  void set_grad_claims(std::function<bool(const void*)> claim) { grad_claims_ = std::move(claim); }
  /// Answers param_version with `version` (0, the default: modules keep nothing derived
  /// from the parameters across passes); outside training it is always 0. The trainer gives
  /// every micro-batch of a step the step's id (StepPlanContext::param_version).
  void set_param_version(uint64_t version) { param_version_ = version; }
  /// Marks the pass as captured into a device graph (train.cuda_graph): a replay repeats
  /// what the capture saw, so random streams (which differ per step) and metric reports
  /// (host-side) cannot be served. rng still answers but notes the first such request in
  /// capture_refusal(); metric fails.
  void set_capturing(bool capturing) { capturing_ = capturing; }
  /// Why this pass cannot be captured ("" when nothing stood in the way).
  const std::string& capture_refusal() const { return capture_refusal_; }

  InterfaceInfo interface_info() const noexcept override;
  bool training() const noexcept override { return training_; }
  RecomputePolicy recompute() const noexcept override { return recompute_; }
  int32_t micro_batch() const noexcept override { return micro_batch_; }
  Status allocate(DType dtype, int32_t ndim, const int64_t* shape, Device device,
                  TensorView* out) noexcept override;
  Status save(const void* owner, int32_t slot, const TensorView* tensor) noexcept override;
  Status load(const void* owner, int32_t slot, TensorView* out) noexcept override;
  void rng(const void* owner, uint64_t purpose, uint64_t* key, uint64_t* counter) noexcept override;
  IKvCache* kv_cache() noexcept override { return kv_cache_; }
  void grads_ready(const void* owner) noexcept override;
  Status release(const TensorView* tensor) noexcept override;
  void drop_saved(const void* owner) noexcept override;
  bool defer_weight_grads() const noexcept override { return defer_weight_grads_; }
  Status metric(StringView name, const TensorView* value, MetricReduce reduce) noexcept override;
  double aux_loss_weight() const noexcept override { return training_ ? aux_loss_weight_ : 0.0; }
  const TensorView* loss_grad() const noexcept override {
    return training_ && loss_grad_.data != nullptr ? &loss_grad_ : nullptr;
  }
  int32_t grad_first_write(const TensorView* grad) noexcept override;
  uint64_t param_version() const noexcept override { return training_ ? param_version_ : 0; }

 private:
  IHost& host_;
  bool training_;
  RecomputePolicy recompute_;
  int32_t micro_batch_;
  uint64_t seed_;
  int64_t step_;
  const std::unordered_map<const void*, uint64_t>* module_ids_;
  std::unordered_map<const void*, uint64_t> extra_ids_;
  // One allocation. Keyed by (device, address) so that views find the block they lie in.
  struct Block {
    uint64_t bytes = 0;
    int32_t saves = 0;      ///< saved entries pointing into it
    bool released = false;  ///< its owner is done with it: freed when saves reaches 0
  };
  using BlockKey = std::pair<std::pair<int32_t, int32_t>, uintptr_t>;  // ((type, index), base)
  using Blocks = std::map<BlockKey, Block>;
  struct Saved {
    TensorView view;
    bool counted = false;  ///< holds a reference on the block of view.data
  };
  // The live block that `view` points into, or end().
  Blocks::iterator block_of(const TensorView& view);
  // Frees `it` when it is released and nothing saved refers to it.
  void maybe_free(Blocks::iterator it);
  void unref(const Saved& entry);

  Blocks blocks_;
  double aux_loss_weight_ = 0.0;
  TensorView loss_grad_{};
  std::map<std::pair<const void*, int32_t>, Saved> saved_;
  uint64_t bytes_ = 0;
  IKvCache* kv_cache_ = nullptr;
  std::function<void(const void*)> grads_ready_;
  std::exception_ptr grads_ready_error_;
  bool defer_weight_grads_ = false;
  MetricSink* metric_sink_ = nullptr;
  bool capturing_ = false;
  std::string capture_refusal_;
  std::function<bool(const void*)> grad_claims_;
  uint64_t param_version_ = 0;
};

/// SplitMix64 finaliser: mixes 64 bits (for seeds and stream keys).
uint64_t mix64(uint64_t x);

}  // namespace loom::core
