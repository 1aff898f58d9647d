// save_sharded: one rank's .bin and index, and rank 0's metadata.json.
#include <set>

#include "loom/cpp/json_input.h"
#include "plugins/checkpoint/crc32c.h"
#include "plugins/checkpoint/files.h"
#include "plugins/checkpoint/requests.h"
#include "plugins/checkpoint/sealed_json.h"
#include "plugins/checkpoint/sharded.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;

void save_sharded(const fs::path& dir, const CheckpointTensor* tensors, int64_t count,
                  const std::string& metadata_json, int32_t rank, int32_t world) {
  if (world < 1 || rank < 0 || rank >= world)
    fail(Code::kInvalidArgument, "sharded save: rank " + std::to_string(rank) +
                                     " is outside a world of " + std::to_string(world));
  if (count < 0 || (count > 0 && tensors == nullptr))
    fail(Code::kInvalidArgument, "sharded save: no tensor array");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(Code::kNotFound, "sharded save: " + dir.string() +
                              " is not a directory (the core creates it before saving)");
  nlohmann::json metadata;
  if (rank == 0) {
    metadata = parse_json_input(metadata_json, "sharded save: the metadata");
    if (!metadata.is_object())
      fail(Code::kInvalidArgument, "sharded save: the metadata is not a JSON object");
  }
  // Check every entry before writing anything.
  std::vector<Box> slices;
  std::set<std::pair<std::string, std::vector<int64_t>>> seen;
  for (int64_t i = 0; i < count; ++i) {
    slices.push_back(checked_slice(tensors[i], "sharded save"));
    std::vector<int64_t> start(slices.back().start, slices.back().start + tensors[i].ndim);
    if (!seen.insert({tensors[i].name, start}).second)
      fail(Code::kInvalidArgument, "sharded save: tensor '" + std::string(tensors[i].name) +
                                       "' is given twice with the slice " +
                                       box_text(slices.back()));
  }

  fs::path shards = dir / "shards";
  fs::create_directories(shards, ec);
  if (ec) fail(Code::kIoError, shards.string() + ": cannot create it: " + ec.message());
  ShardIndex index;
  index.rank = rank;
  index.world = world;
  index.bin = shard_stem(rank) + ".bin";
  DurableFile bin(shards / index.bin);
  std::vector<unsigned char> packed;
  for (int64_t i = 0; i < count; ++i) {
    const CheckpointTensor& t = tensors[i];
    ShardEntry e;
    e.name = t.name;
    e.dtype = t.data.dtype;
    e.ndim = t.ndim;
    e.slice = slices[static_cast<size_t>(i)];
    for (int32_t d = 0; d < t.ndim; ++d) e.global_shape[d] = t.global_shape[d];
    e.nbytes = static_cast<uint64_t>(volume(e.slice)) * dtype_size(e.dtype);
    bin.pad_to(kTensorAlignment);
    e.byte_offset = bin.size();
    const void* bytes = t.data.data;
    if (!is_contiguous(t.data)) {  // gather a strided view into row-major order
      packed.resize(static_cast<size_t>(e.nbytes));
      copy_region(strided_of(t),
                  contiguous(packed.data(), e.dtype, e.slice.start, e.slice.size, e.ndim), e.slice);
      bytes = packed.data();
    }
    e.crc = crc32c(bytes, static_cast<size_t>(e.nbytes));
    bin.write(bytes, static_cast<size_t>(e.nbytes));
    index.entries.push_back(std::move(e));
  }
  index.bin_size = bin.size();
  bin.commit();
  write_file_durably(shards / (shard_stem(rank) + ".json"), seal_json(index_to_json(index)));
  if (rank == 0)
    write_file_durably(dir / "metadata.json", seal_json({{"format", kShardedFormat},
                                                         {"version", kShardedVersion},
                                                         {"world", world},
                                                         {"loom", std::move(metadata)}}));
  fsync_directory(dir);
}

}  // namespace loom::checkpoint
