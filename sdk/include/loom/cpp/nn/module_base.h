// ModuleBase<I>: the IModule bookkeeping every module plugin needs, so that a module writes
// only its constructor (declare parameters, build children, resolve kernels) and
// run_forward / run_backward:
//   - a table of declared parameters (add_param) and the views the core binds to them;
//   - owned children with their names (add_child), destroyed with the module;
//   - forward / backward / backward_weight / step_end entry points that turn exceptions
//     into a Status at the boundary.
//
// After a successful backward the base signals IForwardContext::grads_ready for a module
// that declares parameters (its gradients are final, so a module must not accumulate into
// parameters declared by a module whose backward ran before its own: a tied output layer
// uses the embedding's weight, whose backward is last), then drops what the module saved
// (IForwardContext::drop_saved), so saved activations are freed layer by layer as backward
// goes down (views.h, release_all, has the rules for what a module hands back).
//
// Split backward (zero-bubble pipeline schedules, IForwardContext::defer_weight_grads): a
// module whose defers_weight_grads() is true computes only its input gradients in backward
// when the context defers, keeps what its weight gradients need under deferred_owner()
// (not under `this`, which backward drops), and computes them in run_backward_weight; the
// base then signals grads_ready and drops the deferred entries. Every other module computes
// everything in backward as usual, so a tree may mix both. The default run_backward_weight
// runs the children's backward_weight, the last child added first (backward order).
#pragma once

#include <loom/cpp/nn/views.h>
#include <loom/cpp/object.h>
#include <loom/cpp/tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace loom::nn {

/// One declared parameter and the views the core bound to it.
struct ParamSlot {
  std::string name;  ///< within the module ("self_attention.linear_qkv.weight")
  ParamInfo info;    ///< info.name points into `name`
  TensorView value{};
  TensorView grad{};  ///< f32, accumulated into by backward
};

/// How a parameter is laid out over ranks and how it starts out.
struct ParamSpec {
  std::vector<int64_t> shape;  ///< of the whole tensor (global)
  int32_t tp_split_dim = -1;   ///< split over the tensor-parallel group (the expert
                               ///< tensor-parallel group for kParamExpert), -1: replicated
  uint32_t flags = kParamNone;
  ParamInit init = ParamInit::kZeros;
  float init_std = 0.f;
  int32_t tp_size = 1;  ///< ranks in that group (tp, or etp): the local shape divides
                        ///< shape[tp_split_dim] by it (the module checked divisibility)
  int32_t expert_index = -1;  ///< the global expert id of a kParamExpert parameter
  /// Rows of dimension 0 (of `shape`) that hold values, the rest padding (ParamInfo::
  /// valid_rows); 0: none padded. The module keeps the padding out of its results.
  int64_t valid_rows = 0;
};

template <class I>
class ModuleBase : public Object<I> {
 public:
  int32_t param_count() const noexcept override { return static_cast<int32_t>(params_.size()); }
  Status param_info(int32_t index, ParamInfo* out) const noexcept override {
    return guard([&] { copy_struct(slot(index).info, out); });
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
      bool deferred = defers_weight_grads() && weight_grads_deferred(*ctx);
      if (!params_.empty() && !deferred)
        signal_grads_ready(*ctx, static_cast<const IModule*>(this));
      // What this module saved served this backward only (full recomputation saves again).
      // Modules save under their own `this`: the address of the most-derived object.
      drop_saved(*ctx, dynamic_cast<const void*>(this));
    });
  }
  Status backward_weight(IForwardContext* ctx) noexcept override {
    return guard([&] {
      run_backward_weight(*ctx);
      if (!defers_weight_grads()) return;
      if (!params_.empty()) signal_grads_ready(*ctx, static_cast<const IModule*>(this));
      drop_saved(*ctx, deferred_owner());
    });
  }
  Status step_end(const StepEvent* event) noexcept override {
    return guard([&] { on_step_end(*event); });
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
  /// True for a module that can leave weight gradients of its own for backward_weight when
  /// the context defers them (see the top of this file). False by default.
  virtual bool defers_weight_grads() const { return false; }
  /// The deferred weight-gradient pass: by default the children's, the last added first. A
  /// module that defers computes its own weight gradients here (and calls this base version
  /// for its children in the order its backward runs them).
  virtual void run_backward_weight(IForwardContext& ctx) {
    for (size_t i = children_.size(); i-- > 0;) {
      IModule* child = children_[i].second;
      if (module_has(*child, 1))
        throw_if_error(child->backward_weight(&ctx), children_[i].first + " backward_weight");
    }
  }
  /// The end of an optimizer step (IModule::step_end; the core calls it on every module of
  /// the tree, so a module does not pass it on to its children). Nothing by default.
  virtual void on_step_end(const StepEvent& event) {}

  /// The owner id under which a deferring module keeps what its weight gradients need: an
  /// address of this module's own that is not `this` (backward drops `this`'s entries).
  const void* deferred_owner() const { return &deferred_owner_; }

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
    p.info.expert_index = spec.expert_index;
    p.info.flags = spec.flags;
    p.info.init = spec.init;
    p.info.init_std = spec.init_std;
    LOOM_CHECK(spec.valid_rows >= 0 && (spec.shape.empty() ? spec.valid_rows == 0
                                                           : spec.valid_rows <= spec.shape[0]),
               "parameter ", p.name, ": valid_rows ", spec.valid_rows, " outside its ",
               spec.shape.empty() ? 0 : spec.shape[0], " rows");
    p.info.valid_rows = spec.valid_rows;
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
  char deferred_owner_ = 0;  // only its address is used
};

}  // namespace loom::nn
