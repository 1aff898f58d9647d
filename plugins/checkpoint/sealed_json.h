// JSON files that carry their own checksum ("sealed"): the object's other keys are the
// body, and the top-level "checksum" entry seals it.
//
// Two seals exist:
//   "crc32c-text:XXXXXXXX" (written since the format hardening): the CRC-32C of the file's
//      bytes as written (dump with indent 1), with the eight hex digits of this very entry
//      replaced by "00000000". It is verified on the bytes before the text is parsed, so
//      damage of any kind (a flipped bit, a cut, nesting 100,000 deep) is caught without
//      trusting the text.
//   "crc32c:XXXXXXXX" (older checkpoints, still read): the CRC-32C of the body's compact
//      dump (keys sorted, numbers in their shortest round-trip form), recomputed from the
//      parsed body. Parsing is depth-capped (json_input.h), so the re-dump is safe.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::checkpoint {

/// The text of `body` (an object without "checksum") sealed with a "crc32c-text:" checksum.
std::string seal_json(nlohmann::json body);

/// The text of `body` sealed the old way ("crc32c:" over the compact re-dump), as loom wrote
/// it before the text seal; kept for tests that check old checkpoints still load.
std::string seal_json_legacy(nlohmann::json body);

/// Verifies and parses `text`, read from `file`; returns the body (without "checksum").
/// Damage is Error(kDataLoss) naming `file` and ending with `hint` (what the user can do).
nlohmann::json open_sealed_json(const std::string& text, const std::filesystem::path& file,
                                const std::string& hint);

}  // namespace loom::checkpoint
