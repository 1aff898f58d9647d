// JSON files that carry their own checksum ("sealed"): the object's other keys are the
// body, and "checksum" is "crc32c:XXXXXXXX" over the body's canonical text (nlohmann's
// compact dump: keys sorted, numbers in their shortest round-trip form). Reading parses the
// file, recomputes the checksum from the parsed body and compares, so any bit flip that
// changes a value (or breaks the JSON) is detected.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::checkpoint {

/// The text of `body` (an object without "checksum") sealed with its checksum.
std::string seal_json(nlohmann::json body);

/// Parses and verifies `text`, read from `file`; returns the body (without "checksum").
/// Damage is Error(kDataLoss) naming `file` and ending with `hint` (what the user can do).
nlohmann::json open_sealed_json(const std::string& text, const std::filesystem::path& file,
                                const std::string& hint);

}  // namespace loom::checkpoint
