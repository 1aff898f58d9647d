// The safetensors codec (sdk loom/cpp/safetensors.h): a valid header reads back; every
// malformed header (bad JSON, duplicate names, unknown dtypes, offsets outside the data, sizes
// that do not match the shape, overlaps, gaps, bad metadata) and every file whose header does
// not fit it is kDataLoss naming the file and the tensor; random mutations of a valid header
// never crash (run it under --config=asan); a header built for a list of tensors reads back as
// them. The checkpoint plugin's reader and writer on top of it (mapping, CRC-32C) are tested
// in tests/plugins/checkpoint/safetensors_header_test.cc.
#include "loom/cpp/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace loom {
namespace {

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

std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header.size() >> (8 * i));
  return out + header + data;
}

// The outcome of parse_safetensors on the file `bytes`, as parse() gives it.
std::string parse_file(const std::string& bytes) {
  try {
    parse_safetensors(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                      "f.safetensors");
    return "";
  } catch (const Error& e) {
    return std::string(code_name(e.code())) + ": " + e.what();
  }
}

TEST(SafetensorsDtypes, NamesBothWays) {
  EXPECT_STREQ(safetensors_dtype(DType::kF32), "F32");
  EXPECT_STREQ(safetensors_dtype(DType::kBF16), "BF16");
  EXPECT_STREQ(safetensors_dtype(DType::kF8E4M3), "F8_E4M3");
  EXPECT_STREQ(safetensors_dtype(DType::kBool), "BOOL");
  for (const SafetensorsDtype& d : kSafetensorsDtypes) {
    ASSERT_EQ(find_safetensors_dtype(d.name), &d) << d.name;
    if (d.dtype == DType::kInvalid) continue;
    EXPECT_STREQ(safetensors_dtype(d.dtype), d.name);
    EXPECT_EQ(d.size, dtype_size(d.dtype)) << d.name;
  }
  EXPECT_EQ(find_safetensors_dtype("U32")->dtype, DType::kInvalid);  // known, not loom's
  EXPECT_EQ(find_safetensors_dtype("f32"), nullptr);                 // names are upper case
  try {
    safetensors_dtype(DType::kInvalid);
    ADD_FAILURE() << "kInvalid has a safetensors name";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kUnimplemented);
    EXPECT_NE(std::string(e.what()).find("safetensors has no dtype for invalid"),
              std::string::npos);
  }
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

TEST(SafetensorsHeader, FileBounds) {
  EXPECT_EQ(parse_file(file_bytes("{}", "")), "");
  std::string header = R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  EXPECT_EQ(parse_file(file_bytes(header, "abcd")), "");
  const std::string prefix = "data_loss: f.safetensors: ";
  std::string got = parse_file("abc");
  EXPECT_EQ(got.rfind(prefix + "the file is 3 bytes long", 0), 0u) << got;
  got = parse_file(std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + "{}");
  EXPECT_EQ(got.rfind(prefix + "the header length 4294967295 exceeds the file", 0), 0u) << got;
  // A header longer than 100 MiB is refused before it is read, however long the file.
  std::string long_header(8, '\0');
  long_header[3] = 0x07;  // 0x07000000 bytes: 112 MiB
  got = parse_file(long_header);
  EXPECT_EQ(got.rfind(prefix + "the header length 117440512", 0), 0u) << got;
  got = parse_file(file_bytes(header, "abc"));  // truncated data
  EXPECT_EQ(got.rfind(prefix + "tensor 'w' has data_offsets [0, 4] outside the 3", 0), 0u) << got;
  EXPECT_NE(got.find("export it again"), std::string::npos) << got;
}

TEST(SafetensorsHeader, LayoutLocatesTheData) {
  std::string header = R"({"__metadata__":{"format":"pt"},)"
                       R"("a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                       R"("b":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}})";
  std::string bytes = file_bytes(header, "xyzw");
  SafetensorsLayout layout = parse_safetensors(reinterpret_cast<const unsigned char*>(bytes.data()),
                                               bytes.size(), "f.safetensors");
  EXPECT_EQ(layout.data_offset, 8 + header.size());
  ASSERT_EQ(layout.tensors.size(), 2u);
  const SafetensorsTensor& b = layout.tensors.at("b");
  EXPECT_EQ(bytes[layout.data_offset + b.begin], 'w');
  EXPECT_EQ(b.dtype, DType::kU8);
  EXPECT_EQ(b.st_dtype, "U8");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(layout.metadata["format"], "pt");
}

TEST(SafetensorsHeader, BuiltHeadersReadBack) {
  std::vector<SafetensorsEntry> entries = {
      {"z", DType::kF32, {3}}, {"y", DType::kBF16, {1, 2}}, {"s", DType::kI64, {}}};
  sort_safetensors(entries);
  ASSERT_EQ(entries.front().name, "s");
  std::string head = build_safetensors_header(entries, {{"format", "pt"}});
  uint64_t n = 0;
  std::memcpy(&n, head.data(), 8);
  EXPECT_EQ(n, head.size() - 8);
  EXPECT_EQ(head.size() % 8, 0u);  // the data starts 8-byte aligned
  const uint64_t data_size = 8 + 4 + 12;
  EXPECT_EQ(safetensors_bytes(DType::kF32, {3}), 12u);
  EXPECT_EQ(safetensors_bytes(DType::kI64, {}), 8u);
  std::string bytes = head + std::string(data_size, '\x01');
  SafetensorsLayout layout = parse_safetensors(reinterpret_cast<const unsigned char*>(bytes.data()),
                                               bytes.size(), "built.safetensors");
  // Stored in name order, one after the other.
  EXPECT_EQ(layout.tensors.at("s").begin, 0u);
  EXPECT_EQ(layout.tensors.at("y").begin, 8u);
  EXPECT_EQ(layout.tensors.at("z").begin, 12u);
  EXPECT_EQ(layout.tensors.at("z").end, data_size);
  EXPECT_EQ(layout.tensors.at("y").shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(layout.tensors.at("y").st_dtype, "BF16");
  EXPECT_EQ(layout.metadata, (nlohmann::json{{"format", "pt"}}));
  // No "__metadata__" when there is none; none of the tensors is empty.
  std::string bare = build_safetensors_header({}, {});
  EXPECT_EQ(bare.substr(8), "{}      ");
}

TEST(SafetensorsHeader, BuildRefusesUnsortedOrRepeatedNames) {
  for (const std::vector<SafetensorsEntry>& entries :
       {std::vector<SafetensorsEntry>{{"b", DType::kF32, {1}}, {"a", DType::kF32, {1}}},
        std::vector<SafetensorsEntry>{{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}}) {
    try {
      build_safetensors_header(entries, {});
      ADD_FAILURE() << "built a header for " << entries[0].name << ", " << entries[1].name;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Code::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("in name order, each name once"), std::string::npos)
          << e.what();
    }
  }
  try {
    build_safetensors_header({{"a", DType::kInvalid, {1}}}, {});
    ADD_FAILURE() << "built a header for an invalid dtype";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kUnimplemented);
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

// A header nested 100,000 deep (or holding a number beyond double) is a damaged file, not a
// stack overflow or an escaped nlohmann exception; nesting up to the cap still parses as
// JSON (and is then refused for its content).
TEST(SafetensorsHeader, DeepOrHugeHeadersAreDataLoss) {
  struct Case {
    std::string header;
    const char* problem;
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string deep_in_tensor = R"({"a": {"dtype": "F32", "shape": )" +
                                     std::string(100000, '[') + std::string(100000, ']') +
                                     R"(, "data_offsets": [0, 4]}})";
  const std::string at_cap = R"({"a": {"dtype": "F32", "x": )" + std::string(254, '[') +
                             std::string(254, ']') + R"(, "shape": [1], "data_offsets": [0, 4]}})";
  const std::string past_cap = R"({"a": {"dtype": "F32", "x": )" + std::string(255, '[') +
                               std::string(255, ']') +
                               R"(, "shape": [1], "data_offsets": [0, 4]}})";
  const Case cases[] = {
      {deep, "deeper than 256 levels at byte 256"},
      {deep_in_tensor, "deeper than 256 levels"},
      {past_cap, "deeper than 256 levels"},
      // nlohmann refuses a number beyond double like a syntax error (no exception escapes).
      {R"({"a": {"dtype": "F32", "shape": [1e309], "data_offsets": [0, 4]}})", "not a JSON object"},
  };
  for (const Case& c : cases) {
    std::string got = parse(c.header, 4);
    std::printf("%zu-byte header -> %s\n", c.header.size(), got.substr(0, 160).c_str());
    EXPECT_EQ(got.rfind("data_loss: x.safetensors: ", 0), 0u) << got.substr(0, 200);
    EXPECT_NE(got.find(c.problem), std::string::npos) << got.substr(0, 200);
  }
  // 256 levels in all (the object, the tensor, 254 arrays) is within the cap: it parses.
  std::string got = parse(at_cap, 4);
  std::printf("at the cap -> '%s'\n", got.c_str());
  EXPECT_EQ(got, "");
  // Through the whole-file entry point too.
  got = parse_file(file_bytes(deep, ""));
  std::printf("deep file -> %s\n", got.substr(0, 160).c_str());
  EXPECT_NE(got.find("deeper than 256"), std::string::npos) << got.substr(0, 200);
}

}  // namespace
}  // namespace loom
