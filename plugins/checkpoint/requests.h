// Checking the CheckpointTensor entries the core hands to save and load: a name, a rank
// within kMaxDims, a slice inside the global shape, and host memory of that slice's shape.
#pragma once

#include <loom/sdk.h>

#include <string>

#include "plugins/checkpoint/tensor_copy.h"

namespace loom::checkpoint {

/// The slice of `t` as a box in global coordinates, after checking `t` (see above); a bad
/// entry is Error(kInvalidArgument) naming the tensor and what is wrong. `what` is "save"
/// or "load", for the message.
Box checked_slice(const CheckpointTensor& t, const char* what);

/// `t.data` as one side of copy_region (its element [0, ...] at the slice's start).
Strided strided_of(const CheckpointTensor& t);

/// `global_shape` of `t` as text, "[4, 16]".
std::string global_shape_text(const CheckpointTensor& t);

}  // namespace loom::checkpoint
