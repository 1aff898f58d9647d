// The "sharded" format through the plugin boundary: byte-exact round trips of every dtype
// and rank, dtype conversion on load, strided input, the file layout (64-byte alignment,
// atomic names), and resharding: slices saved by 2 or 3 ranks (row, column and replicated
// layouts; several slices of one tensor from one rank) loaded as other slices and as whole
// tensors.
#include <gtest/gtest.h>
#include <loom/cpp/half.h>

#include <fstream>

#include "tests/plugins/checkpoint/checkpoint_env.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

class Sharded : public ::testing::Test {
 protected:
  CheckpointEnv env;
  Format format = env.format({{"impl", "sharded"}});
  std::mt19937 rng{1234};
};

TEST_F(Sharded, RoundTripEveryDtypeAndRankByteExact) {
  fs::path dir = fresh_dir("sharded_round_trip");
  std::vector<OwnedTensor> saved;
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {1}, {7}, {3, 5}, {2, 3, 4}, {0, 4}, {1, 1, 1, 1, 1, 1, 1, 3}};
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                          DType::kI32, DType::kI64,  DType::kU8,  DType::kBool};
  int n = 0;
  for (DType dtype : dtypes)
    for (const auto& shape : shapes)
      saved.push_back(random_tensor("model.t" + std::to_string(n++), dtype, shape, rng));
  nlohmann::json meta = metadata_for(saved, {{"model", {{"impl", "gpt"}}}});
  Outcome o = save(format, dir, saved, meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;

  std::vector<OwnedTensor> back;
  for (const OwnedTensor& t : saved)
    back.push_back(request(t.name, t.dtype, t.global_shape, t.offset, t.shape));
  o = load(format, dir, back);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  for (size_t i = 0; i < saved.size(); ++i)
    EXPECT_EQ(back[i].bytes, saved[i].bytes) << saved[i].name;

  nlohmann::json got;
  ASSERT_EQ(metadata(format, dir, &got).code, Code::kOk);
  EXPECT_EQ(got, meta);  // the core's object, verbatim
  std::string d = dir.string();
  EXPECT_TRUE(format->recognizes({d.data(), d.size()}));
  std::string empty = fresh_dir("sharded_empty").string();
  EXPECT_FALSE(format->recognizes({empty.data(), empty.size()}));

  // Layout: every tensor 64-byte aligned; no temporary file left behind.
  nlohmann::json index = nlohmann::json::parse(std::ifstream(dir / "shards/rank_00000.json"));
  for (const auto& e : index["tensors"]) EXPECT_EQ(e["byte_offset"].get<uint64_t>() % 64, 0u);
  EXPECT_EQ(fs::file_size(dir / "shards/rank_00000.bin"), index["bin_size"].get<uint64_t>());
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

TEST_F(Sharded, ConvertsBetweenFloatDtypesOnLoad) {
  fs::path dir = fresh_dir("sharded_convert");
  std::vector<OwnedTensor> saved = {random_tensor("model.a", DType::kF32, {5, 3}, rng),
                                    random_tensor("model.b", DType::kBF16, {4}, rng)};
  ASSERT_EQ(save(format, dir, saved, metadata_for(saved)).code, Code::kOk);
  std::vector<OwnedTensor> back = {request("model.a", DType::kBF16, {5, 3}, {0, 0}, {5, 3}),
                                   request("model.a", DType::kF16, {5, 3}, {0, 0}, {5, 3}),
                                   request("model.b", DType::kF32, {4}, {0}, {4})};
  Outcome o = load(format, dir, back);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  std::vector<float> a = saved[0].floats(), b = saved[1].floats();
  std::vector<float> a_bf16 = back[0].floats(), a_f16 = back[1].floats(), b_f32 = back[2].floats();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a_bf16[i], bf16_to_f32(f32_to_bf16(a[i])));
    EXPECT_EQ(a_f16[i], f16_to_f32(f32_to_f16(a[i])));
  }
  EXPECT_EQ(b_f32, b);  // bf16 -> f32 is exact
  // Integers do not convert.
  std::vector<OwnedTensor> ints = {random_tensor("model.i", DType::kI32, {2}, rng)};
  fs::path ints_dir = fresh_dir("sharded_ints");
  ASSERT_EQ(save(format, ints_dir, ints, metadata_for(ints)).code, Code::kOk);
  std::vector<OwnedTensor> as_float = {request("model.i", DType::kF32, {2}, {0}, {2})};
  Outcome bad = load(format, ints_dir, as_float);
  EXPECT_EQ(bad.code, Code::kInvalidArgument);
  EXPECT_NE(bad.message.find("'model.i'"), std::string::npos) << bad.message;
}

TEST_F(Sharded, SavesStridedViews) {
  fs::path dir = fresh_dir("sharded_strided");
  OwnedTensor t = random_tensor("model.w", DType::kF32, {3, 4}, rng);
  CheckpointTensor view = t.view();
  // Save the transpose (4, 3) through a strided view of the same bytes.
  view.global_shape[0] = view.data.shape[0] = 4;
  view.global_shape[1] = view.data.shape[1] = 3;
  view.data.strides[0] = 1;
  view.data.strides[1] = 4;
  std::string d = dir.string(), m = metadata_for({}).dump();
  ASSERT_EQ(outcome(format->save({d.data(), d.size()}, &view, 1, {m.data(), m.size()}, 0, 1)).code,
            Code::kOk);
  std::vector<OwnedTensor> back = {request("model.w", DType::kF32, {4, 3}, {0, 0}, {4, 3})};
  ASSERT_EQ(load(format, dir, back).code, Code::kOk);
  std::vector<float> w = t.floats(), wt = back[0].floats();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(wt[i * 3 + j], w[j * 4 + i]);
}

TEST_F(Sharded, ReshardsAcrossLayouts) {
  fs::path dir = fresh_dir("sharded_reshard");
  OwnedTensor rows = random_tensor("model.rows", DType::kF32, {6, 8}, rng);   // 3-way row split
  OwnedTensor cols = random_tensor("model.cols", DType::kBF16, {4, 6}, rng);  // 2-way column split
  OwnedTensor cube = random_tensor("model.cube", DType::kF16, {4, 3, 5}, rng);  // split on dim 2
  OwnedTensor shared = random_tensor("model.shared", DType::kF32, {5}, rng);    // every rank
  std::vector<OwnedTensor> all = {rows, cols, cube, shared};
  const int world = 3;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<OwnedTensor> mine = {slice_of(rows, {2 * rank, 0}, {2, 8}), shared};
    if (rank < 2) mine.push_back(slice_of(cols, {0, 3 * rank}, {4, 3}));
    mine.push_back(slice_of(cube,
                            {0, 0,
                             rank == 0   ? 0
                             : rank == 1 ? 2
                                         : 4},
                            {4, 3,
                             rank == 0   ? 2
                             : rank == 1 ? 2
                                         : 1}));
    Outcome o = save(format, dir, mine, metadata_for(all), rank, world);
    ASSERT_EQ(o.code, Code::kOk) << "rank " << rank << ": " << o.message;
  }
  // Whole tensors, then slices that cut across the saved ones, all in one load call.
  std::vector<OwnedTensor> want = {
      request("model.rows", DType::kF32, {6, 8}, {0, 0}, {6, 8}),
      request("model.rows", DType::kF32, {6, 8}, {1, 3}, {4, 4}),  // spans 3 ranks
      request("model.rows", DType::kF32, {6, 8}, {0, 4}, {6, 4}),  // column half of rows
      request("model.cols", DType::kBF16, {4, 6}, {0, 0}, {4, 6}),
      request("model.cols", DType::kBF16, {4, 6}, {2, 0}, {2, 6}),  // a row split of cols
      request("model.cube", DType::kF16, {4, 3, 5}, {1, 1, 1}, {2, 2, 4}),
      request("model.shared", DType::kF32, {5}, {1}, {3}),
  };
  Outcome o = load(format, dir, want);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  const OwnedTensor* source[] = {&rows, &rows, &rows, &cols, &cols, &cube, &shared};
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(want[i].bytes, slice_of(*source[i], want[i].offset, want[i].shape).bytes)
        << want[i].name << " request " << i;
  nlohmann::json meta;
  ASSERT_EQ(metadata(format, dir, &meta).code, Code::kOk);
  EXPECT_EQ(meta, metadata_for(all));
}

// A rank may save several slices of one tensor (a pipeline stage with two virtual chunks
// writes two column runs of the FP8 state): interleaved columns of two ranks, two runs each,
// load back whole and across the runs.
TEST_F(Sharded, ARankSavesSeveralSlicesOfOneTensor) {
  fs::path dir = fresh_dir("sharded_runs");
  OwnedTensor w = random_tensor("fp8.amax_history", DType::kF32, {2, 8}, rng);
  for (int rank = 0; rank < 2; ++rank) {
    // Rank r: columns [2r, 2r + 2) and [4 + 2r, 6 + 2r).
    std::vector<OwnedTensor> mine = {slice_of(w, {0, 2 * rank}, {2, 2}),
                                     slice_of(w, {0, 4 + 2 * rank}, {2, 2})};
    Outcome o = save(format, dir, mine, metadata_for({w}), rank, 2);
    ASSERT_EQ(o.code, Code::kOk) << "rank " << rank << ": " << o.message;
  }
  std::vector<OwnedTensor> want = {
      request("fp8.amax_history", DType::kF32, {2, 8}, {0, 0}, {2, 8}),
      request("fp8.amax_history", DType::kF32, {2, 8}, {0, 3}, {2, 3}),  // 3 runs, 2 ranks
  };
  Outcome o = load(format, dir, want);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  EXPECT_EQ(want[0].bytes, w.bytes);
  EXPECT_EQ(want[1].bytes, slice_of(w, {0, 3}, {2, 3}).bytes);
}

TEST_F(Sharded, DetectsSlicesThatDoNotCoverTheRequest) {
  fs::path dir = fresh_dir("sharded_gap");
  OwnedTensor w = random_tensor("model.w", DType::kF32, {4, 2}, rng);
  std::vector<OwnedTensor> r0 = {slice_of(w, {0, 0}, {2, 2})}, r1 = {};
  ASSERT_EQ(save(format, dir, r0, metadata_for({w}), 0, 2).code, Code::kOk);
  ASSERT_EQ(save(format, dir, r1, metadata_for({w}), 1, 2).code, Code::kOk);
  std::vector<OwnedTensor> top = {request("model.w", DType::kF32, {4, 2}, {0, 0}, {2, 2})};
  EXPECT_EQ(load(format, dir, top).code, Code::kOk);  // the saved half loads
  std::vector<OwnedTensor> whole = {request("model.w", DType::kF32, {4, 2}, {0, 0}, {4, 2})};
  Outcome o = load(format, dir, whole);
  EXPECT_EQ(o.code, Code::kDataLoss);
  EXPECT_NE(o.message.find("'model.w'"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("[0:4, 0:2]"), std::string::npos) << o.message;
}

TEST_F(Sharded, OverlappingSlicesCountOnce) {
  OwnedTensor w = random_tensor("model.w", DType::kF32, {4, 2}, rng);
  // Rows [0, 3) and [2, 4) overlap in row 2 and cover every row.
  fs::path dir = fresh_dir("sharded_overlap");
  std::vector<OwnedTensor> r0 = {slice_of(w, {0, 0}, {3, 2})}, r1 = {slice_of(w, {2, 0}, {2, 2})};
  ASSERT_EQ(save(format, dir, r0, metadata_for({w}), 0, 2).code, Code::kOk);
  ASSERT_EQ(save(format, dir, r1, metadata_for({w}), 1, 2).code, Code::kOk);
  std::vector<OwnedTensor> whole = {request("model.w", DType::kF32, {4, 2}, {0, 0}, {4, 2})};
  Outcome o = load(format, dir, whole);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  EXPECT_EQ(whole[0].bytes, w.bytes);
  // Rows [0, 3) and [1, 3): 5 rows saved in all, but row 3 is in neither.
  dir = fresh_dir("sharded_overlap_gap");
  r1 = {slice_of(w, {1, 0}, {2, 2})};
  ASSERT_EQ(save(format, dir, r0, metadata_for({w}), 0, 2).code, Code::kOk);
  ASSERT_EQ(save(format, dir, r1, metadata_for({w}), 1, 2).code, Code::kOk);
  o = load(format, dir, whole);
  EXPECT_EQ(o.code, Code::kDataLoss) << o.message;
}

TEST_F(Sharded, RefusesBadSaves) {
  fs::path dir = fresh_dir("sharded_bad_save");
  OwnedTensor w = random_tensor("model.w", DType::kF32, {4}, rng);
  std::vector<OwnedTensor> twice = {w, w};
  Outcome o = save(format, dir, twice, metadata_for({w}));
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_NE(o.message.find("'model.w'"), std::string::npos) << o.message;
  OwnedTensor outside = slice_of(w, {2}, {2});
  outside.offset = {3};
  std::vector<OwnedTensor> bad = {outside};
  o = save(format, dir, bad, metadata_for({w}));
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_NE(o.message.find("not inside the global shape [4]"), std::string::npos) << o.message;
  std::vector<OwnedTensor> ok = {w};
  o = save(format, dir, ok, metadata_for({w}), 3, 2);
  EXPECT_EQ(o.code, Code::kInvalidArgument) << o.message;
  o = save(format, dir / "missing", ok, metadata_for({w}));
  EXPECT_EQ(o.code, Code::kNotFound) << o.message;
}

}  // namespace
}  // namespace loom::testing
