#include "plugins/checkpoint/shard_index.h"

#include <cstdio>
#include <limits>
#include <type_traits>

#include "loom/cpp/json_input.h"
#include "plugins/checkpoint/crc32c.h"

namespace loom::checkpoint {
namespace {

nlohmann::json shape_json(const int64_t* shape, int32_t ndim) {
  return nlohmann::json(std::vector<int64_t>(shape, shape + ndim));
}

// Reads field `key` of `j` as T, or fails naming the file, the entry and the key. Integers
// go through JsonIn's checks: nlohmann converts a float such as 3e122 to an integer type
// with a plain cast (undefined behaviour beyond the type's range; found by the fuzzer).
template <class T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) fail(Code::kDataLoss, where + " lacks \"" + key + "\"");
  if constexpr (std::is_integral_v<T>) {
    constexpr int64_t lo = std::is_signed_v<T> ? static_cast<int64_t>(std::numeric_limits<T>::min()) : 0;
    constexpr int64_t hi = sizeof(T) >= sizeof(int64_t)
                               ? std::numeric_limits<int64_t>::max()
                               : static_cast<int64_t>(std::numeric_limits<T>::max());
    return static_cast<T>(JsonIn(j, where, Code::kDataLoss)[key].int64(lo, hi));
  } else {
    try {
      return j[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(Code::kDataLoss, where + " has a malformed \"" + key + "\": " + j[key].dump());
    }
  }
}

int32_t read_shape(const nlohmann::json& j, const char* key, const std::string& where,
                   int64_t* out) {
  if (!j.is_object() || !j.contains(key)) fail(Code::kDataLoss, where + " lacks \"" + key + "\"");
  std::vector<int64_t> v = JsonIn(j, where, Code::kDataLoss)[key].int64_array();
  if (v.size() > static_cast<size_t>(kMaxDims))
    fail(Code::kDataLoss, where + " \"" + key + "\" has more than 8 dimensions");
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0) fail(Code::kDataLoss, where + " \"" + key + "\" has a negative extent");
    if (v[i] > kMaxJsonSize)
      fail(Code::kDataLoss,
           where + " \"" + key + "\" has the extent " + std::to_string(v[i]) + " (more than 2^40)");
    out[i] = v[i];
  }
  return static_cast<int32_t>(v.size());
}

uint32_t parse_hex(const std::string& text, const std::string& where) {
  uint32_t value = 0;
  if (text.size() != 8) fail(Code::kDataLoss, where + " has a malformed \"crc32c\": " + text);
  for (char c : text) {
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) fail(Code::kDataLoss, where + " has a malformed \"crc32c\": " + text);
    value = value << 4 | static_cast<uint32_t>(digit);
  }
  return value;
}

}  // namespace

std::string shard_stem(int32_t rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d", rank);
  return name;
}

nlohmann::json index_to_json(const ShardIndex& index) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const ShardEntry& e : index.entries)
    tensors.push_back({{"name", e.name},
                       {"dtype", dtype_name(e.dtype)},
                       {"global_shape", shape_json(e.global_shape, e.ndim)},
                       {"offset", shape_json(e.slice.start, e.ndim)},
                       {"shape", shape_json(e.slice.size, e.ndim)},
                       {"byte_offset", e.byte_offset},
                       {"nbytes", e.nbytes},
                       {"crc32c", crc32c_hex(e.crc)}});
  return {{"format", kShardedIndexFormat},
          {"version", kShardedVersion},
          {"rank", index.rank},
          {"world", index.world},
          {"bin", index.bin},
          {"bin_size", index.bin_size},
          {"tensors", tensors}};
}

ShardIndex index_from_json(const nlohmann::json& body, const std::filesystem::path& file) {
  const std::string where = file.string();
  if (field<std::string>(body, "format", where) != kShardedIndexFormat)
    fail(Code::kDataLoss, where + " is not a loom-sharded index");
  if (field<int64_t>(body, "version", where) > kShardedVersion)
    fail(Code::kUnimplemented, where + " was written by a newer loom (index version " +
                                   body["version"].dump() + "); upgrade loom to read it");
  ShardIndex index;
  index.rank = field<int32_t>(body, "rank", where);
  index.world = field<int32_t>(body, "world", where);
  index.bin = field<std::string>(body, "bin", where);
  index.bin_size = field<uint64_t>(body, "bin_size", where);
  if (index.bin.empty() || index.bin.find('/') != std::string::npos || index.bin[0] == '.')
    fail(Code::kDataLoss, where + " names a bad .bin file '" + index.bin + "'");
  const nlohmann::json& tensors = body.contains("tensors") ? body["tensors"] : nlohmann::json();
  if (!tensors.is_array()) fail(Code::kDataLoss, where + " lacks its \"tensors\" list");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const nlohmann::json& t = tensors[i];
    ShardEntry e;
    e.name = field<std::string>(t, "name", where + " entry " + std::to_string(i));
    std::string at = where + " tensor '" + e.name + "'";
    e.dtype = dtype_from_name(field<std::string>(t, "dtype", at).c_str());
    if (e.dtype == DType::kInvalid) fail(Code::kDataLoss, at + " has an unknown dtype");
    e.ndim = read_shape(t, "global_shape", at, e.global_shape);
    e.slice.ndim = e.ndim;
    if (read_shape(t, "offset", at, e.slice.start) != e.ndim ||
        read_shape(t, "shape", at, e.slice.size) != e.ndim)
      fail(Code::kDataLoss, at + ": offset, shape and global_shape differ in rank");
    for (int32_t d = 0; d < e.ndim; ++d)
      if (e.slice.start[d] + e.slice.size[d] > e.global_shape[d])
        fail(Code::kDataLoss, at + ": slice " + box_text(e.slice) + " lies outside the shape " +
                                  shape_text(e.global_shape, e.ndim));
    e.byte_offset = field<uint64_t>(t, "byte_offset", at);
    e.nbytes = field<uint64_t>(t, "nbytes", at);
    e.crc = parse_hex(field<std::string>(t, "crc32c", at), at);
    // The slice's bytes, overflow-checked: nothing is allocated from the shape before it
    // is known to match nbytes, which must lie inside the .bin (below).
    uint64_t bytes = dtype_size(e.dtype);
    for (int32_t d = 0; d < e.ndim; ++d)
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(e.slice.size[d]), &bytes))
        fail(Code::kDataLoss, at + ": the slice " + box_text(e.slice) + " is too large");
    // The global shape too: readers size requests from it.
    int64_t elements = 1;
    for (int32_t d = 0; d < e.ndim; ++d)
      if (__builtin_mul_overflow(elements, e.global_shape[d], &elements))
        fail(Code::kDataLoss,
             at + ": the shape " + shape_text(e.global_shape, e.ndim) + " is too large");
    if (e.nbytes != bytes)
      fail(Code::kDataLoss,
           at + ": nbytes " + std::to_string(e.nbytes) + " does not match its shape and dtype");
    if (e.byte_offset > index.bin_size || e.nbytes > index.bin_size - e.byte_offset)
      fail(Code::kDataLoss, at + ": bytes [" + std::to_string(e.byte_offset) + ", +" +
                                std::to_string(e.nbytes) + ") lie past the end of " + index.bin);
    index.entries.push_back(std::move(e));
  }
  return index;
}

}  // namespace loom::checkpoint
