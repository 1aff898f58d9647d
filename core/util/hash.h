// Stable hashes for names of cached files (std::hash may differ between builds).
#pragma once

#include <cstdint>
#include <string_view>

namespace loom::core {

/// 64-bit FNV-1a of `bytes`.
inline uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace loom::core
