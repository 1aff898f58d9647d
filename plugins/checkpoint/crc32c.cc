#include "plugins/checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::checkpoint {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

// kTables[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}

constexpr Tables kTables = make_tables();

// Both implementations work on the inverted register (crc ^ 0xFFFFFFFF).
uint32_t software_raw(uint32_t reg, const unsigned char* p, size_t n) {
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian host (x86-64, aarch64)
    uint32_t lo = static_cast<uint32_t>(word) ^ reg;
    uint32_t hi = static_cast<uint32_t>(word >> 32);
    reg = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^
          kTables[4][lo >> 24] ^ kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^
          kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) reg = (reg >> 8) ^ kTables[0][(reg ^ *p++) & 0xffu];
  return reg;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t hardware_raw(uint32_t reg, const unsigned char* p,
                                                        size_t n) {
  uint64_t r = reg;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    r = _mm_crc32_u64(r, word);
    p += 8;
    n -= 8;
  }
  auto r32 = static_cast<uint32_t>(r);
  while (n-- > 0) r32 = _mm_crc32_u8(r32, *p++);
  return r32;
}

bool detect_hardware() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#else
uint32_t hardware_raw(uint32_t reg, const unsigned char* p, size_t n) {
  return software_raw(reg, p, n);
}
bool detect_hardware() { return false; }
#endif

const bool kHardware = detect_hardware();

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t reg = ~crc;
  reg = kHardware ? hardware_raw(reg, p, size) : software_raw(reg, p, size);
  return ~reg;
}

uint32_t crc32c_extend_software(uint32_t crc, const void* data, size_t size) {
  return ~software_raw(~crc, static_cast<const unsigned char*>(data), size);
}

bool crc32c_hardware() { return kHardware; }

std::string crc32c_hex(uint32_t crc) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, crc >>= 4) s[static_cast<size_t>(i)] = kDigits[crc & 0xfu];
  return s;
}

}  // namespace loom::checkpoint
