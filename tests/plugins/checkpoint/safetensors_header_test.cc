// Safetensors headers: a valid file reads back; every malformed header (bad JSON, duplicate
// names, unknown dtypes, offsets outside the data, sizes that do not match the shape,
// overlaps, gaps, bad metadata) is kDataLoss naming the file and the tensor; and random
// mutations of a valid header never crash (run it under --config=asan).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "plugins/checkpoint/safetensors_file.h"

namespace loom::checkpoint {
namespace {

namespace fs = std::filesystem;

// The outcome of parsing `header` for `data_size` bytes: "" when valid, else the code
// name and message.
std::string parse(const std::string& header, uint64_t data_size) {
  nlohmann::json metadata;
  try {
    parse_safetensors_header(header, data_size, "x.safetensors", &metadata);
    return "";
  } catch (const Error& e) {
    return std::string(code_name(e.code())) + ": " + e.what();
  }
}

fs::path temp(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return fs::path(tmp != nullptr ? tmp : "/tmp") / name;
}

TEST(SafetensorsHeader, ValidHeaders) {
  EXPECT_EQ(parse(R"({})", 0), "");
  EXPECT_EQ(parse(R"({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 3],
                      "data_offsets": [0, 24]}, "b": {"dtype": "BF16", "shape": [],
                      "data_offsets": [24, 26]}, "e": {"dtype": "I8", "shape": [0],
                      "data_offsets": [26, 26]}})",
                  26),
            "");
}

TEST(SafetensorsHeader, MalformedHeadersAreDataLoss) {
  struct Case {
    const char* header;
    uint64_t data_size;
    const char* problem;
  };
  const Case cases[] = {
      {R"(not json)", 0, "not a JSON object"},
      {R"([1, 2])", 0, "not a JSON object"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       8, "'a' twice"},
      {R"({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}})", 4, "unknown dtype 'Q7'"},
      {R"({"a": {"dtype": "F32", "shape": [1]}})", 4, "tensor 'a' lacks"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4, "tensor 'a' lacks"},
      {R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, "bad shape"},
      {R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4, "bad shape"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 4]}})", 4, "bad data_offsets"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8, "outside"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 6, "outside"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4, "need 8"},
      {R"({"a": {"dtype": "F32", "shape": [1, 1, 1, 1, 1, 1, 1, 1, 1],
           "data_offsets": [0, 4]}})",
       4, "more than 8 dimensions"},
      {R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 8],
           "data_offsets": [0, 4]}})",
       4, "too large"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
       6, "overlaps"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [6, 10]}})",
       10, "a gap"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 6, "end at byte 4 of 6"},
      {R"({"__metadata__": [1]})", 0, "\"__metadata__\" is not an object"},
      {R"({"__metadata__": {"n": 1}})", 0, "entry 'n' is not a string"},
  };
  for (const Case& c : cases) {
    std::string got = parse(c.header, c.data_size);
    EXPECT_EQ(got.rfind("data_loss: x.safetensors: ", 0), 0u) << c.header << " -> " << got;
    EXPECT_NE(got.find(c.problem), std::string::npos) << c.header << " -> " << got;
  }
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

TEST(SafetensorsHeader, RandomMutationsNeverCrash) {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}})";
  ASSERT_EQ(parse(header, 22), "");
  std::mt19937 rng(7);
  const char alphabet[] = "{}[]\",:0123456789-.eE aFBI";
  int rejected = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    std::string h = header;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      size_t at = rng() % h.size();
      switch (rng() % 3) {
        case 0:
          h[at] = alphabet[rng() % (sizeof(alphabet) - 1)];
          break;
        case 1:
          h.erase(at, 1);
          break;
        default:
          h.insert(at, 1, alphabet[rng() % (sizeof(alphabet) - 1)]);
          break;
      }
    }
    std::string got = parse(h, 22);
    if (got.empty()) continue;
    ++rejected;
    ASSERT_EQ(got.rfind("data_loss: ", 0), 0u) << h << " -> " << got;
  }
  EXPECT_GT(rejected, 4000);
}

}  // namespace
}  // namespace loom::checkpoint
