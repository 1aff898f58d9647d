#include "plugins/checkpoint/sharded_format.h"

#include <filesystem>

#include "plugins/checkpoint/files.h"
#include "plugins/checkpoint/sharded.h"

namespace loom::checkpoint {
namespace {

std::filesystem::path path_of(StringView dir) {
  if (dir.data == nullptr || dir.size == 0)
    fail(Code::kInvalidArgument, "checkpoint directory is empty");
  return std::filesystem::path(std::string(dir.data, dir.size));
}

}  // namespace

Status ShardedFormat::save(StringView dir, const CheckpointTensor* tensors, int64_t count,
                           StringView metadata_json, int32_t rank, int32_t world) noexcept {
  return guard([&] {
    save_sharded(
        path_of(dir), tensors, count,
        std::string(metadata_json.data != nullptr ? metadata_json.data : "", metadata_json.size),
        rank, world);
  });
}

Status ShardedFormat::load(StringView dir, CheckpointTensor* tensors, int64_t count) noexcept {
  return guard([&] { ShardedReader(path_of(dir)).load(tensors, count); });
}

Status ShardedFormat::metadata(StringView dir, StringView* metadata_json) noexcept {
  return guard([&] {
    metadata_text_ = ShardedReader(path_of(dir)).loom_metadata().dump();
    *metadata_json = StringView{metadata_text_.data(), metadata_text_.size()};
  });
}

bool ShardedFormat::recognizes(StringView dir) noexcept {
  try {
    std::filesystem::path file = path_of(dir) / "metadata.json";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) return false;
    std::string text = read_whole_file(file, Code::kNotFound, "");
    return text.find(std::string("\"") + kShardedFormat + "\"") != std::string::npos;
  } catch (...) {
    return false;
  }
}

}  // namespace loom::checkpoint
