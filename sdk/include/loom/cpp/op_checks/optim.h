// Argument checks of the optimizer steps of loom/ops.h (adamw_step, adamw_step_multi,
// sgd_step, grad_norm_clip), shared by every kernel library so that the CPU and CUDA kernels
// reject a bad call with the same words (header-only; see loom/cpp/op_args.h). The steps'
// checks return n, the elements of the shard (adamw_step_multi: of every shard together).
//   call:         the call
//   shapes_only:  true inside `supports` (data may be null)
//   device:       the device family of the kernel
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "loom/cpp/kernel_descs.h"
#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

namespace detail {

/// One AdamW shard of a call: grad = input `in`, master / exp_avg / exp_avg_sq / param =
/// outputs [out, out + 4). `grad_shape` names the grad in messages ("grad's shape").
inline int64_t check_adamw_shard(const OpArgs& a, int in, int out, const std::string& grad_shape) {
  int64_t n = numel(a.float_in(in));
  a.f32_out(out);
  a.numel_out(out, n, grad_shape.c_str());
  for (int i = out + 1; i < out + 3; ++i) {  // the moments: f32, or bf16 (ABI 1.15)
    DType t = a.float_out(i).dtype;
    if (t != DType::kF32 && t != DType::kBF16)
      a.fail(a.out_label(i) + " has dtype " + dtype_name(t) +
             ", expected f32 or bf16 (a moment is kept in f32, or in bf16 as Megatron's "
             "precision-aware optimizer keeps it)");
    a.numel_out(i, n, grad_shape.c_str());
  }
  if (a.opt_float_out(out + 3)) a.numel_out(out + 3, n, grad_shape.c_str());
  return n;
}

inline void check_step(const OpArgs& a, int64_t step) {
  if (step < 1) a.fail("step = " + std::to_string(step) + " must be >= 1 (1-based)");
}

/// Input `i`, the step scalars (loom/ops/optim.h), when the call has it.
inline void check_step_scalars(const OpArgs& a, const OpCall* call, int i) {
  if (call->num_inputs <= i) return;
  a.f64_in(i);
  a.shape_in(i, {ops::kStepScalarCount}, "(kStepScalarCount)");
}

/// The input names of a step op with one gradient: "grad", and "step_scalars" when the call
/// has a second input.
inline std::vector<std::string> step_inputs(const OpCall* call) {
  std::vector<std::string> in{"grad"};
  if (call != nullptr && call->struct_size >= sizeof(OpCall) && call->num_inputs == 2)
    in.push_back("step_scalars");
  return in;
}

}  // namespace detail

/// The step scalars of an optimizer call (input `i`, loom/ops/optim.h) where the kernel runs,
/// or null when the call has none. Call after the op's check.
inline const double* step_scalars(const OpCall* call, int i) {
  return call->num_inputs > i ? static_cast<const double*>(call->inputs[i].data) : nullptr;
}

/// adamw_step: AdamWAttrs (step >= 1), grad float (n), step scalars f64 (kStepScalarCount)
/// or none, master f32 (n), exp_avg / exp_avg_sq f32 or bf16 (n), param float (n) or empty.
inline int64_t check_adamw_step(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kAdamWStep, detail::step_inputs(call),
           {"master", "exp_avg", "exp_avg_sq", "param"}, shapes_only, device);
  detail::check_step(a, a.attrs<ops::AdamWAttrs>().step);
  detail::check_step_scalars(a, call, 1);
  return detail::check_adamw_shard(a, 0, 0, "grad's shape");
}

/// adamw_step_multi: AdamWMultiAttrs (step >= 1, count == K >= 1, weight_decay not null),
/// K grads of one float dtype and 4K outputs, shard i as adamw_step's (input i, outputs
/// [4i, 4i + 4)). Messages name the shard's tensors "grad[i]", "exp_avg[i]", ... Returns
/// the elements of all shards.
inline int64_t check_adamw_step_multi(const OpCall* call, bool shapes_only, DeviceType device) {
  const std::string op = ops::kAdamWStepMulti;
  // The counts come first: the names below are built from them. K shards take K grads and
  // 4K outputs; a (K + 1)-th input is the step scalars.
  const bool counted = call != nullptr && call->struct_size >= sizeof(OpCall);
  int32_t k = counted ? call->num_inputs : 0;
  bool scalars = false;
  if (counted) {
    if (k >= 2 && call->num_outputs == 4 * static_cast<int64_t>(k - 1)) {
      --k;
      scalars = true;
    }
    if (k < 1)
      throw Error(Code::kInvalidArgument,
                  op + ": needs at least one shard (got " + std::to_string(k) +
                      " grads): skip the call when there is nothing to update");
    if (call->num_outputs != 4 * static_cast<int64_t>(k))
      throw Error(Code::kInvalidArgument,
                  op + ": " + std::to_string(k) + " grads (inputs) need 4 * " + std::to_string(k) +
                      " = " + std::to_string(4 * static_cast<int64_t>(k)) +
                      " outputs (master, exp_avg, exp_avg_sq and param or an empty view, per "
                      "shard), got " +
                      std::to_string(call->num_outputs));
  }
  std::vector<std::string> in, out;
  for (int32_t i = 0; i < k; ++i) {
    std::string at = "[" + std::to_string(i) + "]";
    in.push_back("grad" + at);
    for (const char* name : {"master", "exp_avg", "exp_avg_sq", "param"}) out.push_back(name + at);
  }
  if (scalars) in.push_back("step_scalars");
  OpArgs a(call, ops::kAdamWStepMulti, std::move(in), std::move(out), shapes_only, device);
  const ops::AdamWMultiAttrs& at = a.attrs<ops::AdamWMultiAttrs>();
  detail::check_step(a, at.step);
  if (at.count != k)
    a.fail("attrs count = " + std::to_string(at.count) + " but the call has " + std::to_string(k) +
           " grads (inputs): set count to the number of shards");
  if (scalars) detail::check_step_scalars(a, call, k);
  if (at.weight_decay == nullptr)
    a.fail(
        "attrs weight_decay is null: point it to count floats in host memory, one per shard "
        "(0 for a shard without weight decay)");
  int64_t total = 0;
  for (int32_t i = 0; i < k; ++i) {
    std::string grad = "grad[" + std::to_string(i) + "]";
    total += detail::check_adamw_shard(a, i, 4 * i, grad + "'s shape");
    if (a.in(i).dtype != a.in(0).dtype)
      a.fail(a.in_label(i) + " has dtype " + dtype_name(a.in(i).dtype) + " but grad[0] has " +
             dtype_name(a.in(0).dtype) +
             ": the op is keyed on one gradient dtype, call it once per dtype");
  }
  return total;
}

/// sgd_step: SgdAttrs (step >= 1), grad float (n), master f32 (n), momentum buffer f32 (n)
/// (required when momentum != 0), param float (n) or empty.
inline int64_t check_sgd_step(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kSgdStep, detail::step_inputs(call), {"master", "momentum_buffer", "param"},
           shapes_only, device);
  const ops::SgdAttrs& at = a.attrs<ops::SgdAttrs>();
  detail::check_step(a, at.step);
  detail::check_step_scalars(a, call, 1);
  int64_t n = numel(a.float_in(0));
  a.f32_out(0);
  a.numel_out(0, n, "grad's shape");
  if (at.momentum != 0.0f) {
    a.f32_out(1);
    a.numel_out(1, n, "grad's shape");
  }
  if (a.opt_float_out(2)) a.numel_out(2, n, "grad's shape");
  return n;
}

/// grad_norm_clip: GradNormClipAttrs (max_norm >= 0), sumsq f64 (1), step scalars f64
/// (kStepScalarCount).
inline void check_grad_norm_clip(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kGradNormClip, {"sumsq"}, {"step_scalars"}, shapes_only, device);
  const ops::GradNormClipAttrs& at = a.attrs<ops::GradNormClipAttrs>();
  if (!(at.max_norm >= 0))
    a.fail("max_norm = " + std::to_string(at.max_norm) + " must be >= 0 (0: no clipping)");
  a.f64_in(0);
  a.shape_in(0, {1}, "(1)");
  a.f64_out(0);
  a.shape_out(0, {ops::kStepScalarCount}, "(kStepScalarCount)");
}

/// The cost of an optimizer step with `flops` floating-point operations: io_cost (every input
/// read, every output written) plus the reads of the states the step updates in place, which
/// io_cost does not see: each shard's outputs but its last (adamw_step and adamw_step_multi:
/// master, exp_avg, exp_avg_sq of 4; sgd_step: master and momentum buffer of 3; the last is
/// the param copy, written only).
/// \param outputs_per_shard  4 for the AdamW steps, 3 for sgd_step
inline OpCost step_cost(const OpCall* call, double flops, int outputs_per_shard) {
  OpCost c = io_cost(call, flops);
  for (int32_t i = 0; i < call->num_outputs; ++i)
    if (i % outputs_per_shard != outputs_per_shard - 1)
      c.bytes_read += static_cast<double>(numel(call->outputs[i])) *
                      static_cast<double>(dtype_size(call->outputs[i].dtype));
  return c;
}

}  // namespace loom::op_checks
