// f64 operands of the float ops that take them (gemm, add, cast, moe_topk, moe_topk_bwd: the
// fp64 router's path, Megatron's --moe-router-dtype fp64). OpArgs (loom/cpp/op_args.h) knows
// the float storage dtypes (f32, bf16, f16) and f64 outputs; these add "a float dtype or f64"
// for inputs and outputs with the same checks (present, on the kernel's device, packed,
// non-null data) and the same words (header-only).
#pragma once

#include <string>

#include "loom/cpp/op_args.h"

namespace loom::op_checks {

/// True for the dtypes of the ops that also take f64: f32, bf16, f16, f64.
inline bool is_float_or_f64(DType t) { return t == DType::kF64 || is_float_dtype(t); }

namespace detail {

inline const TensorView& float_or_f64(const OpArgs& a, bool input, int i) {
  const TensorView& v = input ? a.in(i) : a.out(i);
  const std::string label = input ? a.in_label(i) : a.out_label(i);
  const bool present = input ? a.has_in(i) : a.has_out(i);
  if (!present) a.fail(label + " is required but empty");
  if (v.dtype != DType::kF64) {
    if (!is_float_dtype(v.dtype))
      a.fail(label + " has dtype " + dtype_name(v.dtype) +
             ", expected a float dtype (f32, bf16, f16) or f64");
    return input ? a.float_in(i) : a.float_out(i);  // the float dtypes' checks
  }
  if (v.device.type != a.device())
    a.fail(label + " is in " + device_type_name(v.device.type) + " memory: the " +
           device_type_name(a.device()) + " kernels take " + device_type_name(a.device()) +
           " tensors only");
  if (v.ndim < 0 || v.ndim > kMaxDims) a.fail(label + " has ndim " + std::to_string(v.ndim));
  for (int32_t d = 0; d < v.ndim; ++d)
    if (v.shape[d] < 0) a.fail(label + " has a negative extent: " + view_shape_str(v));
  if (!is_contiguous(v))
    a.fail(label + " of shape " + view_shape_str(v) + " is not contiguous: pass a packed tensor");
  if (!a.shapes_only() && v.data == nullptr && numel(v) > 0) a.fail(label + " has null data");
  return v;
}

}  // namespace detail

/// Required input / output of a float dtype (f32, bf16, f16) or f64.
inline const TensorView& float_or_f64_in(const OpArgs& a, int i) {
  return detail::float_or_f64(a, true, i);
}
inline const TensorView& float_or_f64_out(const OpArgs& a, int i) {
  return detail::float_or_f64(a, false, i);
}

/// Required input / output of exactly `dtype` (f32 or f64: the router ops' two precisions).
inline const TensorView& dtype_in(const OpArgs& a, int i, DType dtype) {
  const TensorView& v = float_or_f64_in(a, i);
  if (v.dtype != dtype)
    a.fail(a.in_label(i) + " has dtype " + dtype_name(v.dtype) + ", expected " + dtype_name(dtype));
  return v;
}
inline const TensorView& dtype_out(const OpArgs& a, int i, DType dtype) {
  const TensorView& v = float_or_f64_out(a, i);
  if (v.dtype != dtype)
    a.fail(a.out_label(i) + " has dtype " + dtype_name(v.dtype) + ", expected " +
           dtype_name(dtype));
  return v;
}
/// Optional ones: null when absent.
inline const TensorView* opt_dtype_in(const OpArgs& a, int i, DType dtype) {
  return a.has_in(i) ? &dtype_in(a, i, dtype) : nullptr;
}
inline const TensorView* opt_dtype_out(const OpArgs& a, int i, DType dtype) {
  return a.has_out(i) ? &dtype_out(a, i, dtype) : nullptr;
}

}  // namespace loom::op_checks
