#include "plugins/checkpoint/sealed_json.h"

#include <loom/sdk.h>

#include "loom/cpp/json_input.h"
#include "plugins/checkpoint/crc32c.h"

namespace loom::checkpoint {
namespace {

constexpr const char* kLegacyPrefix = "crc32c:";
constexpr const char* kTextPrefix = "crc32c-text:";
// With dump(1) a top-level key is the only line that starts with exactly one space and a
// quote (nested keys are indented further, and strings hold no raw newline).
constexpr const char* kTextLine = "\n \"checksum\": \"crc32c-text:";
constexpr const char* kZeros = "00000000";

std::string legacy_checksum_of(const nlohmann::json& body) {
  std::string canonical = body.dump();
  return kLegacyPrefix + crc32c_hex(crc32c(canonical.data(), canonical.size()));
}

[[noreturn]] void damaged(const std::filesystem::path& file, const std::string& what,
                          const std::string& hint) {
  fail(Code::kDataLoss, file.string() + " " + what + ": the file is damaged; " + hint);
}

}  // namespace

std::string seal_json(nlohmann::json body) {
  LOOM_CHECK(body.is_object() && !body.contains("checksum"));
  body["checksum"] = std::string(kTextPrefix) + kZeros;
  std::string text = body.dump(1) + "\n";
  size_t at = text.find(kTextLine);
  LOOM_CHECK(at != std::string::npos);
  at += std::char_traits<char>::length(kTextLine);
  std::string hex = crc32c_hex(crc32c(text.data(), text.size()));
  text.replace(at, hex.size(), hex);
  return text;
}

std::string seal_json_legacy(nlohmann::json body) {
  LOOM_CHECK(body.is_object() && !body.contains("checksum"));
  body["checksum"] = legacy_checksum_of(body);
  return body.dump(1) + "\n";
}

nlohmann::json open_sealed_json(const std::string& text, const std::filesystem::path& file,
                                const std::string& hint) {
  // The text seal: checked on the bytes, before anything parses them.
  size_t line = text.find(kTextLine);
  bool text_sealed = line != std::string::npos;
  if (text_sealed) {
    size_t at = line + std::char_traits<char>::length(kTextLine);
    if (text.size() < at + 9 || text[at + 8] != '"')
      damaged(file, "has a malformed \"checksum\" entry", hint);
    std::string stored = text.substr(at, 8);
    std::string zeroed = text;
    zeroed.replace(at, 8, kZeros);
    std::string computed = crc32c_hex(crc32c(zeroed.data(), zeroed.size()));
    if (stored != computed)
      damaged(file,
              "fails its checksum (stored " + std::string(kTextPrefix) + stored + ", computed " +
                  kTextPrefix + computed + ")",
              hint);
  }
  nlohmann::json body = parse_json_input(text, file.string(), Code::kDataLoss,
                                         "the file is damaged or truncated; " + hint);
  if (!body.is_object() || !body.contains("checksum") || !body["checksum"].is_string())
    damaged(file, "has no \"checksum\" entry", hint);
  std::string stored = body["checksum"].get<std::string>();
  body.erase("checksum");
  if (text_sealed) {
    // The bytes matched; the parsed entry must be the one that was checked.
    if (stored.rfind(kTextPrefix, 0) != 0) damaged(file, "has two \"checksum\" entries", hint);
    return body;
  }
  if (stored.rfind(kLegacyPrefix, 0) != 0)
    damaged(file, "has an unknown checksum '" + stored.substr(0, 40) + "'", hint);
  std::string computed = legacy_checksum_of(body);
  if (stored != computed)
    damaged(file, "fails its checksum (stored " + stored + ", computed " + computed + ")", hint);
  return body;
}

}  // namespace loom::checkpoint
