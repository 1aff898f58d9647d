// The step kernel of an optimizer ("adamw_step", "adamw_step_multi", "sgd_step"), resolved
// once, when the optimizer is built, for every gradient dtype it may be handed: f32
// (gradients accumulate in f32) and the parameter dtype when that is bf16 or f16. And the
// checks of update / update_many calls shared by the optimizers.
#pragma once

#include <loom/cpp/tensor.h>
#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::optim {

class StepKernels {
 public:
  StepKernels() = default;
  /// Resolves `op` through the host on the device named by the option "device" ("cpu" or
  /// "cuda", cpu when absent) for f32 and for the option "params_dtype" (f32 when absent).
  /// Throws kInvalidArgument for a bad option and the host's error (naming the op) when no
  /// kernel serves it, unless `optional`: then a dtype that no kernel serves is left
  /// unresolved (find() gives null for it), e.g. a kernel library older than the op.
  StepKernels(IHost& host, const char* op, const nlohmann::json& options, bool optional = false);

  /// The device family the kernels run on.
  DeviceType device() const { return device_; }

  /// The kernel for gradients of `dtype`; throws kInvalidArgument when none was resolved.
  const Kernel& for_grad(DType dtype) const;
  /// The kernel for gradients of `dtype`, or null when none was resolved.
  const Kernel* find(DType dtype) const;
  /// The gradient dtypes the kernels were resolved for: f32, then the parameter dtype when
  /// it differs.
  std::vector<DType> grad_dtypes() const;

  /// Checks one update's tensors: master f32 (n) on the kernels' device, grad (n) of a
  /// resolved dtype, and `states` (n) each, state i of `state_dtypes`[i] (the optimizer's
  /// state_dtype). Throws kInvalidArgument naming the tensor.
  void check(const TensorView* master, const TensorView* grad, const TensorView* states,
             const std::vector<DType>& state_dtypes) const;
  /// check() of one update_many shard, its gradient dtype (one the kernels were resolved
  /// for), and its param: empty, or a float tensor of the master's element count on the
  /// kernels' device. Messages name shard `index`.
  void check_shard(const OptimizerShard& shard, int32_t index,
                   const std::vector<DType>& state_dtypes) const;

 private:
  std::string op_;
  DeviceType device_ = DeviceType::kCpu;
  DType params_dtype_ = DType::kF32;
  Kernel f32_;
  Kernel params_;  ///< resolved only when params_dtype is not f32
};

/// The `count` shards of an update_many call, read with the caller's stride
/// (shards[0].struct_size: a newer core's shards are larger). Throws kInvalidArgument,
/// prefixed with `who`, for a negative count, a null array or shards older than this
/// plugin's OptimizerShard.
class ShardArray {
 public:
  ShardArray(const OptimizerShard* shards, int32_t count, const char* who);
  int32_t size() const { return count_; }
  const OptimizerShard& operator[](int32_t i) const {
    return *reinterpret_cast<const OptimizerShard*>(base_ + static_cast<size_t>(i) * stride_);
  }

 private:
  const char* base_ = nullptr;
  size_t stride_ = sizeof(OptimizerShard);
  int32_t count_ = 0;
};

/// Checks the per-step hyper-parameters: step >= 1, lr and weight_decay finite and >= 0,
/// grad_scale finite. Throws kInvalidArgument prefixed with `who`.
void check_step(const OptimizerStep* hp, const char* who);

/// hp's step scalars (optimizer 1.3): the view, checked (f64 (ops::kStepScalarCount) on a
/// `device` device), or null when hp has none (empty, or a caller older than the field).
/// Throws kInvalidArgument prefixed with `who`.
const TensorView* step_scalars(const OptimizerStep* hp, DeviceType device, const char* who);

/// Runs a step op with one gradient: `kernel` on `grad`, then `scalars` as the op's last
/// input when not null, and `outputs`.
template <class Attrs>
void run_step(const Kernel& kernel, const TensorView& grad, const TensorView* scalars,
              std::initializer_list<TensorView> outputs, const Attrs& attrs, void* stream) {
  const TensorView in[2] = {grad, scalars != nullptr ? *scalars : empty_view()};
  std::vector<TensorView> out(outputs);
  kernel.run(std::span<const TensorView>(in, scalars != nullptr ? 2 : 1),
             std::span<TensorView>(out), attrs, stream);
}

}  // namespace loom::optim
