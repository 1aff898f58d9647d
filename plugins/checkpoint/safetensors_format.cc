#include "plugins/checkpoint/safetensors_format.h"

#include <filesystem>

#include "plugins/checkpoint/hf_directory.h"
#include "plugins/checkpoint/hf_io.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
namespace {

fs::path path_of(StringView dir) {
  if (dir.data == nullptr || dir.size == 0)
    fail(Code::kInvalidArgument, "checkpoint directory is empty");
  return fs::path(std::string(dir.data, dir.size));
}

}  // namespace

SafetensorsFormat::SafetensorsFormat(const nlohmann::json& options, IBuildContext& ctx) {
  std::string dtype = options.value("dtype", "auto");
  if (dtype == "auto") return;
  dtype_ = dtype_from_name(dtype.c_str());
  if (dtype_ != DType::kF32 && dtype_ != DType::kBF16 && dtype_ != DType::kF16)
    fail(Code::kInvalidArgument,
         "option 'dtype' must be one of auto, f32, bf16, f16, got '" + dtype + "'");
}

Status SafetensorsFormat::save(StringView dir, const CheckpointTensor* tensors, int64_t count,
                               StringView metadata_json, int32_t rank, int32_t world) noexcept {
  return guard([&] {
    if (world < 1 || rank < 0 || rank >= world)
      fail(Code::kInvalidArgument, "safetensors save: rank " + std::to_string(rank) +
                                       " is outside a world of " + std::to_string(world));
    std::string metadata(metadata_json.data != nullptr ? metadata_json.data : "",
                         metadata_json.size);
    export_hf(path_of(dir), tensors, count, metadata, rank, dtype_);
  });
}

Status SafetensorsFormat::load(StringView dir, CheckpointTensor* tensors, int64_t count) noexcept {
  return guard([&] { import_hf(path_of(dir), tensors, count); });
}

Status SafetensorsFormat::metadata(StringView dir, StringView* metadata_json) noexcept {
  return guard([&] {
    metadata_text_ = hf_metadata(path_of(dir));
    *metadata_json = StringView{metadata_text_.data(), metadata_text_.size()};
  });
}

bool SafetensorsFormat::recognizes(StringView dir) noexcept {
  try {
    fs::path d = path_of(dir);
    std::error_code ec;
    return fs::is_regular_file(d / kHfConfig, ec) &&
           (fs::is_regular_file(d / kHfWeights, ec) || fs::is_regular_file(d / kHfIndex, ec));
  } catch (...) {
    return false;
  }
}

}  // namespace loom::checkpoint
