#include "plugins/checkpoint/sealed_json.h"

#include <loom/sdk.h>

#include "plugins/checkpoint/crc32c.h"

namespace loom::checkpoint {
namespace {

constexpr const char* kPrefix = "crc32c:";

std::string checksum_of(const nlohmann::json& body) {
  std::string canonical = body.dump();
  return kPrefix + crc32c_hex(crc32c(canonical.data(), canonical.size()));
}

}  // namespace

std::string seal_json(nlohmann::json body) {
  LOOM_CHECK(body.is_object() && !body.contains("checksum"));
  body["checksum"] = checksum_of(body);
  return body.dump(1) + "\n";
}

nlohmann::json open_sealed_json(const std::string& text, const std::filesystem::path& file,
                                const std::string& hint) {
  nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    fail(Code::kDataLoss, file.string() + " is not valid JSON (damaged or truncated): " + hint);
  if (!body.is_object() || !body.contains("checksum") || !body["checksum"].is_string())
    fail(Code::kDataLoss, file.string() + " has no \"checksum\" entry: " + hint);
  std::string stored = body["checksum"].get<std::string>();
  body.erase("checksum");
  std::string computed = checksum_of(body);
  if (stored != computed)
    fail(Code::kDataLoss, file.string() + " fails its checksum (stored " + stored + ", computed " +
                              computed + "): the file is damaged; " + hint);
  return body;
}

}  // namespace loom::checkpoint
