// Plain safetensors files for the reference tools: the format is the SDK's codec
// (loom/cpp/safetensors.h); here the files are only written and read whole with std::ofstream
// and std::ifstream. Unlike the checkpoint plugin's files they are neither written durably nor
// checksummed: a test run writes them once and reads them back at once.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "loom/cpp/safetensors.h"

namespace loom::reference {

/// A tensor to write: its bytes (shape * dtype size of them) are read from `data`.
struct TensorBytes {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};

/// Writes `tensors` (stored in name order) to `path`, creating its directory.
/// \param path     the file; replaced when present
/// \param tensors  names distinct; any order
inline void write_safetensors_file(const std::filesystem::path& path,
                                   std::vector<TensorBytes> tensors) {
  sort_safetensors(tensors);
  std::vector<SafetensorsEntry> entries;
  for (const TensorBytes& t : tensors) entries.push_back({t.name, t.dtype, t.shape});
  const std::string header = build_safetensors_header(entries, {});
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const TensorBytes& t : tensors)
    out.write(static_cast<const char*>(t.data),
              static_cast<std::streamsize>(safetensors_bytes(t.dtype, t.shape)));
  out.close();
  if (!out) fail(Code::kIoError, path.string() + ": cannot write; check the disk and rights");
}

/// A safetensors file read whole into memory and checked (parse_safetensors).
struct SafetensorsFileData {
  std::filesystem::path path;
  std::vector<unsigned char> bytes;
  SafetensorsLayout layout;

  /// The tensor `name`; throws Error(kNotFound) naming the file when it has none.
  const SafetensorsTensor& get(const std::string& name) const {
    auto it = layout.tensors.find(name);
    if (it == layout.tensors.end())
      fail(Code::kNotFound, path.string() + ": no tensor '" + name + "'");
    return it->second;
  }
  /// The bytes of `t`, a tensor of this file.
  const unsigned char* data(const SafetensorsTensor& t) const {
    return bytes.data() + layout.data_offset + t.begin;
  }
};

/// Reads and checks `path`: Error(kNotFound) when it cannot be opened, Error(kDataLoss) when
/// it is not a valid safetensors file.
inline SafetensorsFileData read_safetensors_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Code::kNotFound, path.string() + ": cannot open; expected a safetensors file");
  SafetensorsFileData file;
  file.path = path;
  file.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  file.layout = parse_safetensors(file.bytes.data(), file.bytes.size(), path);
  return file;
}

}  // namespace loom::reference
