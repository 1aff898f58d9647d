#include "core/checkpoint/checkpoint_files.h"

#include <fmt/format.h>

#include <array>

#include "core/util/errors.h"
#include "core/util/files.h"

namespace fs = std::filesystem;

namespace loom::core {
namespace {

// The reflected Castagnoli polynomial's byte table. Tokenizer files are a few MB at most,
// so one table lookup per byte is fast enough here (the plugin has the SSE4.2 version).
std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

}  // namespace

uint32_t crc32c_of(const void* data, size_t size) {
  static const std::array<uint32_t, 256> kTable = make_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

nlohmann::json file_record(const std::string& bytes) {
  return {{"bytes", bytes.size()},
          {"crc32c", fmt::format("{:08x}", crc32c_of(bytes.data(), bytes.size()))}};
}

std::vector<FileCheck> check_files(const fs::path& dir, const nlohmann::json& record) {
  std::vector<FileCheck> out;
  for (const auto& [name, want] : record.items()) {
    FileCheck c{name, dir / name, ""};
    const std::string fix =
        "the checkpoint's copy is damaged: copy the original file over it (the tokenizer the "
        "run trained with), or pass --tokenizer PATH to `loom generate`";
    std::error_code ec;
    if (!fs::is_regular_file(c.path, ec)) {
      c.problem = fmt::format("{} is missing (recorded at save); {}", c.path.string(), fix);
    } else {
      std::string bytes;
      try {
        bytes = read_file(c.path);
      } catch (const Error& e) {
        c.problem = fmt::format("{}; {}", e.what(), fix);
      }
      if (c.problem.empty()) {
        nlohmann::json got = file_record(bytes);
        if (got["bytes"] != want["bytes"])
          c.problem = fmt::format("{} has {} bytes but {} were saved (truncated or changed); {}",
                                  c.path.string(), bytes.size(), want["bytes"].dump(), fix);
        else if (got["crc32c"] != want["crc32c"])
          c.problem = fmt::format(
              "{} fails its CRC-32C check (stored {}, computed {}): the file is damaged; {}",
              c.path.string(), want["crc32c"].get<std::string>(), got["crc32c"].get<std::string>(),
              fix);
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace loom::core
