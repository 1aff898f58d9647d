#include "plugins/checkpoint/safetensors_file.h"

#include "loom/cpp/json_input.h"
#include "plugins/checkpoint/crc32c.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;

SafetensorsReader::SafetensorsReader(fs::path path)
    : file_(std::move(path), Code::kNotFound, "expected a safetensors file here") {
  const fs::path& p = file_.path();
  SafetensorsLayout layout = parse_safetensors(file_.data(), file_.size(), p);
  data_ = file_.data() + layout.data_offset;
  tensors_ = std::move(layout.tensors);
  metadata_ = std::move(layout.metadata);
  if (!metadata_.contains("crc32c")) return;
  nlohmann::json crcs = parse_json_input(metadata_["crc32c"].get<std::string>(),
                                         p.string() + " \"__metadata__\".\"crc32c\"",
                                         Code::kDataLoss, "the file is damaged; export it again");
  if (!crcs.is_object()) safetensors_damaged(p, "\"__metadata__\".\"crc32c\" is not a JSON object");
  for (auto& [name, hex] : crcs.items()) {
    uint32_t value = 0;
    std::string text = hex.is_string() ? hex.get<std::string>() : "";
    bool ok = text.size() == 8;
    for (char ch : text) {
      int digit = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
      ok = ok && digit >= 0;
      value = value << 4 | static_cast<uint32_t>(digit & 0xf);
    }
    if (!ok) safetensors_damaged(p, "the CRC-32C of '" + name + "' is malformed: " + hex.dump());
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
  sort_safetensors(tensors);
  std::vector<SafetensorsEntry> entries;
  for (const SafetensorsOutput& t : tensors) entries.push_back({t.name, t.dtype, t.shape});
  // The header holds the CRCs, known only once the data is written: it is written first
  // with placeholders of the same length, then rewritten in place.
  auto header_text = [&](const std::vector<uint32_t>& crcs) {
    nlohmann::json crc_map = nlohmann::json::object();
    for (size_t i = 0; i < tensors.size(); ++i) crc_map[tensors[i].name] = crc32c_hex(crcs[i]);
    std::map<std::string, std::string> meta = metadata;
    meta["crc32c"] = crc_map.dump();
    return build_safetensors_header(entries, meta);
  };
  std::vector<uint32_t> crcs(tensors.size(), 0);
  std::string placeholder = header_text(crcs);
  DurableFile file(path);
  file.write(placeholder.data(), placeholder.size());
  std::vector<unsigned char> buffer;
  for (size_t i = 0; i < tensors.size(); ++i) {
    buffer.assign(static_cast<size_t>(safetensors_bytes(entries[i].dtype, entries[i].shape)), 0);
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
