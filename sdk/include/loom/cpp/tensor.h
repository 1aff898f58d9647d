// Tensor views and kernel calls in ordinary C++: build views of contiguous memory, take
// activations from a forward context, and resolve a kernel once and call it many times.
//
//   loom::Kernel gemm(host, loom::ops::kGemm, device, DType::kF32);   // once, when built
//   loom::ops::GemmAttrs attrs{0, 1, 1.f, 0.f};
//   gemm({x, w}, {y}, attrs);                                          // every step
#pragma once

#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "loom/cpp/error.h"
#include "loom/host.h"
#include "loom/kernel.h"
#include "loom/kinds/module.h"
#include "loom/ops.h"

namespace loom {

/// The CPU device.
inline constexpr Device kCpu{DeviceType::kCpu, 0};

/// A contiguous view of `data` with `shape` (at most kMaxDims entries).
inline TensorView make_view(void* data, DType dtype, const int64_t* shape, int32_t ndim,
                            Device device = kCpu) {
  if (ndim < 0 || ndim > kMaxDims) fail(Code::kInvalidArgument, "tensor rank out of range");
  TensorView v{};
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = ndim;
  int64_t stride = 1;
  for (int32_t i = ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = stride;
    stride *= shape[i];
  }
  return v;
}
inline TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            Device device = kCpu) {
  return make_view(data, dtype, shape.begin(), static_cast<int32_t>(shape.size()), device);
}

/// An absent optional tensor (data == null).
inline TensorView empty_view() { return TensorView{}; }

/// True when `view` is present (data != null).
inline bool present(const TensorView& view) { return view.data != nullptr; }

/// The same memory seen with another shape (same element count; the view must be
/// contiguous).
inline TensorView reshape(const TensorView& view, std::initializer_list<int64_t> shape) {
  TensorView out = make_view(view.data, view.dtype, shape, view.device);
  if (numel(out) != numel(view)) fail(Code::kInvalidArgument, "reshape: element count differs");
  return out;
}

/// Bytes of a contiguous view.
inline size_t nbytes(const TensorView& view) {
  return static_cast<size_t>(numel(view)) * dtype_size(view.dtype);
}

/// Shape as text, "(2, 3, 4)", for messages.
inline std::string shape_string(const TensorView& view) {
  std::string s = "(";
  for (int32_t i = 0; i < view.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(view.shape[i]);
  }
  return s + ")";
}

/// Allocates a contiguous activation from the forward context (lives until the context is
/// released, or until `release` below).
inline TensorView allocate(IForwardContext& ctx, DType dtype, std::initializer_list<int64_t> shape,
                           Device device = kCpu) {
  TensorView out{};
  throw_if_error(
      ctx.allocate(dtype, static_cast<int32_t>(shape.size()), shape.begin(), device, &out));
  return out;
}

/// Hands `tensor` (memory of ctx.allocate that the caller is done with) back to the
/// context: freed once nothing saved refers to it. Does nothing for an empty view or on a
/// context older than forward_context 1.3 (the memory then lives until the context is
/// released). Throws when the context refuses (released twice, not its memory).
inline void release(IForwardContext& ctx, const TensorView& tensor) {
  if (!present(tensor) || ctx.interface_info().minor < 3) return;
  throw_if_error(ctx.release(&tensor));
}

/// Forgets what `owner` saved in `ctx` (after its backward); a no-op on a context older than
/// forward_context 1.3.
inline void drop_saved(IForwardContext& ctx, const void* owner) {
  if (ctx.interface_info().minor >= 3) ctx.drop_saved(owner);
}

/// A kernel resolved once through the host; call it with views and an attrs struct.
class Kernel {
 public:
  Kernel() = default;
  /// Resolves `op` for (device, dtype); throws with the op's name when no kernel serves it.
  Kernel(IHost& host, const char* op, Device device, DType dtype, const OpCall* example = nullptr)
      : host_(&host) {
    throw_if_error(host.find_kernel(make_string_view(op), device.type, dtype, example, &desc_));
  }
  /// Resolves `op` when a kernel serves it, else returns an unresolved Kernel (false): for an
  /// op a module can do without, such as a fused one with an unfused fallback. "Not served"
  /// is the host's kNotFound: no loaded library provides the op for (device, dtype), the
  /// registered kernels decline `example`, or the spec pins the op to "none"
  /// (/kernels/pin). Any other failure throws.
  static Kernel optional(IHost& host, const char* op, Device device, DType dtype,
                         const OpCall* example = nullptr) {
    Kernel k;
    Status status = host.find_kernel(make_string_view(op), device.type, dtype, example, &k.desc_);
    if (status.code == Code::kNotFound) {
      take_message(&status);
      return Kernel();
    }
    throw_if_error(status);
    k.host_ = &host;
    return k;
  }
  /// True when resolved.
  explicit operator bool() const { return desc_.fn != nullptr; }
  /// The chosen kernel's name ("cpu.fast").
  const char* name() const { return desc_.name; }

  /// Runs the op; throws on a failed status. At most kMaxListOutputs outputs: an op with
  /// more views (adamw_step_multi) goes through run().
  template <class Attrs>
  void operator()(std::initializer_list<TensorView> inputs,
                  std::initializer_list<TensorView> outputs, const Attrs& attrs,
                  void* stream = nullptr) const {
    call_list(inputs, outputs, &attrs, sizeof(Attrs), stream);
  }
  void operator()(std::initializer_list<TensorView> inputs,
                  std::initializer_list<TensorView> outputs, void* stream = nullptr) const {
    call_list(inputs, outputs, nullptr, 0, stream);
  }
  /// Runs the op on arrays of views of any length; `outputs` is handed to the kernel as the
  /// call's output array (a kernel writes through the views' data, never into the array).
  template <class Attrs>
  void run(std::span<const TensorView> inputs, std::span<TensorView> outputs, const Attrs& attrs,
           void* stream = nullptr) const {
    call(inputs.data(), static_cast<int32_t>(inputs.size()), outputs.data(),
         static_cast<int32_t>(outputs.size()), &attrs, sizeof(Attrs), stream);
  }

  /// The most outputs the initializer-list call operator takes.
  static constexpr int32_t kMaxListOutputs = 16;

 private:
  void call_list(std::initializer_list<TensorView> inputs,
                 std::initializer_list<TensorView> outputs, const void* attrs, uint64_t attrs_size,
                 void* stream) const {
    if (outputs.size() > static_cast<size_t>(kMaxListOutputs))
      fail(Code::kInvalidArgument, std::string(desc_.op != nullptr ? desc_.op : "kernel") +
                                       ": more than 16 outputs in a list: use Kernel::run");
    // OpCall::outputs is not const; the list's own array is, so the views are copied.
    TensorView outs[kMaxListOutputs];
    int32_t n_out = 0;
    for (const TensorView& v : outputs) outs[n_out++] = v;
    call(inputs.begin(), static_cast<int32_t>(inputs.size()), outs, n_out, attrs, attrs_size,
         stream);
  }
  void call(const TensorView* inputs, int32_t n_in, TensorView* outs, int32_t n_out,
            const void* attrs, uint64_t attrs_size, void* stream) const {
    if (desc_.fn == nullptr)
      fail(Code::kFailedPrecondition, "kernel called before it was resolved");
    OpCall call{sizeof(OpCall), inputs, n_in, outs, n_out, attrs, attrs_size, stream, nullptr, 0};
    // Scratch the kernel asks for (KernelDesc::workspace), from the host's allocator on the
    // device of the call's first tensor; freed right after the call, which is safe on a
    // device because later work on the same stream is ordered after this kernel.
    Device device = n_out > 0 ? outs[0].device : n_in > 0 ? inputs[0].device : kCpu;
    uint64_t bytes = desc_.workspace != nullptr ? desc_.workspace(&call) : 0;
    if (bytes > 0) {
      if (host_ == nullptr)
        fail(Code::kFailedPrecondition, "kernel needs a workspace but has no host to allocate it");
      throw_if_error(host_->allocate(device, bytes, 256, &call.workspace));
      call.workspace_bytes = bytes;
    }
    Status status = desc_.fn(&call);
    if (call.workspace != nullptr) host_->deallocate(device, call.workspace);
    throw_if_error(status);
  }
  IHost* host_ = nullptr;
  KernelDesc desc_{};
};

}  // namespace loom
