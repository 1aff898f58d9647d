// The "sharded" checkpoint format: writing one rank's part and reading any slice back.
// The files are described in shard_index.h.
#pragma once

#include <loom/sdk.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "plugins/checkpoint/shard_index.h"

namespace loom::checkpoint {

/// Writes rank `rank`'s shard (.bin, then its index) into DIR/shards and, on rank 0, the
/// metadata file; every file durably (files.h). See ICheckpointFormat::save.
void save_sharded(const std::filesystem::path& dir, const CheckpointTensor* tensors, int64_t count,
                  const std::string& metadata_json, int32_t rank, int32_t world);

/// A sharded checkpoint opened for reading: metadata.json and every rank's index read and
/// verified (checksums, fields, .bin sizes). Damage is Error(kDataLoss) naming the file
/// (and the tensor); a missing metadata.json is kNotFound.
class ShardedReader {
 public:
  explicit ShardedReader(std::filesystem::path dir);

  /// The core's metadata object saved with the checkpoint.
  const nlohmann::json& loom_metadata() const { return loom_; }

  /// Fills every request (ICheckpointFormat::load): each stored piece that overlaps a
  /// request is read once, its CRC-32C checked, and copied into every request it overlaps.
  void load(CheckpointTensor* requests, int64_t count) const;

 private:
  // (rank, entry index) of every stored piece of a tensor name.
  using PieceRef = std::pair<int32_t, size_t>;
  const ShardEntry& entry(const PieceRef& p) const { return shards_[p.first].entries[p.second]; }
  std::filesystem::path bin_path(int32_t rank) const;
  // The pieces of request `r` (checked against the stored global shape and dtype), with a
  // check that they cover its slice.
  std::vector<PieceRef> plan(const CheckpointTensor& r, const Box& want) const;

  std::filesystem::path dir_;
  nlohmann::json loom_;
  std::vector<ShardIndex> shards_;
  std::map<std::string, std::vector<PieceRef>> by_name_;
};

}  // namespace loom::checkpoint
