// Safetensors files (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON header {name: {"dtype": "F32"|"BF16"|..., "shape": [...], "data_offsets": [begin,
// end]}, "__metadata__": {string: string}} padded with spaces, then the tensor bytes
// (offsets relative to the end of the header), little-endian and row-major.
//
// Reading checks what the `safetensors` library checks: the header inside the file, a JSON
// object without duplicate names, known dtypes, every byte range inside the data, of the
// size its shape and dtype say, the ranges in order without overlap or gap, and the data
// ending where the last range does. A violation is Error(kDataLoss) naming the file (and
// the tensor).
//
// loom adds "__metadata__" {"crc32c": JSON text {name: 8 hex digits}} when it writes a file,
// the CRC-32C of every tensor's bytes, and checks it when present (files written by other
// programs have none), so that damage to the data is detected too.
#pragma once

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

/// One tensor of a safetensors header.
struct SafetensorsTensor {
  std::string name;
  std::string st_dtype;  ///< as in the file: "F32", "BF16", ...
  DType dtype;           ///< loom's dtype; kInvalid for ones loom lacks (U32, U64)
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  ///< byte range in the data section
};

/// The safetensors name of `dtype` ("F32"); throws kUnimplemented for ones it lacks.
const char* safetensors_dtype(DType dtype);

/// Parses and checks a header (the JSON text after the length) for a data section of
/// `data_size` bytes. `file` names the file in messages. Returns the tensors by name and
/// fills `metadata` with "__metadata__" (an empty object when absent).
std::map<std::string, SafetensorsTensor> parse_safetensors_header(const std::string& header,
                                                                  uint64_t data_size,
                                                                  const std::filesystem::path& file,
                                                                  nlohmann::json* metadata);

/// A safetensors file mapped into memory and checked (see above).
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
