#include "plugins/checkpoint/requests.h"

namespace loom::checkpoint {

Box checked_slice(const CheckpointTensor& t, const char* what) {
  std::string name = t.name != nullptr ? t.name : "";
  std::string at = std::string(what) + " of tensor '" + name + "': ";
  if (name.empty()) fail(Code::kInvalidArgument, std::string(what) + ": a tensor has no name");
  if (t.ndim < 0 || t.ndim > kMaxDims)
    fail(Code::kInvalidArgument, at + "rank " + std::to_string(t.ndim) + " is outside [0, 8]");
  if (t.data.ndim != t.ndim)
    fail(Code::kInvalidArgument, at + "its data has " + std::to_string(t.data.ndim) +
                                     " dimensions but the tensor " + std::to_string(t.ndim));
  if (t.data.device.type != DeviceType::kCpu)
    fail(Code::kInvalidArgument, at + "data must be in host memory (copy it to the CPU first)");
  if (dtype_size(t.data.dtype) == 0) fail(Code::kInvalidArgument, at + "data has an invalid dtype");
  Box box;
  box.ndim = t.ndim;
  for (int32_t d = 0; d < t.ndim; ++d) {
    box.start[d] = t.offset[d];
    box.size[d] = t.data.shape[d];
    if (t.offset[d] < 0 || t.data.shape[d] < 0 || t.global_shape[d] < 0 ||
        t.offset[d] + t.data.shape[d] > t.global_shape[d])
      fail(Code::kInvalidArgument, at + "slice " + box_text(box) + " (dimension " +
                                       std::to_string(d) + ") is not inside the global shape " +
                                       global_shape_text(t));
  }
  if (volume(box) > 0 && t.data.data == nullptr) fail(Code::kInvalidArgument, at + "data is null");
  return box;
}

Strided strided_of(const CheckpointTensor& t) {
  Strided s{t.data.data, t.data.dtype, t.ndim, {}, {}};
  for (int32_t d = 0; d < t.ndim; ++d) {
    s.origin[d] = t.offset[d];
    s.strides[d] = t.data.strides[d];
  }
  return s;
}

std::string global_shape_text(const CheckpointTensor& t) {
  return shape_text(t.global_shape, t.ndim < 0 || t.ndim > kMaxDims ? 0 : t.ndim);
}

}  // namespace loom::checkpoint
