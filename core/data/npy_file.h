// NumPy .npy files (format version 1.0) of little-endian integers: how Megatron caches its
// dataset indices, and how loom caches the same indices (numpy.load reads them).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace loom::core {

/// An integer array read from or written to a .npy file.
struct NpyArray {
  std::string descr;            ///< "<i4", "<u4" or "<i8"
  std::vector<int64_t> shape;   ///< C order
  std::vector<int64_t> values;  ///< widened to int64
};

/// Writes `values` (row-major, of `shape`) as `descr` ("<i4", "<u4" or "<i8") atomically.
/// Throws IoError naming the file; InvalidArgument when a value does not fit `descr`.
void write_npy(const std::filesystem::path& path, const std::string& descr,
               const std::vector<int64_t>& shape, const std::vector<int64_t>& values);

/// Reads an integer .npy file. Returns std::nullopt with `why` set when the file is
/// missing, truncated, or not a C-ordered "<i4" / "<u4" / "<i8" array (a cache to rebuild,
/// not an error).
std::optional<NpyArray> read_npy(const std::filesystem::path& path, std::string* why);

}  // namespace loom::core
