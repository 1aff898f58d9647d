// Safetensors files (Hugging Face's format): an 8-byte little-endian header length, a
// JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the raw little-endian tensor bytes. loom writes weights,
// reference dumps and (later) checkpoints in it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loom/types.h"

namespace loom::core {

/// One tensor to write: its bytes are copied from `data` when the file is written.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};

/// Writes `entries` (in name order, as Hugging Face does) atomically: a temporary file in
/// the same directory, fsync, rename. Throws IoError naming the file.
void write_safetensors(const std::filesystem::path& path, std::vector<SafetensorsEntry> entries,
                       const std::map<std::string, std::string>& metadata = {});

/// A safetensors file read into memory.
class SafetensorsFile {
 public:
  /// Reads and checks `path` (header bounds, offsets inside the data, dtype sizes).
  /// Throws IoError naming the file and what is wrong.
  explicit SafetensorsFile(const std::filesystem::path& path);

  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    const unsigned char* data;
    size_t bytes;
  };
  /// Names in the file, sorted.
  std::vector<std::string> names() const;
  /// The tensor `name`; throws IoError when absent.
  const Tensor& get(const std::string& name) const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::filesystem::path path_;
  std::vector<unsigned char> bytes_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Safetensors' dtype string ("F32", "BF16", ...) for `dtype`; throws for unsupported ones.
const char* safetensors_dtype(DType dtype);

}  // namespace loom::core
