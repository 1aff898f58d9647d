// The step kernel of an optimizer ("adamw_step", "sgd_step"), resolved once, when the
// optimizer is built, for every gradient dtype it may be handed: f32 (gradients accumulate
// in f32) and the parameter dtype when that is bf16 or f16.
#pragma once

#include <loom/cpp/tensor.h>
#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <string>

namespace loom::optim {

class StepKernels {
 public:
  StepKernels() = default;
  /// Resolves `op` through the host on the device named by the option "device" ("cpu" or
  /// "cuda", cpu when absent) for f32 and for the option "params_dtype" (f32 when absent).
  /// Throws kInvalidArgument for a bad option and the host's error (naming the op) when no
  /// kernel serves it.
  StepKernels(IHost& host, const char* op, const nlohmann::json& options);

  /// The device family the kernels run on.
  DeviceType device() const { return device_; }

  /// The kernel for gradients of `dtype`; throws kInvalidArgument when none was resolved.
  const Kernel& for_grad(DType dtype) const;

  /// Checks one update's tensors: master f32 (n) on the kernels' device, grad (n) of a
  /// resolved dtype, and `states` f32 (n) each. Throws kInvalidArgument naming the tensor.
  void check(const TensorView* master, const TensorView* grad, const TensorView* states,
             int32_t state_count) const;

 private:
  std::string op_;
  DeviceType device_ = DeviceType::kCpu;
  DType params_dtype_ = DType::kF32;
  Kernel f32_;
  Kernel params_;  ///< resolved only when params_dtype is not f32
};

/// Checks the per-step hyper-parameters: step >= 1, lr and weight_decay finite and >= 0,
/// grad_scale finite. Throws kInvalidArgument prefixed with `who`.
void check_step(const OptimizerStep* hp, const char* who);

}  // namespace loom::optim
