// What the two token dispatchers share: the expert-parallel group, the permutation kernels,
// and keeping host-side index arrays in the micro-batch's context (a dispatcher holds no
// state of its own: several micro-batches may be in flight).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "plugins/moe/routing.h"
#include "plugins/moe/toolkit.h"

namespace loom::moe {

class DispatcherBase : public Object<IMoeDispatcher> {
 public:
  DispatcherBase(const nlohmann::json& options, IBuildContext& ctx)
      : host_(*ctx.host()),
        experts_(inherited<int64_t>(options, "num_experts", "moe dispatcher")),
        dtype_(params_dtype(options)),
        device_(device_of(options)),
        ep_(&group(host_, ParallelRole::kExpert)) {
    if (experts_ % ep_->size() != 0)
      invalid(detail::concat("#/parallel/ep: ", ep_->size(), " does not divide num_experts = ",
                             experts_, "; choose an expert-parallel size that divides it"));
    local_ = experts_ / ep_->size();
    permute_ = Kernel(host_, ops::kMoePermute, device_, dtype_);
    unpermute_ = Kernel(host_, ops::kMoeUnpermute, device_, dtype_);
    unpermute_bwd_ = Kernel(host_, ops::kMoeUnpermuteBwd, device_, dtype_);
  }

 protected:
  // Runs `body`, turning exceptions into a status (the interface is noexcept).
  template <class F>
  Status run(F&& body) noexcept {
    return guard(static_cast<F&&>(body));
  }
  // What dispatch hands on to combine and to backward, under `slot`: saved in ctx for
  // backward, and kept here for this forward pass's combine, because a forward-only context
  // (full recomputation's first pass) drops saves while combine still needs them. Combine
  // ends the pass (end_pass); fetch reads the pass's value, else the saved one.
  void stash(IForwardContext& ctx, int32_t slot, const TensorView& v) {
    save(ctx, this, slot, v);
    pass_[&ctx][slot] = v;
  }
  TensorView fetch(IForwardContext& ctx, int32_t slot) {
    auto pass = pass_.find(&ctx);
    if (pass != pass_.end()) {
      auto it = pass->second.find(slot);
      if (it != pass->second.end()) return it->second;
    }
    return load(ctx, this, slot);
  }
  void end_pass(IForwardContext& ctx) { pass_.erase(&ctx); }
  // Host values kept in ctx for the rest of the micro-batch (a host tensor under `slot`).
  template <class T>
  void keep(IForwardContext& ctx, int32_t slot, DType dtype, const std::vector<T>& values) {
    TensorView v = allocate_shape(ctx, dtype, {static_cast<int64_t>(values.size())}, kCpu);
    if (!values.empty()) std::memcpy(v.data, values.data(), values.size() * sizeof(T));
    stash(ctx, slot, v);
  }
  template <class T>
  std::vector<T> kept(IForwardContext& ctx, int32_t slot) {
    TensorView v = fetch(ctx, slot);
    const T* p = static_cast<const T*>(v.data);
    return std::vector<T>(p, p + numel(v));
  }
  // The expert rows' counts (E_local) i64 as a host tensor of ctx.
  TensorView counts_tensor(IForwardContext& ctx, const std::vector<int64_t>& counts) {
    TensorView v = allocate_shape(ctx, DType::kI64, {static_cast<int64_t>(counts.size())}, kCpu);
    if (!counts.empty()) std::memcpy(v.data, counts.data(), counts.size() * sizeof(int64_t));
    return v;
  }
  TensorView gather(IForwardContext& ctx, const TensorView& x, const char* what) {
    if (ep_->size() == 1) return x;
    std::vector<int64_t> shape(x.shape, x.shape + x.ndim);
    shape[0] *= ep_->size();
    TensorView out = allocate_shape(ctx, x.dtype, shape, x.device);
    throw_if_error(ep_->all_gather(&x, &out, nullptr),
                   std::string("moe allgather dispatcher: gathering ") + what);
    return out;
  }
  TensorView scatter_sum(IForwardContext& ctx, const TensorView& x, const char* what) {
    if (ep_->size() == 1) return x;
    std::vector<int64_t> shape(x.shape, x.shape + x.ndim);
    shape[0] /= ep_->size();
    TensorView out = allocate_shape(ctx, x.dtype, shape, x.device);
    throw_if_error(ep_->reduce_scatter(&x, &out, ReduceOp::kSum, nullptr),
                   std::string("moe allgather dispatcher: reduce-scattering ") + what);
    return out;
  }

  IHost& host_;
  int64_t experts_, local_ = 1;
  DType dtype_;
  Device device_;
  ICommunicator* ep_;
  Kernel permute_, unpermute_, unpermute_bwd_;

 private:
  // The forward passes between dispatch and combine, by context (one at a time per rank in
  // practice; keyed so that nothing leaks from one pass into another).
  std::map<const IForwardContext*, std::map<int32_t, TensorView>> pass_;
};

}  // namespace loom::moe
