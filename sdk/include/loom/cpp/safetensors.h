// The safetensors format (Hugging Face's), header-only: its dtype names, reading and checking
// a header, and building one. Files themselves (mapping, durable writes, checksums) are the
// caller's business; this is only the format.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON header
// {name: {"dtype": "F32"|"BF16"|..., "shape": [...], "data_offsets": [begin, end]},
// "__metadata__": {string: string}} padded with spaces, then the tensor bytes (offsets
// relative to the end of the header), little-endian and row-major.
//
// Reading checks what the `safetensors` library checks: the header inside the file, a JSON
// object without duplicate names, known dtypes, every byte range inside the data, of the size
// its shape and dtype say, the ranges in order without overlap or gap, and the data ending
// where the last range does. A violation is Error(kDataLoss) naming the file (and the tensor).
//
//   std::vector<loom::SafetensorsEntry> entries = {{"w", DType::kF32, {2, 3}}};
//   loom::sort_safetensors(entries);                     // the order the data is stored in
//   std::string head = loom::build_safetensors_header(entries, {{"format", "pt"}});
//   // write head, then each entry's bytes in that order
//
//   loom::SafetensorsLayout layout = loom::parse_safetensors(bytes, size, path);
//   const unsigned char* w = bytes + layout.data_offset + layout.tensors.at("w").begin;
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "loom/cpp/error.h"
#include "loom/cpp/json_input.h"
#include "loom/types.h"

namespace loom {

/// A dtype of the format: its name in files, loom's dtype and the element size.
struct SafetensorsDtype {
  const char* name;  ///< as in the file: "F32", "BF16", ...
  DType dtype;       ///< loom's dtype; kInvalid for ones loom lacks (U32, U64)
  uint64_t size;     ///< bytes per element
};

/// Every dtype the format has (those loom lacks are known, so that such files still read).
inline constexpr SafetensorsDtype kSafetensorsDtypes[] = {
    {"F64", DType::kF64, 8},        {"F32", DType::kF32, 4},        {"F16", DType::kF16, 2},
    {"BF16", DType::kBF16, 2},      {"I64", DType::kI64, 8},        {"I32", DType::kI32, 4},
    {"I16", DType::kI16, 2},        {"I8", DType::kI8, 1},          {"U8", DType::kU8, 1},
    {"U16", DType::kU16, 2},        {"BOOL", DType::kBool, 1},      {"F8_E4M3", DType::kF8E4M3, 1},
    {"F8_E5M2", DType::kF8E5M2, 1}, {"F8_E8M0", DType::kF8E8M0, 1}, {"U32", DType::kInvalid, 4},
    {"U64", DType::kInvalid, 8},
};

/// The largest header the `safetensors` library reads (100 MiB); a longer one is refused.
inline constexpr uint64_t kSafetensorsMaxHeader = uint64_t{100} << 20;

/// The format's dtype called `name` ("F32"), or null when it has none of that name.
/// \param name  the "dtype" string of a header entry
inline const SafetensorsDtype* find_safetensors_dtype(const std::string& name) noexcept {
  for (const SafetensorsDtype& d : kSafetensorsDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

/// The format's name of `dtype` ("F32"); throws Error(kUnimplemented) for a dtype the format
/// lacks (kInvalid among them).
/// \param dtype  loom's dtype of a tensor to write
inline const char* safetensors_dtype(DType dtype) {
  for (const SafetensorsDtype& d : kSafetensorsDtypes)
    if (d.dtype == dtype && dtype != DType::kInvalid) return d.name;
  fail(Code::kUnimplemented, std::string("safetensors has no dtype for ") + dtype_name(dtype));
}

/// Throws Error(kDataLoss): `file` is not a valid safetensors file because of `what`.
/// \param file  the file, first in the message
/// \param what  what is wrong with it ("tensor 'w' has ...")
[[noreturn]] inline void safetensors_damaged(const std::filesystem::path& file,
                                             const std::string& what) {
  fail(Code::kDataLoss, file.string() + ": " + what +
                            "; the file is damaged or not a safetensors file: export it again");
}

/// One tensor of a header, as read.
struct SafetensorsTensor {
  std::string name;
  std::string st_dtype;  ///< as in the file: "F32", "BF16", ...
  DType dtype;           ///< loom's dtype; kInvalid for ones loom lacks (U32, U64)
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  ///< byte range in the data section
};

/// Parses and checks a header (the JSON text after the length) for a data section of
/// `data_size` bytes; throws Error(kDataLoss) naming `file` (and the tensor) for anything
/// the format forbids (see the top of this file).
/// \param header     the JSON text, padding included
/// \param data_size  bytes after the header, to the end of the file
/// \param file       names the file in messages
/// \param metadata   receives "__metadata__" (an object of strings; empty when absent)
/// \return the tensors by name
inline std::map<std::string, SafetensorsTensor> parse_safetensors_header(
    const std::string& header, uint64_t data_size, const std::filesystem::path& file,
    nlohmann::json* metadata) {
  // nlohmann keeps the last of two equal keys; the format forbids them, so the parser's
  // callback notices them on the way.
  std::set<std::string> keys;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_key = [&](int depth, nlohmann::json::parse_event_t event,
                                                 nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
        !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  // The depth first: a header nested 100,000 deep would overflow the stack of the parser's
  // callers and of every walk of the value.
  size_t deep = json_too_deep_at(header);
  if (deep != std::string::npos)
    safetensors_damaged(file, "the header nests deeper than " + std::to_string(kMaxJsonDepth) +
                                  " levels at byte " + std::to_string(deep));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header, on_key, /*allow_exceptions=*/false);
  } catch (const nlohmann::json::exception& e) {
    // A number beyond double (1e309) throws even without exceptions enabled.
    safetensors_damaged(file, std::string("the header is not valid JSON (") + e.what() + ")");
  }
  if (j.is_discarded() || !j.is_object())
    safetensors_damaged(file, "the header is not a JSON object");
  if (!duplicate.empty())
    safetensors_damaged(file, "the header names tensor '" + duplicate + "' twice");
  *metadata = nlohmann::json::object();
  std::map<std::string, SafetensorsTensor> tensors;
  for (auto& [name, t] : j.items()) {
    if (name == "__metadata__") {
      if (!t.is_object()) safetensors_damaged(file, "\"__metadata__\" is not an object");
      for (auto& [key, value] : t.items())
        if (!value.is_string())
          safetensors_damaged(file, "\"__metadata__\" entry '" + key + "' is not a string");
      *metadata = t;
      continue;
    }
    std::string at = "tensor '" + name + "'";
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2)
      safetensors_damaged(file, at + " lacks dtype, shape or data_offsets [begin, end]");
    SafetensorsTensor out;
    out.name = name;
    out.st_dtype = t["dtype"].get<std::string>();
    const SafetensorsDtype* kind = find_safetensors_dtype(out.st_dtype);
    if (kind == nullptr)
      safetensors_damaged(file, at + " has the unknown dtype '" + out.st_dtype + "'");
    out.dtype = kind->dtype;
    uint64_t bytes = kind->size;
    if (t["shape"].size() > static_cast<size_t>(kMaxDims))
      safetensors_damaged(file, at + " has more than 8 dimensions");
    for (const auto& extent : t["shape"]) {
      if (!extent.is_number_unsigned())
        safetensors_damaged(file, at + " has a bad shape " + t["shape"].dump());
      out.shape.push_back(extent.get<int64_t>());
      if (out.shape.back() < 0 || __builtin_mul_overflow(bytes, extent.get<uint64_t>(), &bytes))
        safetensors_damaged(file, at + " has a shape too large " + t["shape"].dump());
    }
    for (const auto& offset : t["data_offsets"])
      if (!offset.is_number_unsigned()) safetensors_damaged(file, at + " has bad data_offsets");
    out.begin = t["data_offsets"][0].get<uint64_t>();
    out.end = t["data_offsets"][1].get<uint64_t>();
    if (out.begin > out.end || out.end > data_size)
      safetensors_damaged(file, at + " has data_offsets [" + std::to_string(out.begin) + ", " +
                                    std::to_string(out.end) + "] outside the " +
                                    std::to_string(data_size) + " data bytes");
    if (out.end - out.begin != bytes) {
      std::string shape = "[";
      for (size_t i = 0; i < out.shape.size(); ++i)
        shape += (i ? ", " : "") + std::to_string(out.shape[i]);
      safetensors_damaged(file, at + " has " + std::to_string(out.end - out.begin) +
                                    " bytes but its shape " + shape + "] and dtype " +
                                    out.st_dtype + " need " + std::to_string(bytes));
    }
    tensors.emplace(name, std::move(out));
  }
  // The ranges tile the data section exactly, in order.
  std::vector<const SafetensorsTensor*> order;
  for (const auto& [name, t] : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  for (const SafetensorsTensor* t : order) {
    if (t->begin != expected)
      safetensors_damaged(
          file, "tensor '" + t->name + "' starts at byte " + std::to_string(t->begin) + " where " +
                    std::to_string(expected) + " was expected (" +
                    (t->begin < expected ? "it overlaps the previous tensor" : "a gap") + ")");
    expected = t->end;
  }
  if (expected != data_size)
    safetensors_damaged(file, "the tensors end at byte " + std::to_string(expected) + " of " +
                                  std::to_string(data_size) + " data bytes");
  return tensors;
}

/// A whole file's header, read and checked.
struct SafetensorsLayout {
  uint64_t data_offset = 0;  ///< where the data section starts: 8 + the header's length
  std::map<std::string, SafetensorsTensor> tensors;  ///< by name; begin/end from data_offset
  nlohmann::json metadata;  ///< "__metadata__": an object of strings (empty when absent)
};

/// Reads and checks the header of a file held in memory: its length inside the file (and at
/// most kSafetensorsMaxHeader), then parse_safetensors_header for the rest of the file.
/// Throws Error(kDataLoss) naming `file` when it is not a valid safetensors file.
/// \param bytes  the file's bytes (may be null when `size` is 0)
/// \param size   the file's length in bytes
/// \param file   names the file in messages
inline SafetensorsLayout parse_safetensors(const unsigned char* bytes, uint64_t size,
                                           const std::filesystem::path& file) {
  if (size < 8) safetensors_damaged(file, "the file is " + std::to_string(size) + " bytes long");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | bytes[i];
  if (n > kSafetensorsMaxHeader || n > size - 8)
    safetensors_damaged(file, "the header length " + std::to_string(n) + " exceeds the file (" +
                                  std::to_string(size) + " bytes) or 100 MiB");
  SafetensorsLayout layout;
  layout.data_offset = 8 + n;
  std::string header(reinterpret_cast<const char*>(bytes) + 8, static_cast<size_t>(n));
  layout.tensors = parse_safetensors_header(header, size - 8 - n, file, &layout.metadata);
  return layout;
}

/// One tensor of a header to build.
struct SafetensorsEntry {
  std::string name;
  DType dtype;  ///< one the format has (safetensors_dtype)
  std::vector<int64_t> shape;
};

/// The bytes of a tensor of `dtype` and `shape` (row-major, packed).
/// \param dtype  its element type
/// \param shape  its extents (none for a scalar)
inline uint64_t safetensors_bytes(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t bytes = dtype_size(dtype);
  for (int64_t extent : shape) bytes *= static_cast<uint64_t>(extent);
  return bytes;
}

/// Sorts `tensors` (anything with a `name`) by name: the order in which a file stores them,
/// as Hugging Face writes them, and the order build_safetensors_header takes.
/// \param tensors  the tensors to write, reordered in place
template <class Tensor>
void sort_safetensors(std::vector<Tensor>& tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const Tensor& a, const Tensor& b) { return a.name < b.name; });
}

/// The first bytes of a file that stores `tensors`' data, in that order, right after them:
/// the 8-byte little-endian length, then the JSON header (names sorted, each tensor's
/// data_offsets following the one before, "__metadata__" when `metadata` is not empty),
/// padded with spaces so that the data starts 8-byte aligned (as Hugging Face does).
/// Throws Error(kInvalidArgument) when the names are out of order or repeated (sort them
/// with sort_safetensors), Error(kUnimplemented) for a dtype the format lacks.
/// \param tensors   in name order, names distinct
/// \param metadata  "__metadata__" (string values)
inline std::string build_safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                                            const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsEntry& t = tensors[i];
    // The JSON object sorts its keys: data stored in another order would not match its
    // offsets, and a repeated name would leave one tensor out.
    if (i > 0 && !(tensors[i - 1].name < t.name))
      fail(Code::kInvalidArgument, "safetensors header: tensor '" + t.name + "' comes after '" +
                                       tensors[i - 1].name +
                                       "'; pass the tensors in name order, each name once "
                                       "(sort_safetensors)");
    const uint64_t bytes = safetensors_bytes(t.dtype, t.shape);
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 length bytes + text: the data aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(text.size() >> (8 * i));
  return out + text;
}

}  // namespace loom
