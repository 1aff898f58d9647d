// core/util/hash.h: hash64 against an independent Python implementation of the same
// construction (the values below; recompute them with tests/core/util/hash_oracle.py), and
// file_digest, which streams a file in blocks, against hash64 of the whole file in memory.
#include "core/util/hash.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/util/errors.h"

namespace loom::core {
namespace {

namespace fs = std::filesystem;

std::string bytes_0_to_255_times(int n) {
  std::string s;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  return s;
}

TEST(Hash64, MatchesThePythonOracle) {
  EXPECT_EQ(hash64(""), 0x9ca066f1a4ab2eeaull);
  EXPECT_EQ(hash64("a"), 0x049603088011f1b2ull);
  EXPECT_EQ(hash64("loom"), 0x5ce94c32ad076baaull);
  EXPECT_EQ(hash64("abcdefgh"), 0xdd27b0b573ead7a3ull);
  EXPECT_EQ(hash64("abcdefghi"), 0x3c9cca7ec636eb32ull);
  EXPECT_EQ(hash64(bytes_0_to_255_times(3)), 0x21fe2d1a5d484a07ull);
  EXPECT_EQ(hash64("loom", 7), 0x0be2e45ab39989e8ull);
}

// The oracle itself, run now with Debian's Python (not only its output recorded above): its
// lines are "<prefix> <len> <hex>" for the same inputs in the same order, then "seed7 <hex>".
TEST(Hash64, MatchesTheOracleRunAtTestTime) {
  const char* py = "/usr/bin/python3";
  if (!fs::exists(py)) py = "python3";
  std::string oracle = "tests/core/util/hash_oracle.py";  // runfiles: cwd is the workspace
  ASSERT_TRUE(fs::exists(oracle)) << oracle << " is not in the test's runfiles";
  std::string cmd = fmt::format("{} {}", py, oracle);
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr) << cmd;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  ASSERT_EQ(pclose(f), 0) << cmd << " failed:\n" << out;
  std::vector<uint64_t> oracle_values;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::string hex = line.substr(line.rfind(' ') + 1);
    oracle_values.push_back(std::stoull(hex, nullptr, 16));
  }
  std::vector<uint64_t> ours = {hash64(""),         hash64("a"),
                                hash64("loom"),     hash64("abcdefgh"),
                                hash64("abcdefghi"), hash64(bytes_0_to_255_times(3)),
                                hash64("loom", 7)};
  ASSERT_EQ(oracle_values.size(), ours.size()) << "oracle output:\n" << out;
  for (size_t i = 0; i < ours.size(); ++i)
    EXPECT_EQ(ours[i], oracle_values[i]) << "vector " << i << ": loom " << fmt::format(
        "{:#x}", ours[i]) << ", oracle " << fmt::format("{:#x}", oracle_values[i]);
  std::printf("hash64 matched the oracle (run now) on %zu vectors\n", ours.size());
}

TEST(Hash64, EveryFlippedBitAndEveryZeroTailChangesIt) {
  std::string s = bytes_0_to_255_times(1).substr(0, 37);
  uint64_t base = hash64(s);
  for (size_t i = 0; i < s.size(); ++i)
    for (int b = 0; b < 8; ++b) {
      std::string t = s;
      t[i] = static_cast<char>(t[i] ^ (1 << b));
      EXPECT_NE(hash64(t), base) << "byte " << i << " bit " << b;
    }
  // Tails are zero-padded inside the hash; the length keeps "a" and "a\0" apart.
  EXPECT_NE(hash64(std::string("a", 1)), hash64(std::string("a\0", 2)));
  EXPECT_NE(hash64(std::string(8, '\0')), hash64(std::string(16, '\0')));
}

class FileDigest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(tmp ? tmp : "/tmp") / "hash_test";
    fs::create_directories(dir_);
  }
  fs::path write(const std::string& name, const std::string& bytes) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  fs::path dir_;
};

TEST_F(FileDigest, EqualsHash64OfTheWholeFileAcrossBlockBoundaries) {
  const size_t block = size_t{1} << 20;  // hash.cc reads 1 MiB at a time
  std::string pattern = bytes_0_to_255_times(1);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{13}, block - 3, block,
                   block + 5, 3 * block + 7}) {
    std::string bytes;
    bytes.reserve(n);
    for (size_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>(pattern[i % 256] ^ (i >> 8)));
    fs::path p = write(fmt::format("f{}", n), bytes);
    EXPECT_EQ(file_digest(p), fmt::format("loom64:{:016x}", hash64(bytes))) << n << " bytes";
  }
}

TEST_F(FileDigest, AMissingFileNamesItself) {
  fs::path p = dir_ / "no_such.so";
  try {
    file_digest(p);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(p.string()));
  }
}

}  // namespace
}  // namespace loom::core
