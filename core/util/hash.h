// Stable hashes: names of cached files and fingerprints of plugin files (std::hash may differ
// between builds, so neither can use it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace loom::core {

/// 64-bit FNV-1a of `bytes`. Byte at a time: for short keys (cache names).
inline uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

/// A 64-bit hash of `bytes` that reads eight bytes at a time (multiply-rotate mixing of each
/// word, a full avalanche at the end). For large inputs such as shared objects, where
/// fnv1a64 would take seconds in a sanitizer build. Not cryptographic.
uint64_t hash64(std::string_view bytes, uint64_t seed = 0);

/// The fingerprint of a file's contents: "loom64:" and hash64 of its bytes in hexadecimal,
/// read in blocks (the file is never held whole). Throws IoError naming the file when it
/// cannot be read.
std::string file_digest(const std::filesystem::path& path);

}  // namespace loom::core
