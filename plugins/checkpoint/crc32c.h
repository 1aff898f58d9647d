// CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected 0x82F63B78, initial and final
// XOR 0xFFFFFFFF), the checksum of iSCSI, ext4 metadata and TensorFlow's checkpoints. It is
// computed with the SSE4.2 `crc32` instruction when the CPU has it (checked once, at run
// time) and by a slicing-by-8 table otherwise; both give identical results.
//
//   crc32c("123456789", 9) == 0xE3069283
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <string>

namespace loom::checkpoint {

/// Extends `crc` (the CRC-32C of the bytes before, 0 for none) with `size` bytes at `data`.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);

/// The CRC-32C of `size` bytes at `data`.
inline uint32_t crc32c(const void* data, size_t size) { return crc32c_extend(0, data, size); }

/// The table-driven implementation (for tests: it must agree with the hardware one).
uint32_t crc32c_extend_software(uint32_t crc, const void* data, size_t size);

/// True when crc32c_extend uses the SSE4.2 instruction on this CPU.
bool crc32c_hardware();

/// "e3069283": eight lower-case hex digits, as written into index and metadata files.
std::string crc32c_hex(uint32_t crc);

}  // namespace loom::checkpoint
