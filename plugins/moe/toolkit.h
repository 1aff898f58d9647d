// The SDK's module toolkit (loom/cpp/nn.h), used unqualified inside the moe plugin, and the
// few host-side helpers the plugin's routing needs (the token counts that size every
// exchange live on the host, as in Megatron-Core's dropless dispatchers).
#pragma once

#include <loom/cpp/nn.h>

#include <cstring>
#include <vector>

namespace loom::moe {

using namespace loom::nn;  // NOLINT(build/namespaces): the plugin is written on the toolkit

/// Copies a whole tensor into host memory (`out` resized to its elements).
template <class T>
void to_host(IHost& host, const TensorView& v, std::vector<T>& out) {
  out.resize(static_cast<size_t>(numel(v)));
  if (out.empty()) return;
  if (dtype_size(v.dtype) != sizeof(T))
    fail(Code::kInternal, "moe: reading a tensor of another element size");
  throw_if_error(host.copy(kCpu, out.data(), v.device, v.data, out.size() * sizeof(T)),
                 "moe: reading routing data from the device");
}

/// Copies host values into a tensor of the same number of elements.
template <class T>
void from_host(IHost& host, const std::vector<T>& in, const TensorView& v) {
  if (in.empty()) return;
  throw_if_error(host.copy(v.device, v.data, kCpu, in.data(), in.size() * sizeof(T)),
                 "moe: writing routing data to the device");
}

/// A new activation of ctx holding host values (i32 or f32), shaped `shape`.
template <class T>
TensorView upload(IForwardContext& ctx, IHost& host, DType dtype, std::vector<int64_t> shape,
                  const std::vector<T>& values, Device device) {
  TensorView v = allocate_shape(ctx, dtype, shape, device);
  from_host(host, values, v);
  return v;
}

}  // namespace loom::moe
