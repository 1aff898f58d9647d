// kinds::kCheckpointFormat: how a checkpoint is laid out on disk (sharded, safetensors).
//
// The core enumerates what is saved (tensors with their global shape and this rank's
// slice, plus JSON metadata) and calls the format, which owns the files. Atomicity (write
// under a temporary name, fsync, rename) is the format's duty; the core updates `latest`.
#pragma once

#include <stdint.h>

#include "loom/object.h"
#include "loom/status.h"
#include "loom/types.h"

namespace loom {

/// One tensor, or this rank's slice of it.
struct CheckpointTensor {
  uint32_t struct_size;
  const char* name;  ///< global name, e.g. "model.layers.3.mlp.fc1.weight"
  int32_t ndim;
  int64_t global_shape[kMaxDims];  ///< the whole tensor
  int64_t offset[kMaxDims];        ///< where this slice starts in the whole tensor
  TensorView data;                 ///< the slice (its shape is the slice's shape)
};

class ICheckpointFormat : public IObject {
 public:
  /// Writes this rank's part of a checkpoint into `dir` (created by the core).
  /// \param dir            target directory
  /// \param tensors        [count] tensors or slices owned by this rank
  /// \param metadata_json  iteration, spec, RNG, data position, plugins: JSON text
  /// \param rank, world    this rank and the number of ranks writing
  virtual Status save(StringView dir, const CheckpointTensor* tensors, int64_t count,
                      StringView metadata_json, int32_t rank, int32_t world) noexcept = 0;
  /// Reads into `tensors`: each entry names a tensor and the slice wanted (global_shape,
  /// offset, data.shape), and `data` points at memory to fill. Fails naming the file and
  /// the tensor on a checksum or shape mismatch.
  virtual Status load(StringView dir, CheckpointTensor* tensors, int64_t count) noexcept = 0;
  /// Reads the metadata JSON. The returned text is valid until the next call.
  virtual Status metadata(StringView dir, StringView* metadata_json) noexcept = 0;

 protected:
  ~ICheckpointFormat() = default;
};

}  // namespace loom
