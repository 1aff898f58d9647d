// The files of a sharded checkpoint and the per-rank index that lists what each .bin holds.
//
//   DIR/metadata.json         rank 0: {"format": "loom-sharded", "version": 1, "world": W,
//                             "loom": <the core's metadata object>, "checksum": ...}
//   DIR/shards/rank_NNNNN.bin raw little-endian tensor bytes, each tensor 64-byte aligned
//   DIR/shards/rank_NNNNN.json {"format": "loom-sharded-index", "version": 1, "rank", "world",
//                             "bin": "rank_NNNNN.bin", "bin_size", "tensors": [entry...],
//                             "checksum": ...}
// An entry: {"name", "dtype", "global_shape", "offset" (slice start), "shape" (slice),
// "byte_offset" (in the .bin), "nbytes", "crc32c" (of those bytes, 8 hex digits)}.
// Both JSON files are sealed (sealed_json.h).
#pragma once

#include <loom/sdk.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plugins/checkpoint/tensor_copy.h"

namespace loom::checkpoint {

inline constexpr const char* kShardedFormat = "loom-sharded";
inline constexpr const char* kShardedIndexFormat = "loom-sharded-index";
inline constexpr int64_t kShardedVersion = 1;
inline constexpr uint64_t kTensorAlignment = 64;

/// "rank_00003" for rank 3.
std::string shard_stem(int32_t rank);

/// One tensor (or slice) stored in a rank's .bin.
struct ShardEntry {
  std::string name;
  DType dtype = DType::kInvalid;
  int32_t ndim = 0;
  int64_t global_shape[kMaxDims] = {};
  Box slice;  ///< offset and shape within the global tensor
  uint64_t byte_offset = 0;
  uint64_t nbytes = 0;
  uint32_t crc = 0;
};

/// A rank's index.
struct ShardIndex {
  int32_t rank = 0;
  int32_t world = 1;
  std::string bin;  ///< file name of the .bin, beside the index
  uint64_t bin_size = 0;
  std::vector<ShardEntry> entries;
};

/// The index's body (unsealed).
nlohmann::json index_to_json(const ShardIndex& index);

/// Reads the body of a verified index file `file`, checking every field (types, bounds,
/// sizes); anything inconsistent is Error(kDataLoss) naming `file` and the tensor.
ShardIndex index_from_json(const nlohmann::json& body, const std::filesystem::path& file);

}  // namespace loom::checkpoint
