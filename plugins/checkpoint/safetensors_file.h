// Safetensors files (Hugging Face) as the checkpoint plugin reads and writes them: mapped
// into memory and checked by the SDK's codec (loom/cpp/safetensors.h: the format, its
// checks and messages), written durably (files.h).
//
// loom adds "__metadata__" {"crc32c": JSON text {name: 8 hex digits}} when it writes a file,
// the CRC-32C of every tensor's bytes, and checks it when present (files written by other
// programs have none), so that damage to the data is detected too.
#pragma once

#include <loom/cpp/safetensors.h>
#include <loom/sdk.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plugins/checkpoint/files.h"

namespace loom::checkpoint {

// The tensors the reader lists are the codec's.
using loom::SafetensorsTensor;

/// A safetensors file mapped into memory and checked (parse_safetensors); a file that is not
/// there is Error(kNotFound), one that is not valid Error(kDataLoss), both naming the file.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::filesystem::path path);

  const std::filesystem::path& path() const { return file_.path(); }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  /// The tensor `name`, or null.
  const SafetensorsTensor* find(const std::string& name) const;
  /// The bytes of `t` (a tensor of this file).
  const unsigned char* bytes(const SafetensorsTensor& t) const { return data_ + t.begin; }
  /// "__metadata__": an object of strings (empty when absent).
  const nlohmann::json& metadata() const { return metadata_; }
  /// Checks `t`'s bytes against the file's stored CRC-32C, when it has one; a mismatch is
  /// Error(kDataLoss) naming the file, the tensor and `context` (e.g. the loom name).
  void verify(const SafetensorsTensor& t, const std::string& context) const;

 private:
  MappedFile file_;
  const unsigned char* data_ = nullptr;
  std::map<std::string, SafetensorsTensor> tensors_;
  nlohmann::json metadata_;
  std::map<std::string, uint32_t> crcs_;  // from "__metadata__"."crc32c"
};

/// A tensor to write whose bytes are produced on demand (so a large export never holds
/// every tensor at once): `fill` writes exactly shape * dtype bytes into its argument.
struct SafetensorsOutput {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::function<void(unsigned char* out)> fill;
};

/// Writes `tensors` (stored in name order, as Hugging Face does) with `metadata`
/// ("__metadata__", string values, plus "crc32c" of every tensor) to `path`, durably
/// (files.h).
void write_safetensors(const std::filesystem::path& path, std::vector<SafetensorsOutput> tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace loom::checkpoint
