// ModuleBase<I>: the IModule bookkeeping shared by the transformer plugin's modules: a table
// of declared parameters and their bound views, owned children with their names, and
// forward/backward entry points that turn exceptions into a Status at the boundary. A
// module writes its constructor (declare parameters, build children, resolve kernels) and
// run_forward / run_backward. After a successful backward of a module that declares
// parameters, the base signals IForwardContext::grads_ready: its gradients are final, so
// a module must not accumulate into parameters declared by a module whose backward ran
// before its own (a tied output layer uses the embedding's weight, whose backward is last).
// It then drops what the module saved (IForwardContext::drop_saved), so saved activations
// are freed layer by layer as backward goes down (views.h, release_all, has the rules).
#pragma once

#include <loom/cpp/tensor.h>
#include <loom/sdk.h>

#include <string>
#include <utility>
#include <vector>

#include "plugins/transformer/views.h"

namespace loom::transformer {

/// One declared parameter and the views the core bound to it.
struct ParamSlot {
  std::string name;  // within the module ("self_attention.linear_qkv.weight")
  ParamInfo info;    // info.name points into `name`
  TensorView value{};
  TensorView grad{};  // f32, accumulated into by backward
};

/// How a parameter is laid out over ranks and how it starts out.
struct ParamSpec {
  std::vector<int64_t> shape;  // of the whole tensor (global)
  int32_t tp_split_dim = -1;   // split over the tensor-parallel group, -1: replicated
  uint32_t flags = kParamNone;
  ParamInit init = ParamInit::kZeros;
  float init_std = 0.f;
  int32_t tp_size = 1;  // ranks in the tensor-parallel group: the local shape divides
                        // shape[tp_split_dim] by it (the module checked divisibility)
};

template <class I>
class ModuleBase : public Object<I> {
 public:
  int32_t param_count() const noexcept override { return static_cast<int32_t>(params_.size()); }
  Status param_info(int32_t index, ParamInfo* out) const noexcept override {
    return guard([&] { *out = slot(index).info; });
  }
  Status bind_param(int32_t index, const TensorView* param,
                    const TensorView* grad) noexcept override {
    return guard([&] {
      ParamSlot& p = slot(index);
      check_bound(p, *param, p.info.dtype, "storage");
      check_bound(p, *grad, DType::kF32, "gradient");
      p.value = *param;
      p.grad = *grad;
    });
  }
  Status init_param(int32_t index, uint64_t) noexcept override {
    return make_status(Code::kFailedPrecondition,
                       "no parameter of this module has a custom initialisation");
  }
  int32_t child_count() const noexcept override { return static_cast<int32_t>(children_.size()); }
  Status child(int32_t index, StringView* name, IModule** out) noexcept override {
    if (index < 0 || index >= child_count())
      return make_status(Code::kOutOfRange, "child index out of range");
    *name = StringView{children_[index].first.data(), children_[index].first.size()};
    *out = children_[index].second;
    return ok_status();
  }
  Status forward(IForwardContext* ctx, const TensorView* inputs, int32_t num_inputs,
                 TensorView* outputs, int32_t num_outputs) noexcept override {
    return guard([&] { run_forward(*ctx, inputs, num_inputs, outputs, num_outputs); });
  }
  Status backward(IForwardContext* ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                  TensorView* grad_inputs, int32_t num_grad_inputs) noexcept override {
    return guard([&] {
      run_backward(*ctx, grad_outputs, num_grad_outputs, grad_inputs, num_grad_inputs);
      if (!params_.empty()) signal_grads_ready(*ctx, static_cast<const IModule*>(this));
      // What this module saved served this backward only (full recomputation saves again).
      // Modules save under their own `this`: the address of the most-derived object.
      drop_saved(*ctx, dynamic_cast<const void*>(this));
    });
  }

 protected:
  ~ModuleBase() override {
    for (auto& [name, module] : children_) module->destroy();
  }

  virtual void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                           TensorView* outputs, int32_t num_outputs) = 0;
  virtual void run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                            int32_t num_grad_outputs, TensorView* grad_inputs,
                            int32_t num_grad_inputs) = 0;

  /// Declares a parameter; returns its index. Call only from the constructor.
  int32_t add_param(std::string name, DType dtype, const ParamSpec& spec) {
    LOOM_CHECK(spec.shape.size() <= static_cast<size_t>(kMaxDims), "rank ", spec.shape.size());
    ParamSlot p;
    p.name = std::move(name);
    p.info = ParamInfo{};
    p.info.struct_size = sizeof(ParamInfo);
    p.info.dtype = dtype;
    p.info.ndim = static_cast<int32_t>(spec.shape.size());
    for (size_t d = 0; d < spec.shape.size(); ++d)
      p.info.shape[d] = p.info.global_shape[d] = spec.shape[d];
    if (spec.tp_split_dim >= 0 && spec.tp_size > 1) {
      int64_t& local = p.info.shape[spec.tp_split_dim];
      LOOM_CHECK(local % spec.tp_size == 0, "parameter ", p.name, ": dimension ", spec.tp_split_dim,
                 " of ", local, " is not divisible by tp ", spec.tp_size);
      local /= spec.tp_size;
    }
    p.info.tp_split_dim = spec.tp_split_dim;
    p.info.expert_index = -1;
    p.info.flags = spec.flags;
    p.info.init = spec.init;
    p.info.init_std = spec.init_std;
    params_.push_back(std::move(p));
    // Names point into the slots' strings; fix them up after every move of the vector.
    for (ParamSlot& q : params_) q.info.name = q.name.c_str();
    return static_cast<int32_t>(params_.size()) - 1;
  }

  /// Takes ownership of `child` (destroyed with this module) under `name`.
  void add_child(std::string name, IModule* child) {
    LOOM_CHECK(child != nullptr, "child ", name);
    children_.emplace_back(std::move(name), child);
  }

  /// The bound storage and gradient of parameter `index`.
  const TensorView& value(int32_t index) const { return bound(index).value; }
  const TensorView& grad(int32_t index) const { return bound(index).grad; }

 private:
  ParamSlot& slot(int32_t index) {
    return const_cast<ParamSlot&>(static_cast<const ModuleBase*>(this)->slot(index));
  }
  const ParamSlot& slot(int32_t index) const {
    if (index < 0 || index >= param_count())
      fail(Code::kOutOfRange,
           detail::concat("parameter index ", index, " out of range [0, ", param_count(), ")"));
    return params_[index];
  }
  const ParamSlot& bound(int32_t index) const {
    const ParamSlot& p = slot(index);
    if (p.value.data == nullptr)
      fail(Code::kFailedPrecondition,
           "parameter " + p.name + " used before the core bound its storage");
    return p;
  }
  static void check_bound(const ParamSlot& p, const TensorView& view, DType dtype,
                          const char* what) {
    bool same = view.ndim == p.info.ndim && view.dtype == dtype && is_contiguous(view);
    for (int32_t d = 0; same && d < view.ndim; ++d) same = view.shape[d] == p.info.shape[d];
    if (!same)
      fail(Code::kInvalidArgument,
           detail::concat("parameter ", p.name, ": bound ", what, " is ", dtype_name(view.dtype),
                          shape_string(view), ", declared ", dtype_name(dtype), " with rank ",
                          p.info.ndim, " (contiguous)"));
  }

  std::vector<ParamSlot> params_;
  std::vector<std::pair<std::string, IModule*>> children_;
};

}  // namespace loom::transformer
