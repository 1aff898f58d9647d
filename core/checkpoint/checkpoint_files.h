// Checksums of the plain files a checkpoint carries beside its tensors (its copy of the
// tokenizer): recorded in the metadata at save,
//   "files": {"tokenizer/vocab.json": {"bytes": 1042301, "crc32c": "e3069283"}, ...}
// and checked when a checkpoint is opened for generation or resumed, and by
// `loom checkpoint inspect --verify`. Checkpoints saved before the record existed have no
// "files" entry: their copies are "not recorded", not damaged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::core {

/// The CRC-32C (Castagnoli, the checksum of the checkpoint plugin's files) of `size` bytes.
uint32_t crc32c_of(const void* data, size_t size);

/// {"bytes": N, "crc32c": "xxxxxxxx"}: the record of a file holding `bytes`.
nlohmann::json file_record(const std::string& bytes);

/// The state of one recorded file of a checkpoint.
struct FileCheck {
  std::string name;            ///< as recorded: "tokenizer/vocab.json"
  std::filesystem::path path;  ///< DIR/name
  std::string problem;         ///< empty: present and intact; else what is wrong and the fix
};

/// Checks every file `record` (the metadata's "files" object, already type-checked) lists
/// under checkpoint directory `dir`: present, of the recorded size and checksum.
std::vector<FileCheck> check_files(const std::filesystem::path& dir, const nlohmann::json& record);

}  // namespace loom::core
