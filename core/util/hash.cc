#include "core/util/hash.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "core/util/errors.h"

namespace loom::core {
namespace {

constexpr uint64_t kMul1 = 0x87c37b91114253d5ull;
constexpr uint64_t kMul2 = 0x4cf5ad432745937full;

constexpr uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// The final avalanche: every input bit flips each output bit with probability about 1/2.
constexpr uint64_t finish(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

// Streaming state: words are mixed in as they come; `total` counts every byte.
struct Hasher {
  uint64_t h;
  uint64_t total = 0;

  explicit Hasher(uint64_t seed) : h(seed ^ 0x9e3779b97f4a7c15ull) {}

  void word(uint64_t w) {
    w *= kMul1;
    w = rotl(w, 31);
    w *= kMul2;
    h ^= w;
    h = rotl(h, 27) * 5 + 0x52dce729;
  }
  // Whole words of `bytes` (its length must be a multiple of 8).
  void words(const char* bytes, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      uint64_t w;
      std::memcpy(&w, bytes + i, 8);
      word(w);
    }
    total += n;
  }
  uint64_t end(const char* tail, size_t n) {
    uint64_t w = 0;
    std::memcpy(&w, tail, n);  // n < 8; zero-padded, the length below tells tails apart
    if (n > 0) word(w);
    total += n;
    return finish(h ^ total);
  }
};

}  // namespace

uint64_t hash64(std::string_view bytes, uint64_t seed) {
  Hasher s(seed);
  size_t whole = bytes.size() & ~size_t{7};
  s.words(bytes.data(), whole);
  return s.end(bytes.data() + whole, bytes.size() - whole);
}

std::string file_digest(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError(fmt::format("{}: cannot open for reading; check that it exists and is readable",
                              path.string()));
  Hasher s(0);
  std::vector<char> block(1 << 20);
  size_t pending = 0;  // bytes in block not yet hashed (fewer than 8 after each round)
  while (in) {
    in.read(block.data() + pending, static_cast<std::streamsize>(block.size() - pending));
    size_t have = pending + static_cast<size_t>(in.gcount());
    size_t whole = have & ~size_t{7};
    s.words(block.data(), whole);
    pending = have - whole;
    std::memmove(block.data(), block.data() + whole, pending);
  }
  if (in.bad())
    throw IoError(fmt::format("{}: read failed; check the disk and the file", path.string()));
  return fmt::format("loom64:{:016x}", s.end(block.data(), pending));
}

}  // namespace loom::core
