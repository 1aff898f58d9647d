// CRC-32C: known vectors (the check value of the CRC catalogue and RFC 3720 B.4), and the
// SSE4.2 and table-driven implementations agreeing on every length and alignment.
#include "plugins/checkpoint/crc32c.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

namespace loom::checkpoint {
namespace {

TEST(Crc32c, KnownVectors) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_extend_software(0, check, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), up(32), down(32);
  std::iota(up.begin(), up.end(), 0);
  for (int i = 0; i < 32; ++i) down[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
  EXPECT_EQ(crc32c_hex(0x0000000Fu), "0000000f");
}

TEST(Crc32c, HardwareMatchesSoftware) {
  if (!crc32c_hardware()) GTEST_SKIP() << "no SSE4.2 on this CPU: only the table is used";
  std::mt19937 rng(3);
  std::vector<unsigned char> data(4096 + 16);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 16; ++offset)
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096})
      ASSERT_EQ(crc32c(data.data() + offset, n), crc32c_extend_software(0, data.data() + offset, n))
          << "offset " << offset << " length " << n;
}

TEST(Crc32c, ExtendEqualsWhole) {
  std::mt19937 rng(5);
  std::vector<unsigned char> data(1000);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {0, 1, 13, 500, 999, 1000}) {
    uint32_t a = crc32c(data.data(), cut);
    EXPECT_EQ(crc32c_extend(a, data.data() + cut, data.size() - cut), whole);
    EXPECT_EQ(crc32c_extend_software(a, data.data() + cut, data.size() - cut), whole);
  }
}

}  // namespace
}  // namespace loom::checkpoint
