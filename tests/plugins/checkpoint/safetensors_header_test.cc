// The checkpoint plugin's safetensors files on top of the SDK's codec (whose header checks,
// malformed headers and random mutations are tested in tests/sdk/safetensors_test.cc): the
// codec's checks as the reader meets them (a malformed header is kDataLoss naming the file,
// a missing file kNotFound), and a written file reads back with its CRC-32Cs, which catch a
// flipped bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "plugins/checkpoint/safetensors_file.h"

namespace loom::checkpoint {
namespace {

namespace fs = std::filesystem;

fs::path temp(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return fs::path(tmp != nullptr ? tmp : "/tmp") / name;
}

std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header.size() >> (8 * i));
  return out + header + data;
}

TEST(SafetensorsHeader, FileLevelChecks) {
  fs::path path = temp("file_level.safetensors");
  auto open = [&](const std::string& bytes) -> std::string {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      SafetensorsReader reader(path);
      return "";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
      return code_name(e.code());
    }
  };
  EXPECT_EQ(open("abc"), "data_loss");
  EXPECT_EQ(open(std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + "{}"), "data_loss");
  EXPECT_EQ(open(file_bytes("{}", "")), "");
  std::string header = R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  EXPECT_EQ(open(file_bytes(header, "abcd")), "");
  EXPECT_EQ(open(file_bytes(header, "abc")), "data_loss");  // truncated data
  EXPECT_EQ(open(file_bytes(R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                            R"("w":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
                            "abcdefgh")),
            "data_loss");  // a malformed header
  std::string crcs = R"({"__metadata__":{"crc32c":"{\"w\":\"xyz\"}"},)"
                     R"("w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  EXPECT_EQ(open(file_bytes(crcs, "abcd")), "data_loss");  // a malformed CRC-32C
  fs::remove(path);
  try {
    SafetensorsReader missing(path);
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kNotFound);
  }
}

TEST(SafetensorsHeader, WriteThenReadBack) {
  fs::path path = temp("written.safetensors");
  float a[3] = {1, 2, 3};
  uint16_t b[2] = {7, 9};
  write_safetensors(
      path,
      {{"z", DType::kF32, {3}, [&](unsigned char* out) { std::memcpy(out, a, 12); }},
       {"y", DType::kBF16, {1, 2}, [&](unsigned char* out) { std::memcpy(out, b, 4); }}},
      {{"format", "pt"}});
  SafetensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), 2u);
  const SafetensorsTensor* y = reader.find("y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(y->begin, 0u);  // name order
  EXPECT_EQ(y->st_dtype, "BF16");
  EXPECT_EQ(std::memcmp(reader.bytes(*reader.find("z")), a, 12), 0);
  EXPECT_EQ(reader.metadata()["format"], "pt");
  EXPECT_NE(reader.metadata()["crc32c"].get<std::string>().find("\"z\""), std::string::npos);
  reader.verify(*reader.find("z"), "");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // data 8-byte aligned
  // A flipped bit in the data fails the stored CRC-32C of that tensor only.
  bytes[8 + n + 4 + 5] ^= 0x04;  // inside "z" (after y's 4 bytes)
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  SafetensorsReader damaged(path);
  damaged.verify(*damaged.find("y"), "");
  try {
    damaged.verify(*damaged.find("z"), " (context)");
    ADD_FAILURE() << "the flipped bit went unnoticed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kDataLoss);
    EXPECT_NE(std::string(e.what()).find("tensor 'z' (context) fails its CRC-32C"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::checkpoint
