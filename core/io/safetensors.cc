#include "core/io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/util/errors.h"
#include "core/util/files.h"

namespace fs = std::filesystem;

namespace loom::core {
namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kNames[] = {
    {DType::kF32, "F32"},        {DType::kF16, "F16"},        {DType::kBF16, "BF16"},
    {DType::kF64, "F64"},        {DType::kI8, "I8"},          {DType::kU8, "U8"},
    {DType::kI16, "I16"},        {DType::kU16, "U16"},        {DType::kI32, "I32"},
    {DType::kI64, "I64"},        {DType::kBool, "BOOL"},      {DType::kF8E4M3, "F8_E4M3"},
    {DType::kF8E5M2, "F8_E5M2"}, {DType::kF8E8M0, "F8_E8M0"},
};

DType dtype_from_name(const std::string& name) {
  for (const auto& n : kNames)
    if (name == n.name) return n.dtype;
  return DType::kInvalid;
}

}  // namespace

const char* safetensors_dtype(DType dtype) {
  for (const auto& n : kNames)
    if (n.dtype == dtype) return n.name;
  throw IoError(fmt::format("safetensors has no dtype for {}", dtype_name(dtype)));
}

void write_safetensors(const fs::path& path, std::vector<SafetensorsEntry> entries,
                       const std::map<std::string, std::string>& metadata) {
  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& e : entries) {
    uint64_t n = 1;
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    uint64_t bytes = n * dtype_size(e.dtype);
    header[e.name] = {{"dtype", safetensors_dtype(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // align the data (as HF does)
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  fs::path tmp = temporary_path(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    throw IoError(fmt::format("{}: cannot create: {}", tmp.string(), std::strerror(errno)));
  try {
    uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    write_all(fd, len, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (size_t i = 0; i < entries.size(); ++i) write_all(fd, entries[i].data, sizes[i], tmp);
  } catch (...) {
    ::close(fd);
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  commit_file(fd, tmp, path);
}

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open", path.string()));
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& what) {
    return IoError(fmt::format("{}: not a valid safetensors file: {}", path.string(), what));
  };
  if (bytes_.size() < 8) throw bad("shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes_[i]) << (8 * i);
  if (n > bytes_.size() - 8) throw bad(fmt::format("header length {} exceeds the file", n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + 8 + static_cast<long>(n));
  } catch (const std::exception& e) {
    throw bad(fmt::format("header is not JSON ({})", e.what()));
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  const unsigned char* data = bytes_.data() + 8 + n;
  size_t data_size = bytes_.size() - 8 - n;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : value.items())
        if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets"))
      throw bad(fmt::format("tensor '{}' lacks dtype, shape or data_offsets", name));
    Tensor t{};
    t.dtype = dtype_from_name(value["dtype"].get<std::string>());
    if (t.dtype == DType::kInvalid)
      throw bad(fmt::format("tensor '{}' has unknown dtype {}", name, value["dtype"].dump()));
    uint64_t count = 1;
    for (const auto& d : value["shape"]) {
      t.shape.push_back(d.get<int64_t>());
      count *= d.get<uint64_t>();
    }
    uint64_t begin = value["data_offsets"][0].get<uint64_t>();
    uint64_t end = value["data_offsets"][1].get<uint64_t>();
    if (end < begin || end > data_size)
      throw bad(fmt::format("tensor '{}' data [{}, {}) lies outside the {} data bytes", name, begin,
                            end, data_size));
    if (end - begin != count * dtype_size(t.dtype))
      throw bad(fmt::format("tensor '{}' has {} bytes, its shape and dtype need {}", name,
                            end - begin, count * dtype_size(t.dtype)));
    t.data = data + begin;
    t.bytes = end - begin;
    tensors_[name] = t;
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

const SafetensorsFile::Tensor& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw IoError(fmt::format("{}: no tensor '{}'", path_.string(), name));
  return it->second;
}

}  // namespace loom::core
