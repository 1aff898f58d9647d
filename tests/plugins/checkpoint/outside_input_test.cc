// Checkpoint files from outside, read without trust: JSON nested 100,000 deep (with a right
// or a wrong checksum), fields of the wrong type or size behind a valid checksum, the
// "crc32c-text:" seal checked on the bytes, and checkpoints sealed the old way ("crc32c:"
// over a re-dump) still loading. Every case prints the message it got.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "plugins/checkpoint/crc32c.h"
#include "plugins/checkpoint/sealed_json.h"
#include "tests/plugins/checkpoint/checkpoint_env.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

const std::string kDeep = std::string(100000, '[') + std::string(100000, ']');

class OutsideInput : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(5);
    a = random_tensor("model.a", DType::kF32, {4, 3}, rng);
    dir = fresh_dir("outside_input");
    std::vector<OwnedTensor> r0 = {a};
    ASSERT_EQ(save(format, dir, r0, metadata_for({a}), 0, 1).code, Code::kOk);
  }
  Outcome read_metadata() {
    nlohmann::json ignored;
    Outcome o = metadata(format, dir, &ignored);
    std::printf("  -> %s: %s\n", code_name(o.code), o.message.substr(0, 300).c_str());
    return o;
  }
  Outcome load_a() {
    std::vector<OwnedTensor> r = {request("model.a", DType::kF32, {4, 3}, {0, 0}, {4, 3})};
    Outcome o = load(format, dir, r);
    if (o.code == Code::kOk) {
      EXPECT_EQ(r[0].bytes, a.bytes);
    }
    return o;
  }
  // The body of sealed file `name`, as the plugin reads it.
  nlohmann::json body(const std::string& name) {
    return checkpoint::open_sealed_json(read_bytes(dir / name), dir / name, "");
  }

  CheckpointEnv env;
  Format format = env.format({{"impl", "sharded"}});
  OwnedTensor a;
  fs::path dir;
};

bool mentions(const Outcome& o, const std::string& text) {
  return o.message.find(text) != std::string::npos;
}

// The new seal is the CRC-32C of the file's bytes with its own eight digits zeroed.
TEST_F(OutsideInput, TextSealIsTheCrcOfTheBytes) {
  for (const char* name : {"metadata.json", "shards/rank_00000.json"}) {
    std::string text = read_bytes(dir / name);
    const std::string key = "\n \"checksum\": \"crc32c-text:";
    size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos) << text;
    at += key.size();
    std::string stored = text.substr(at, 8), zeroed = text;
    zeroed.replace(at, 8, "00000000");
    std::string oracle = checkpoint::crc32c_hex(checkpoint::crc32c(zeroed.data(), zeroed.size()));
    std::printf("%s: stored %s, oracle %s\n", name, stored.c_str(), oracle.c_str());
    EXPECT_EQ(stored, oracle);
  }
}

// JSON nested 100,000 deep anywhere: with the new seal the checksum fails before anything
// parses; with an old-style (or no) seal the depth cap refuses it. Never a crash.
TEST_F(OutsideInput, DeepNestingIsDataLoss) {
  for (const char* name : {"metadata.json", "shards/rank_00000.json"}) {
    SCOPED_TRACE(name);
    std::string original = read_bytes(dir / name);
    // Inside the body, the seal left as it was: the checksum fails.
    std::string text = original;
    size_t brace = text.find('{');
    text.insert(brace + 1, "\"deep\": " + kDeep + ",");
    write_bytes(dir / name, text);
    Outcome o = read_metadata();
    EXPECT_EQ(o.code, Code::kDataLoss);
    EXPECT_TRUE(mentions(o, name) && mentions(o, "fails its checksum")) << o.message;
    // With an old-style seal (re-dump): the depth cap, naming the line and column.
    write_bytes(dir / name, "{\"checksum\": \"crc32c:00000000\",\n \"deep\": " + kDeep + "}");
    o = read_metadata();
    EXPECT_EQ(o.code, Code::kDataLoss);
    EXPECT_TRUE(mentions(o, name) && mentions(o, ":2:") && mentions(o, "deeper than 256"))
        << o.message;
    // The whole file one deep array.
    write_bytes(dir / name, kDeep);
    o = read_metadata();
    EXPECT_EQ(o.code, Code::kDataLoss);
    EXPECT_TRUE(mentions(o, name) && mentions(o, "deeper than 256")) << o.message;
    write_bytes(dir / name, original);
  }
  EXPECT_EQ(load_a().code, Code::kOk);
}

// Checkpoints sealed before the text seal ("crc32c:" over the compact re-dump) still load,
// and damage to them is still caught.
TEST_F(OutsideInput, OldSealStillLoads) {
  for (const char* name : {"metadata.json", "shards/rank_00000.json"})
    write_bytes(dir / name, checkpoint::seal_json_legacy(body(name)));
  std::string meta = read_bytes(dir / "metadata.json");
  ASSERT_NE(meta.find("\"crc32c:"), std::string::npos) << meta;
  ASSERT_EQ(meta.find("crc32c-text:"), std::string::npos) << meta;
  Outcome o = read_metadata();
  EXPECT_EQ(o.code, Code::kOk);
  EXPECT_EQ(load_a().code, Code::kOk);
  // A changed value under the old seal.
  size_t at = meta.find("\"iteration\": 7");
  ASSERT_NE(at, std::string::npos) << meta;
  meta[at + 13] = '8';
  write_bytes(dir / "metadata.json", meta);
  o = read_metadata();
  EXPECT_EQ(o.code, Code::kDataLoss);
  EXPECT_TRUE(mentions(o, "metadata.json") && mentions(o, "fails its checksum")) << o.message;
}

// Fields of the wrong type or size behind a valid checksum are data loss naming the file
// and the place, not nlohmann's type_error.
TEST_F(OutsideInput, WrongFieldsBehindAValidSealAreDataLoss) {
  struct Case {
    const char* file;
    const char* pointer;  // JSON pointer of the value replaced
    nlohmann::json value;
    const char* expect;
  };
  const Case cases[] = {
      {"metadata.json", "/world", "2", "/world: expected an integer"},
      {"metadata.json", "/world", nlohmann::json::array(), "/world: expected an integer"},
      {"metadata.json", "/world", int64_t{1} << 40, "/world: integer"},
      {"metadata.json", "/version", nlohmann::json::object(), "/version: expected an integer"},
      {"metadata.json", "/loom", "", "/loom: expected an object"},
      {"shards/rank_00000.json", "/tensors/0/shape", nlohmann::json::array({-1, 3}),
       "negative extent"},
      {"shards/rank_00000.json", "/tensors/0/shape",
       nlohmann::json::array({(int64_t{1} << 53) + 1, 3}), "more than 2^40"},
      {"shards/rank_00000.json", "/tensors/0/global_shape",
       nlohmann::json::array({int64_t{1} << 40, int64_t{1} << 40}), "too large"},
      {"shards/rank_00000.json", "/tensors/0/shape", false, "/shape: expected an array of integers"},
      {"shards/rank_00000.json", "/tensors/0", nlohmann::json::array(), "lacks \"name\""},
      {"shards/rank_00000.json", "/tensors", "", "lacks its \"tensors\" list"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + c.pointer);
    std::string original = read_bytes(dir / c.file);
    nlohmann::json b = body(c.file);
    b[nlohmann::json::json_pointer(c.pointer)] = c.value;
    write_bytes(dir / c.file, checkpoint::seal_json(b));
    std::printf("%s %s = %s\n", c.file, c.pointer, c.value.dump().c_str());
    Outcome o = read_metadata();
    EXPECT_EQ(o.code, Code::kDataLoss);
    EXPECT_TRUE(mentions(o, fs::path(c.file).filename().string()) && mentions(o, c.expect))
        << o.message;
    write_bytes(dir / c.file, original);
  }
  EXPECT_EQ(load_a().code, Code::kOk);
}

}  // namespace
}  // namespace loom::testing
