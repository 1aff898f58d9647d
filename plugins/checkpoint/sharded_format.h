// checkpoint_format "sharded": loom's training checkpoint (files in shard_index.h). Every
// rank writes its own slices; any slice of any tensor loads back, assembled from the saved
// slices that overlap it, so a checkpoint loads into another TP/PP/DP/EP layout.
#pragma once

#include <loom/sdk.h>

#include <nlohmann/json.hpp>
#include <string>

namespace loom::checkpoint {

/// Options (manifest "sharded"): none.
class ShardedFormat final : public Object<ICheckpointFormat> {
 public:
  ShardedFormat(const nlohmann::json& options, IBuildContext& ctx) {}

  /// Writes this rank's shards/rank_NNNNN.{bin,json}; rank 0 also metadata.json.
  Status save(StringView dir, const CheckpointTensor* tensors, int64_t count,
              StringView metadata_json, int32_t rank, int32_t world) noexcept override;
  /// Verifies metadata and indices, then reads the requested slices (CRC-checked).
  Status load(StringView dir, CheckpointTensor* tensors, int64_t count) noexcept override;
  /// The core's metadata object, after verifying metadata.json and every index.
  Status metadata(StringView dir, StringView* metadata_json) noexcept override;
  /// metadata.json exists and says "loom-sharded" (no verification).
  bool recognizes(StringView dir) noexcept override;

 private:
  std::string metadata_text_;  // what metadata() returned last
};

}  // namespace loom::checkpoint
