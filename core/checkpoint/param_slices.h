// A parameter's slice of the whole tensor, as checkpoints name it: what one rank writes
// (SaveTensor) and what it asks a checkpoint for (CheckpointTensor), in the whole tensor's
// coordinates (this rank's slice along the split dimension, SplitRanks), so that a
// checkpoint loads into another layout.
#pragma once

#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_writer.h"
#include "core/runtime/parameters.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds/checkpoint_format.h"

namespace loom::core {

/// Tensor `name` holding `p`'s slice on this rank (`ranks`), from host memory `data` of `dtype`.
inline SaveTensor save_tensor_of(std::string name, const Parameter& p, const SplitRanks& ranks,
                                 const void* data, DType dtype) {
  SaveTensor t{std::move(name), dtype, {}, data, {}, {}};
  for (int32_t d = 0; d < p.info.ndim; ++d) {
    t.shape.push_back(p.info.global_shape[d]);
    t.local.push_back(p.info.shape[d]);
    t.offset.push_back(p.slice_start(d, ranks));
  }
  return t;
}

/// A request for `p`'s slice on this rank (`ranks`) of tensor `name` (kept alive by the caller), read
/// as f32 into `into` on `device`.
inline CheckpointTensor request_of(const std::string& name, const Parameter& p, const SplitRanks& ranks,
                                   void* into, Device device) {
  CheckpointTensor t{};
  t.struct_size = sizeof(CheckpointTensor);
  t.name = name.c_str();
  t.ndim = p.info.ndim;
  for (int32_t d = 0; d < p.info.ndim; ++d) {
    t.global_shape[d] = p.info.global_shape[d];
    t.offset[d] = p.slice_start(d, ranks);
  }
  t.data = make_view(into, DType::kF32, p.info.shape, t.ndim, device);
  return t;
}

}  // namespace loom::core
