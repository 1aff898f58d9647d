// A Hugging Face model directory opened for reading: config.json and the weights, either
// model.safetensors or model.safetensors.index.json with its shard files (every header
// checked, see safetensors_file.h). pytorch_model.bin (pickle) is not read.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plugins/checkpoint/safetensors_file.h"

namespace loom::checkpoint {

inline constexpr const char* kHfWeights = "model.safetensors";
inline constexpr const char* kHfIndex = "model.safetensors.index.json";
inline constexpr const char* kHfConfig = "config.json";

class HfDirectory {
 public:
  /// Opens `dir`. A missing config.json or weights file is kNotFound naming it; a
  /// directory with only pytorch_model.bin is kUnimplemented saying how to convert it.
  explicit HfDirectory(std::filesystem::path dir);

  const std::filesystem::path& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  std::filesystem::path config_path() const { return dir_ / kHfConfig; }

  /// A tensor and the file that holds it.
  struct Found {
    const SafetensorsReader* file = nullptr;
    const SafetensorsTensor* tensor = nullptr;
  };
  /// The tensor `name`, else `name` without `base_prefix` (files saved from the base
  /// model, e.g. GPT-2's "h.0.attn.c_attn.weight"); file == null when neither exists.
  Found find(const std::string& name, const std::string& base_prefix) const;
  /// The weight files, for messages ("model.safetensors" or the shards' names).
  std::string weight_files() const;
  /// The "__metadata__" entry `key` of the first file that has it, or "".
  std::string metadata(const std::string& key) const;

 private:
  std::filesystem::path dir_;
  nlohmann::json config_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
};

}  // namespace loom::checkpoint
