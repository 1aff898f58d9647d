// A parameter's slice of the whole tensor, as checkpoints name it: what one rank writes
// (SaveTensor) and what it asks a checkpoint for (CheckpointTensor), in the whole tensor's
// coordinates (this rank's slice along the split dimension, SplitRanks), so that a
// checkpoint loads into another layout; a padded parameter's valid rows only, so that it
// loads into another padding too.
#pragma once

#include <string>
#include <vector>

#include "core/checkpoint/checkpoint_writer.h"
#include "core/runtime/parameters.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds/checkpoint_format.h"

namespace loom::core {

/// Tensor `name` holding `p`'s slice on this rank (`ranks`), from host memory `data` of
/// `dtype`, appended to `out`. Padding rows (Parameter::valid_rows) are not saved: the
/// tensor holds the valid rows, and a rank whose slice is padding whole appends nothing.
inline void append_save_tensor(std::vector<SaveTensor>& out, std::string name, const Parameter& p,
                               const SplitRanks& ranks, const void* data, DType dtype) {
  const int64_t rows = p.local_valid_rows(ranks);
  if (rows == 0) return;
  SaveTensor t{std::move(name), dtype, {}, data, {}, {}};
  for (int32_t d = 0; d < p.info.ndim; ++d) {
    t.shape.push_back(d == 0 ? p.valid_rows() : p.info.global_shape[d]);
    t.local.push_back(d == 0 ? rows : p.info.shape[d]);
    t.offset.push_back(p.slice_start(d, ranks));
  }
  out.push_back(std::move(t));
}

/// Whether this rank's slice of `p` holds any valid rows (a request_of it reads something).
inline bool holds_values(const Parameter& p, const SplitRanks& ranks) {
  return p.local_valid_rows(ranks) > 0;
}

/// A request for `p`'s slice on this rank (`ranks`) of tensor `name` (kept alive by the
/// caller), read into `into` (this rank's whole slice, of `dtype`) on `device`: the valid
/// rows only (padding rows of `into` are left as they are), so only for a slice that
/// holds_values.
inline CheckpointTensor request_of(const std::string& name, const Parameter& p, const SplitRanks& ranks,
                                   void* into, DType dtype, Device device) {
  CheckpointTensor t{};
  t.struct_size = sizeof(CheckpointTensor);
  t.name = name.c_str();
  t.ndim = p.info.ndim;
  std::vector<int64_t> local(p.info.shape, p.info.shape + p.info.ndim);
  for (int32_t d = 0; d < p.info.ndim; ++d) {
    t.global_shape[d] = d == 0 ? p.valid_rows() : p.info.global_shape[d];
    t.offset[d] = p.slice_start(d, ranks);
  }
  if (p.info.ndim > 0) local[0] = p.local_valid_rows(ranks);
  t.data = make_view(into, dtype, local.data(), t.ndim, device);
  return t;
}

}  // namespace loom::core
