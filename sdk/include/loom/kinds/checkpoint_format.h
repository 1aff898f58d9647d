// kinds::kCheckpointFormat: how a checkpoint is laid out on disk (sharded, safetensors).
//
// The core enumerates what is saved (tensors with their global shape and this rank's
// slice, plus JSON metadata) and calls the format, which owns the files inside the
// directory it is given. The core creates that directory under a temporary name, renames
// it into place once every rank's save returned, and then updates the `latest` pointer;
// the format's duty is that every file it wrote is complete and fsync'ed when `save`
// returns, and that `load` detects any damage (checksums) and names the file and tensor.
//
// Tensor names (the core's convention, which formats may rely on):
//   "model.<parameter>"          model weights, e.g. "model.decoder.layers.3.mlp.linear_fc1.weight"
//   "optim.master.<parameter>"   f32 master weights (only when parameters are not f32)
//   "optim.<state>.<parameter>"  optimizer states, e.g.
//   "optim.exp_avg.embedding.word_embeddings.weight"
//
// The metadata JSON (object) the core passes to `save` and expects back from `metadata`:
//   "format_version": 1
//   "iteration":      optimizer steps taken
//   "spec":           the resolved spec of the run that saved it (its "model" node is what
//                     the weights belong to)
//   "tensors":        {name: {"dtype": "f32"|"bf16"|"f16"|..., "shape": [global shape]}}
//                     every tensor in the checkpoint; this is how a reader lists them
//   "trainer":        loss scale, data position, RNG description, ... (core-private)
//   "plugins":        [{"name", "version", "hash"}] loaded by the saving run
//   "loom_version":   the saving loom's version
// A format may add keys of its own under "format". A format that cannot keep some tensors
// (safetensors keeps model weights only) drops them from "tensors" in what `metadata`
// returns, and a format that reads files written by another program (a Hugging Face
// directory) synthesises "spec"/"model" and "tensors" from that program's files.
#pragma once

#include <stdint.h>

#include "loom/object.h"
#include "loom/status.h"
#include "loom/types.h"

namespace loom {

/// One tensor, or this rank's slice of it.
struct CheckpointTensor {
  uint32_t struct_size;
  const char* name;  ///< global name, e.g. "model.decoder.layers.3.mlp.linear_fc1.weight"
  int32_t ndim;
  int64_t global_shape[kMaxDims];  ///< the whole tensor
  int64_t offset[kMaxDims];        ///< where this slice starts in the whole tensor
  TensorView data;                 ///< the slice (its shape is the slice's shape); host memory
};

class ICheckpointFormat : public IObject {
 public:
  /// Writes this rank's part of a checkpoint into `dir` (created, empty, by the core).
  /// Every file is complete and fsync'ed on return. Rank 0 also writes the metadata.
  /// \param dir            target directory
  /// \param tensors        [count] tensors or slices owned by this rank (host memory)
  /// \param metadata_json  the metadata object described above, as JSON text
  /// \param rank, world    this rank and the number of ranks writing
  virtual Status save(StringView dir, const CheckpointTensor* tensors, int64_t count,
                      StringView metadata_json, int32_t rank, int32_t world) noexcept = 0;
  /// Reads into `tensors`: each entry names a tensor and the slice wanted (global_shape,
  /// offset, data.shape), and `data` points at host memory to fill, in data.dtype (the
  /// format converts between f32, bf16 and f16). The slice may differ from what any one
  /// rank saved (another parallel layout): it is assembled from every overlapping piece.
  /// Fails with kDataLoss naming the file and the tensor on a checksum mismatch or a
  /// short file, kNotFound for a tensor the checkpoint lacks, kInvalidArgument when the
  /// global shape differs from the stored one (both shapes in the message).
  virtual Status load(StringView dir, CheckpointTensor* tensors, int64_t count) noexcept = 0;
  /// Reads and verifies the metadata JSON. The returned text is valid until the next call
  /// on this object.
  virtual Status metadata(StringView dir, StringView* metadata_json) noexcept = 0;
  /// True when `dir` holds a checkpoint in this format (a cheap look at file names or
  /// magic numbers; no verification).
  virtual bool recognizes(StringView dir) noexcept = 0;

 protected:
  ~ICheckpointFormat() = default;
};

}  // namespace loom
