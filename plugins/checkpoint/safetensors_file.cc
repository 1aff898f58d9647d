#include "plugins/checkpoint/safetensors_file.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "plugins/checkpoint/crc32c.h"
#include "plugins/checkpoint/tensor_copy.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
namespace {

struct StDtype {
  const char* name;
  DType dtype;
  uint64_t size;
};

constexpr StDtype kDtypes[] = {
    {"F64", DType::kF64, 8},        {"F32", DType::kF32, 4},        {"F16", DType::kF16, 2},
    {"BF16", DType::kBF16, 2},      {"I64", DType::kI64, 8},        {"I32", DType::kI32, 4},
    {"I16", DType::kI16, 2},        {"I8", DType::kI8, 1},          {"U8", DType::kU8, 1},
    {"U16", DType::kU16, 2},        {"BOOL", DType::kBool, 1},      {"F8_E4M3", DType::kF8E4M3, 1},
    {"F8_E5M2", DType::kF8E5M2, 1}, {"F8_E8M0", DType::kF8E8M0, 1}, {"U32", DType::kInvalid, 4},
    {"U64", DType::kInvalid, 8},
};

constexpr uint64_t kMaxHeader = 100u << 20;  // the safetensors library's limit

[[noreturn]] void damaged(const fs::path& file, const std::string& what) {
  fail(Code::kDataLoss, file.string() + ": " + what +
                            "; the file is damaged or not a safetensors file: export it again");
}

}  // namespace

const char* safetensors_dtype(DType dtype) {
  for (const StDtype& d : kDtypes)
    if (d.dtype == dtype && dtype != DType::kInvalid) return d.name;
  fail(Code::kUnimplemented, std::string("safetensors has no dtype for ") + dtype_name(dtype));
}

std::map<std::string, SafetensorsTensor> parse_safetensors_header(const std::string& header,
                                                                  uint64_t data_size,
                                                                  const fs::path& file,
                                                                  nlohmann::json* metadata) {
  std::set<std::string> keys;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_key = [&](int depth, nlohmann::json::parse_event_t event,
                                                 nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
        !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json j = nlohmann::json::parse(header, on_key, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) damaged(file, "the header is not a JSON object");
  if (!duplicate.empty()) damaged(file, "the header names tensor '" + duplicate + "' twice");
  *metadata = nlohmann::json::object();
  std::map<std::string, SafetensorsTensor> tensors;
  for (auto& [name, t] : j.items()) {
    if (name == "__metadata__") {
      if (!t.is_object()) damaged(file, "\"__metadata__\" is not an object");
      for (auto& [key, value] : t.items())
        if (!value.is_string())
          damaged(file, "\"__metadata__\" entry '" + key + "' is not a string");
      *metadata = t;
      continue;
    }
    std::string at = "tensor '" + name + "'";
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2)
      damaged(file, at + " lacks dtype, shape or data_offsets [begin, end]");
    SafetensorsTensor out;
    out.name = name;
    out.st_dtype = t["dtype"].get<std::string>();
    const StDtype* kind = nullptr;
    for (const StDtype& d : kDtypes)
      if (out.st_dtype == d.name) kind = &d;
    if (kind == nullptr) damaged(file, at + " has the unknown dtype '" + out.st_dtype + "'");
    out.dtype = kind->dtype;
    uint64_t bytes = kind->size;
    if (t["shape"].size() > static_cast<size_t>(kMaxDims))
      damaged(file, at + " has more than 8 dimensions");
    for (const auto& extent : t["shape"]) {
      if (!extent.is_number_unsigned()) damaged(file, at + " has a bad shape " + t["shape"].dump());
      out.shape.push_back(extent.get<int64_t>());
      if (out.shape.back() < 0 || __builtin_mul_overflow(bytes, extent.get<uint64_t>(), &bytes))
        damaged(file, at + " has a shape too large " + t["shape"].dump());
    }
    for (const auto& offset : t["data_offsets"])
      if (!offset.is_number_unsigned()) damaged(file, at + " has bad data_offsets");
    out.begin = t["data_offsets"][0].get<uint64_t>();
    out.end = t["data_offsets"][1].get<uint64_t>();
    if (out.begin > out.end || out.end > data_size)
      damaged(file, at + " has data_offsets [" + std::to_string(out.begin) + ", " +
                        std::to_string(out.end) + "] outside the " + std::to_string(data_size) +
                        " data bytes");
    if (out.end - out.begin != bytes)
      damaged(file, at + " has " + std::to_string(out.end - out.begin) + " bytes but its shape " +
                        shape_text(out.shape) + " and dtype " + out.st_dtype + " need " +
                        std::to_string(bytes));
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
      damaged(file, "tensor '" + t->name + "' starts at byte " + std::to_string(t->begin) +
                        " where " + std::to_string(expected) + " was expected (" +
                        (t->begin < expected ? "it overlaps the previous tensor" : "a gap") + ")");
    expected = t->end;
  }
  if (expected != data_size)
    damaged(file, "the tensors end at byte " + std::to_string(expected) + " of " +
                      std::to_string(data_size) + " data bytes");
  return tensors;
}

SafetensorsReader::SafetensorsReader(fs::path path)
    : file_(std::move(path), Code::kNotFound, "expected a safetensors file here") {
  const fs::path& p = file_.path();
  if (file_.size() < 8) damaged(p, "the file is " + std::to_string(file_.size()) + " bytes long");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | file_.data()[i];
  if (n > kMaxHeader || n > file_.size() - 8)
    damaged(p, "the header length " + std::to_string(n) + " exceeds the file (" +
                   std::to_string(file_.size()) + " bytes) or 100 MiB");
  std::string header(reinterpret_cast<const char*>(file_.data()) + 8, static_cast<size_t>(n));
  data_ = file_.data() + 8 + n;
  tensors_ = parse_safetensors_header(header, file_.size() - 8 - n, p, &metadata_);
  if (!metadata_.contains("crc32c")) return;
  nlohmann::json crcs = nlohmann::json::parse(metadata_["crc32c"].get<std::string>(), nullptr,
                                              /*allow_exceptions=*/false);
  if (!crcs.is_object()) damaged(p, "\"__metadata__\".\"crc32c\" is not a JSON object");
  for (auto& [name, hex] : crcs.items()) {
    uint32_t value = 0;
    std::string text = hex.is_string() ? hex.get<std::string>() : "";
    bool ok = text.size() == 8;
    for (char ch : text) {
      int digit = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
      ok = ok && digit >= 0;
      value = value << 4 | static_cast<uint32_t>(digit & 0xf);
    }
    if (!ok) damaged(p, "the CRC-32C of '" + name + "' is malformed: " + hex.dump());
    crcs_[name] = value;
  }
}

void SafetensorsReader::verify(const SafetensorsTensor& t, const std::string& context) const {
  auto it = crcs_.find(t.name);
  if (it == crcs_.end()) return;
  uint32_t crc = crc32c(bytes(t), static_cast<size_t>(t.end - t.begin));
  if (crc != it->second)
    fail(Code::kDataLoss, path().string() + ": tensor '" + t.name + "'" + context +
                              " fails its CRC-32C check (stored " + crc32c_hex(it->second) +
                              ", computed " + crc32c_hex(crc) +
                              "): the file is damaged; export the checkpoint again");
}

const SafetensorsTensor* SafetensorsReader::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void write_safetensors(const fs::path& path, std::vector<SafetensorsOutput> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<uint64_t> sizes;
  for (const SafetensorsOutput& t : tensors) {
    uint64_t bytes = dtype_size(t.dtype);
    for (int64_t extent : t.shape) bytes *= static_cast<uint64_t>(extent);
    sizes.push_back(bytes);
  }
  // The header holds the CRCs, known only once the data is written: it is written first
  // with placeholders of the same length, then rewritten in place.
  auto header_text = [&](const std::vector<uint32_t>& crcs) {
    nlohmann::json header = nlohmann::json::object(), crc_map = nlohmann::json::object();
    uint64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      header[tensors[i].name] = {{"dtype", safetensors_dtype(tensors[i].dtype)},
                                 {"shape", tensors[i].shape},
                                 {"data_offsets", {offset, offset + sizes[i]}}};
      crc_map[tensors[i].name] = crc32c_hex(crcs[i]);
      offset += sizes[i];
    }
    nlohmann::json meta = metadata;
    meta["crc32c"] = crc_map.dump();
    header["__metadata__"] = meta;
    std::string text = header.dump();
    text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the data starts 8-byte aligned
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(text.size() >> (8 * i));
    return out + text;
  };
  std::vector<uint32_t> crcs(tensors.size(), 0);
  std::string placeholder = header_text(crcs);
  DurableFile file(path);
  file.write(placeholder.data(), placeholder.size());
  std::vector<unsigned char> buffer;
  for (size_t i = 0; i < tensors.size(); ++i) {
    buffer.assign(static_cast<size_t>(sizes[i]), 0);
    tensors[i].fill(buffer.data());
    crcs[i] = crc32c(buffer.data(), buffer.size());
    file.write(buffer.data(), buffer.size());
  }
  std::string header = header_text(crcs);
  LOOM_CHECK(header.size() == placeholder.size(), path.string());
  file.write_at(0, header.data(), header.size());
  file.commit();
}

}  // namespace loom::checkpoint
