// Argument checks for op kernels (header-only; nothing here crosses the boundary).
//
// A kernel library validates every OpCall against the op's contract in loom/ops.h before
// touching memory. OpArgs does the common part (counts, presence, dtype, device, packing,
// shapes) and throws loom::Error(kInvalidArgument) with a message that starts with the op's
// name and says which tensor is wrong and what was expected, e.g.
//   "rmsnorm_fwd: input 1 (weight) has shape (7), expected (C) = (8)".
// The same class serves the CPU kernels and the CUDA kernels, so both reject a bad call
// with the same words; third-party kernel libraries may use it too.
//
//   Shape check_my_op(const OpCall* call, bool shapes_only) {
//     loom::OpArgs a(call, "my_op", {"X"}, {"Y"}, shapes_only, DeviceType::kCuda);
//     const TensorView& x = a.float_in(0);
//     a.float_out(0);
//     a.numel_out(0, numel(x), "X's shape");
//     ...
//   }
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "loom/cpp/error.h"
#include "loom/kernel.h"

namespace loom {

/// True for the float storage dtypes every float op accepts (f32, bf16, f16).
inline bool is_float_dtype(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

/// "(2, 3)" of a view's shape.
inline std::string view_shape_str(const TensorView& v) {
  std::string s = "(";
  for (int32_t d = 0; d < v.ndim; ++d) s += (d ? ", " : "") + std::to_string(v.shape[d]);
  return s + ")";
}

/// "(2, 3)" of a list of extents.
inline std::string dims_str(std::initializer_list<int64_t> dims) {
  std::string s = "(";
  bool first = true;
  for (int64_t d : dims) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + ")";
}

/// The name of a device family for messages ("cpu", "cuda").
inline const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return "cuda";
  }
  return "unknown";
}

/// The checks of one call of one op, for kernels of one device family.
class OpArgs {
 public:
  /// \param call         the call to check (may be null: that fails)
  /// \param op           the op's name, first word of every message
  /// \param inputs       names of the op's inputs, in order (as loom/ops.h gives them)
  /// \param outputs      names of the op's outputs
  /// \param shapes_only  true inside a kernel's `supports`: data may be null there, so an
  ///                     optional tensor counts as present when it has dimensions
  /// \param device       the family the kernel runs on; tensors elsewhere are refused
  OpArgs(const OpCall* call, const char* op, std::initializer_list<const char*> inputs,
         std::initializer_list<const char*> outputs, bool shapes_only, DeviceType device)
      : OpArgs(call, op, std::vector<std::string>(inputs.begin(), inputs.end()),
               std::vector<std::string>(outputs.begin(), outputs.end()), shapes_only, device) {}
  /// The same for an op whose number of tensors depends on the call (adamw_step_multi's
  /// K shards): the names are built by the caller, e.g. "exp_avg[3]".
  OpArgs(const OpCall* call, const char* op, std::vector<std::string> inputs,
         std::vector<std::string> outputs, bool shapes_only, DeviceType device)
      : call_(call),
        op_(op),
        inputs_(std::move(inputs)),
        outputs_(std::move(outputs)),
        shapes_only_(shapes_only),
        device_(device) {
    if (call == nullptr) fail("the call is null");
    if (call->struct_size < sizeof(OpCall))
      fail("OpCall of " + std::to_string(call->struct_size) +
           " bytes is older than this kernel's (" + std::to_string(sizeof(OpCall)) +
           "): rebuild the caller");
    if (call->num_inputs != static_cast<int32_t>(inputs_.size()) ||
        call->num_outputs != static_cast<int32_t>(outputs_.size()))
      fail("takes " + std::to_string(inputs_.size()) + " inputs and " +
           std::to_string(outputs_.size()) + " outputs, got " + std::to_string(call->num_inputs) +
           " and " + std::to_string(call->num_outputs) + " (pass empty views for optional ones)");
    if ((call->num_inputs > 0 && call->inputs == nullptr) ||
        (call->num_outputs > 0 && call->outputs == nullptr))
      fail("inputs or outputs array is null");
  }

  /// Throws Error(code, "<op>: <what>").
  [[noreturn]] void fail(const std::string& what, Code code = Code::kInvalidArgument) const {
    throw Error(code, std::string(op_) + ": " + what);
  }

  /// Plain attributes struct A, checked for presence and size.
  template <class A>
  const A& attrs() const {
    if (call_->attrs == nullptr || call_->attrs_size != sizeof(A))
      fail("attrs must point to the op's attributes struct of " + std::to_string(sizeof(A)) +
           " bytes (got " +
           (call_->attrs == nullptr ? std::string("null")
                                    : "attrs_size " + std::to_string(call_->attrs_size)) +
           ")");
    return *static_cast<const A*>(call_->attrs);
  }
  /// Optional attributes struct A: null when the call passes none (attrs == null), else
  /// checked for size like attrs().
  template <class A>
  const A* opt_attrs() const {
    return call_->attrs == nullptr ? nullptr : &attrs<A>();
  }

  bool has_in(int i) const { return present(call_->inputs[i]); }
  bool has_out(int i) const { return present(call_->outputs[i]); }
  const TensorView& in(int i) const { return call_->inputs[i]; }
  const TensorView& out(int i) const { return call_->outputs[i]; }

  /// Required float / i32 / f32 / f64 tensors: present, on the kernel's device, contiguous,
  /// of the right dtype.
  const TensorView& float_in(int i) const { return tensor(true, i, DType::kInvalid); }
  const TensorView& i32_in(int i) const { return tensor(true, i, DType::kI32); }
  const TensorView& f32_in(int i) const { return tensor(true, i, DType::kF32); }
  const TensorView& float_out(int i) const { return tensor(false, i, DType::kInvalid); }
  const TensorView& f32_out(int i) const { return tensor(false, i, DType::kF32); }
  const TensorView& f64_in(int i) const { return tensor(true, i, DType::kF64); }
  const TensorView& f64_out(int i) const { return tensor(false, i, DType::kF64); }
  const TensorView& i32_out(int i) const { return tensor(false, i, DType::kI32); }
  /// Required float tensors whose rows may be strided: the last dimension is packed (stride
  /// 1, or extent 1) and the other strides are any non-negative values, e.g. a view of one
  /// part of a wider tensor (attention's Q, K and V as views of a fused QKV projection).
  /// Everything else as float_in / float_out. An output view must not overlap itself or
  /// another output; that is the caller's to keep.
  const TensorView& float_rows_in(int i) const { return tensor(true, i, DType::kInvalid, true); }
  const TensorView& float_rows_out(int i) const { return tensor(false, i, DType::kInvalid, true); }
  /// Required FP8 tensors (e4m3 or e5m2).
  const TensorView& fp8_in(int i) const { return tensor(true, i, kAnyFp8); }
  const TensorView& fp8_out(int i) const { return tensor(false, i, kAnyFp8); }
  const TensorView* opt_fp8_out(int i) const { return has_out(i) ? &fp8_out(i) : nullptr; }
  /// Optional ones: null when absent.
  const TensorView* opt_float_in(int i) const { return has_in(i) ? &float_in(i) : nullptr; }
  const TensorView* opt_i32_in(int i) const { return has_in(i) ? &i32_in(i) : nullptr; }
  const TensorView* opt_f32_in(int i) const { return has_in(i) ? &f32_in(i) : nullptr; }
  const TensorView* opt_float_out(int i) const { return has_out(i) ? &float_out(i) : nullptr; }
  const TensorView* opt_f32_out(int i) const { return has_out(i) ? &f32_out(i) : nullptr; }

  /// Shape checks; `expect` names the dimensions, e.g. "(N, C)".
  void shape_in(int i, std::initializer_list<int64_t> dims, const char* expect) const {
    shape(true, i, dims, expect);
  }
  void shape_out(int i, std::initializer_list<int64_t> dims, const char* expect) const {
    shape(false, i, dims, expect);
  }
  void rank_in(int i, int32_t min_ndim, const char* expect) const {
    if (in(i).ndim < min_ndim)
      fail(in_label(i) + " has shape " + view_shape_str(in(i)) + ", expected " + expect);
  }
  void rank_out(int i, int32_t min_ndim, const char* expect) const {
    if (out(i).ndim < min_ndim)
      fail(out_label(i) + " has shape " + view_shape_str(out(i)) + ", expected " + expect);
  }
  /// Same number of elements (for ops that accept any shape, e.g. elementwise).
  void numel_in(int i, int64_t n, const char* expect) const {
    if (numel(in(i)) != n)
      fail(in_label(i) + " has shape " + view_shape_str(in(i)) + " (" +
           std::to_string(numel(in(i))) + " elements), expected " + expect + " with " +
           std::to_string(n) + " elements");
  }
  void numel_out(int i, int64_t n, const char* expect) const {
    if (numel(out(i)) != n)
      fail(out_label(i) + " has shape " + view_shape_str(out(i)) + " (" +
           std::to_string(numel(out(i))) + " elements), expected " + expect + " with " +
           std::to_string(n) + " elements");
  }

  std::string in_label(int i) const {
    return "input " + std::to_string(i) + " (" + inputs_[i] + ")";
  }
  std::string out_label(int i) const {
    return "output " + std::to_string(i) + " (" + outputs_[i] + ")";
  }
  const char* op() const { return op_; }
  bool shapes_only() const { return shapes_only_; }
  DeviceType device() const { return device_; }

 private:
  bool present(const TensorView& v) const {
    // An empty optional is a view with null data and no dimensions; a zero-size tensor
    // (e.g. N == 0) may have null data and still be present.
    return v.data != nullptr || (v.ndim > 0 && (shapes_only_ || numel(v) == 0));
  }

  // Stands for "e4m3 or e5m2" in `tensor`'s `want`.
  static constexpr DType kAnyFp8 = static_cast<DType>(-1);

  // kInvalid means "any float dtype", kAnyFp8 either FP8 format.
  // `rows`: the rows may be strided (float_rows_in); else the tensor must be packed.
  const TensorView& tensor(bool input, int i, DType want, bool rows = false) const {
    const TensorView& v = input ? call_->inputs[i] : call_->outputs[i];
    std::string label = input ? in_label(i) : out_label(i);
    if (!present(v)) fail(label + " is required but empty");
    if (v.device.type != device_)
      fail(label + " is in " + device_type_name(v.device.type) + " memory: the " +
           device_type_name(device_) + " kernels take " + device_type_name(device_) +
           " tensors only");
    bool ok = want == DType::kInvalid ? is_float_dtype(v.dtype)
              : want == kAnyFp8       ? v.dtype == DType::kF8E4M3 || v.dtype == DType::kF8E5M2
                                      : v.dtype == want;
    if (!ok)
      fail(label + " has dtype " + dtype_name(v.dtype) + ", expected " +
           (want == DType::kInvalid ? std::string("a float dtype (f32, bf16, f16)")
            : want == kAnyFp8       ? std::string("an FP8 dtype (fp8_e4m3, fp8_e5m2)")
                                    : dtype_name(want)));
    if (v.ndim < 0 || v.ndim > kMaxDims) fail(label + " has ndim " + std::to_string(v.ndim));
    for (int32_t d = 0; d < v.ndim; ++d)
      if (v.shape[d] < 0) fail(label + " has a negative extent: " + view_shape_str(v));
    if (rows) {
      for (int32_t d = 0; d < v.ndim; ++d)
        if (v.strides[d] < 0)
          fail(label + " has a negative stride along dimension " + std::to_string(d) +
               ": pass a view with non-negative strides");
      if (v.ndim > 0 && v.shape[v.ndim - 1] != 1 && v.strides[v.ndim - 1] != 1)
        fail(label + " of shape " + view_shape_str(v) + " has stride " +
             std::to_string(v.strides[v.ndim - 1]) +
             " along its last dimension: its rows must be packed (stride 1)");
    } else if (!is_contiguous(v)) {
      fail(label + " of shape " + view_shape_str(v) + " is not contiguous: pass a packed tensor");
    }
    if (!shapes_only_ && v.data == nullptr && numel(v) > 0) fail(label + " has null data");
    return v;
  }

  void shape(bool input, int i, std::initializer_list<int64_t> dims, const char* expect) const {
    const TensorView& v = input ? call_->inputs[i] : call_->outputs[i];
    bool ok = v.ndim == static_cast<int32_t>(dims.size());
    int32_t d = 0;
    for (int64_t e : dims) ok = ok && v.shape[d++] == e;
    if (!ok)
      fail((input ? in_label(i) : out_label(i)) + " has shape " + view_shape_str(v) +
           ", expected " + expect + " = " + dims_str(dims));
  }

  const OpCall* call_;
  const char* op_;
  std::vector<std::string> inputs_, outputs_;
  bool shapes_only_;
  DeviceType device_;
};

/// Strides (in elements) of the rows of a (B, T, H, D) tensor whose rows are packed
/// (OpArgs::float_rows_in): row (b, t, h) starts at b * b_ + t * t_ + h * h_.
struct RowStrides {
  int64_t b_, t_, h_;
  /// Offset of row (b, t, h).
  int64_t at(int64_t b, int64_t t, int64_t h) const { return b * b_ + t * t_ + h * h_; }
  /// The strides of a packed (B, T, H, D) tensor.
  static RowStrides packed(int64_t t, int64_t h, int64_t d) { return {t * h * d, h * d, d}; }
  /// Those of `v`, a 4-D view whose last dimension is packed.
  static RowStrides of(const TensorView& v) { return {v.strides[0], v.strides[1], v.strides[2]}; }
};

/// Runs `check` and reports whether it passed (for a kernel's `supports`: never throws).
template <class F>
bool check_passes(F&& check) noexcept {
  try {
    check();
    return true;
  } catch (...) {
    return false;
  }
}

/// Rows of a (..., C) tensor: every dimension but the last.
inline int64_t rows_of(const TensorView& v) {
  int64_t n = 1;
  for (int32_t d = 0; d + 1 < v.ndim; ++d) n *= v.shape[d];
  return n;
}
/// Last extent of a tensor (1 for a scalar).
inline int64_t last_dim(const TensorView& v) { return v.ndim > 0 ? v.shape[v.ndim - 1] : 1; }

}  // namespace loom
