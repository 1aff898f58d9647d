// Damage to a sharded checkpoint is detected and reported with the right code and a
// message naming the file (and the tensor where there is one): a truncated or bit-flipped
// .bin, any single flipped bit in an index or in metadata.json, missing files, an index in
// the wrong place, and requests that do not match what was saved.
#include <gtest/gtest.h>

#include <fstream>

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

bool mentions(const Outcome& o, const std::string& text) {
  return o.message.find(text) != std::string::npos;
}

class ShardedDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(99);
    a = random_tensor("model.a", DType::kF32, {8, 4}, rng);
    b = random_tensor("model.b", DType::kBF16, {16}, rng);
    c = random_tensor("model.c", DType::kF32, {3}, rng);
    exp_avg = random_tensor("optim.exp_avg.a", DType::kF32, {8, 4}, rng);
    meta = metadata_for({a, b, c, exp_avg});
    meta["spec"] = {{"optimizer", {{"lr", 0.001}, {"eps", 1e-08}}}};
    dir = fresh_dir("sharded_damage");
    std::vector<OwnedTensor> r0 = {a, b, slice_of(exp_avg, {0, 0}, {4, 4})};
    std::vector<OwnedTensor> r1 = {c, slice_of(exp_avg, {4, 0}, {4, 4})};
    ASSERT_EQ(save(format, dir, r0, meta, 0, 2).code, Code::kOk);
    ASSERT_EQ(save(format, dir, r1, meta, 1, 2).code, Code::kOk);
  }

  Outcome load_one(const OwnedTensor& t) {
    std::vector<OwnedTensor> r = {request(t.name, t.dtype, t.global_shape, t.offset, t.shape)};
    return load(format, dir, r);
  }
  Outcome read_metadata() {
    nlohmann::json ignored;
    return metadata(format, dir, &ignored);
  }

 public:
  Format& format_ref() { return format; }
  const fs::path& dir_ref() const { return dir; }

 protected:
  CheckpointEnv env;
  Format format = env.format({{"impl", "sharded"}});
  OwnedTensor a, b, c, exp_avg;
  nlohmann::json meta;
  fs::path dir;
};

TEST_F(ShardedDamage, IntactLoadsEverything) {
  for (const OwnedTensor* t : {&a, &b, &c, &exp_avg}) {
    Outcome o = load_one(*t);
    EXPECT_EQ(o.code, Code::kOk) << t->name << ": " << o.message;
  }
}

TEST_F(ShardedDamage, TruncatedBin) {
  fs::path bin = dir / "shards/rank_00000.bin";
  fs::resize_file(bin, fs::file_size(bin) - 10);
  for (Outcome o : {load_one(a), read_metadata()}) {
    EXPECT_EQ(o.code, Code::kDataLoss);
    EXPECT_TRUE(mentions(o, "rank_00000.bin")) << o.message;
    EXPECT_TRUE(mentions(o, "truncated")) << o.message;
    EXPECT_TRUE(mentions(o, "'optim.exp_avg.a' [0:4, 0:4]")) << o.message;  // the last tensor
  }
}

TEST_F(ShardedDamage, FlippedBitInBin) {
  nlohmann::json index = nlohmann::json::parse(read_bytes(dir / "shards/rank_00000.json"));
  uint64_t offset = index["tensors"][0]["byte_offset"].get<uint64_t>() + 37;  // inside model.a
  fs::path bin = dir / "shards/rank_00000.bin";
  std::string bytes = read_bytes(bin);
  bytes[offset] ^= 0x10;
  write_bytes(bin, bytes);
  Outcome o = load_one(a);
  EXPECT_EQ(o.code, Code::kDataLoss);
  EXPECT_TRUE(mentions(o, "rank_00000.bin")) << o.message;
  EXPECT_TRUE(mentions(o, "'model.a'")) << o.message;
  EXPECT_TRUE(mentions(o, "CRC-32C")) << o.message;
  EXPECT_EQ(load_one(b).code, Code::kOk);  // other tensors of the same file are intact
}

// Flipping any one bit of a sealed JSON file breaks its JSON or its checksum.
void expect_every_flip_detected(ShardedDamage* test, const fs::path& file, const std::string& name,
                                int bit, int stride) {
  std::string original = read_bytes(file);
  for (size_t i = 0; i < original.size(); i += static_cast<size_t>(stride)) {
    std::string bytes = original;
    bytes[i] = static_cast<char>(bytes[i] ^ (1 << bit));
    write_bytes(file, bytes);
    nlohmann::json ignored;
    Outcome o = metadata(test->format_ref(), test->dir_ref(), &ignored);
    ASSERT_EQ(o.code, Code::kDataLoss) << "byte " << i << " bit " << bit << ": " << o.message;
    ASSERT_TRUE(mentions(o, name)) << o.message;
  }
  write_bytes(file, original);
}

TEST_F(ShardedDamage, AnyFlippedBitInAnIndex) {
  for (int bit : {0, 1, 6})
    expect_every_flip_detected(this, dir / "shards/rank_00001.json", "rank_00001.json", bit, 1);
  EXPECT_EQ(load_one(c).code, Code::kOk);
}

TEST_F(ShardedDamage, AnyFlippedBitInMetadata) {
  for (int bit : {0, 3, 7})
    expect_every_flip_detected(this, dir / "metadata.json", "metadata.json", bit, 1);
  EXPECT_EQ(read_metadata().code, Code::kOk);
}

TEST_F(ShardedDamage, MissingFiles) {
  for (const char* name : {"shards/rank_00001.bin", "shards/rank_00001.json"}) {
    std::string saved = read_bytes(dir / name);
    fs::remove(dir / name);
    for (Outcome o : {load_one(c), load_one(a), read_metadata()}) {
      EXPECT_EQ(o.code, Code::kDataLoss) << name;
      EXPECT_TRUE(mentions(o, fs::path(name).filename().string())) << o.message;
      EXPECT_TRUE(mentions(o, "missing")) << o.message;
    }
    write_bytes(dir / name, saved);
  }
  fs::remove(dir / "metadata.json");
  Outcome o = load_one(a);
  EXPECT_EQ(o.code, Code::kNotFound);
  EXPECT_TRUE(mentions(o, "metadata.json")) << o.message;
  std::string d = dir.string();
  EXPECT_FALSE(format->recognizes({d.data(), d.size()}));
}

TEST_F(ShardedDamage, IndexOfAnotherRank) {
  fs::copy_file(dir / "shards/rank_00000.json", dir / "shards/rank_00001.json",
                fs::copy_options::overwrite_existing);
  Outcome o = read_metadata();
  EXPECT_EQ(o.code, Code::kDataLoss);
  EXPECT_TRUE(mentions(o, "rank_00001.json")) << o.message;
  EXPECT_TRUE(mentions(o, "belongs to rank 0")) << o.message;
}

TEST_F(ShardedDamage, RequestsThatDoNotMatch) {
  std::vector<OwnedTensor> wide = {request("model.a", DType::kF32, {8, 5}, {0, 0}, {8, 5})};
  Outcome o = load(format, dir, wide);
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_TRUE(mentions(o, "'model.a'") && mentions(o, "[8, 4]") && mentions(o, "[8, 5]"))
      << o.message;
  std::vector<OwnedTensor> unknown = {request("model.zzz", DType::kF32, {1}, {0}, {1})};
  o = load(format, dir, unknown);
  EXPECT_EQ(o.code, Code::kNotFound);
  EXPECT_TRUE(mentions(o, "'model.zzz'")) << o.message;
  // Listed in the metadata, but in no shard: the save was incomplete.
  fs::path other = fresh_dir("sharded_ghost");
  OwnedTensor ghost = request("model.ghost", DType::kF32, {2}, {0}, {2});
  std::vector<OwnedTensor> only_a = {a};
  ASSERT_EQ(save(format, other, only_a, metadata_for({a, ghost})).code, Code::kOk);
  std::vector<OwnedTensor> want = {ghost};
  o = load(format, other, want);
  EXPECT_EQ(o.code, Code::kDataLoss);
  EXPECT_TRUE(mentions(o, "'model.ghost'")) << o.message;
}

}  // namespace
}  // namespace loom::testing
