// GPT dataset indices (Megatron's algorithm), numpy's RandomState, splits, blends and the
// trainer's data source over indexed datasets.
#include "core/data/gpt_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/data/gpt_data.h"
#include "core/data/indexed_dataset.h"
#include "core/data/numpy_random.h"
#include "core/util/errors.h"

namespace loom::core {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::path(::testing::TempDir()) / ("gpt_dataset_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Documents whose tokens say where they come from: document d, position p -> 100 * d + p
// (so every window can be traced back). Lengths vary from 1 to 17.
std::vector<int64_t> write_traceable(const fs::path& prefix, int64_t docs, int32_t eod = -1) {
  IndexedDatasetWriter writer(prefix, IndexedDType::kI32);
  std::vector<int64_t> lengths;
  for (int64_t d = 0; d < docs; ++d) {
    int64_t len = 1 + (d * 7) % 17;
    std::vector<int32_t> tokens;
    for (int64_t p = 0; p < len; ++p) tokens.push_back(static_cast<int32_t>(100 * d + p));
    if (eod >= 0) tokens.back() = eod;
    writer.add_document(tokens);
    lengths.push_back(len);
  }
  writer.finish();
  return lengths;
}

TEST(NumpyRandomState, MatchesMt19937AndNumpyShuffle) {
  // Reference values from numpy 1.24: RandomState(s).shuffle(np.arange(n)).
  NumpyRandomState mt(5489);
  EXPECT_EQ(mt.next_uint32(), 3499211612u);  // MT19937's published first output
  NumpyRandomState a(1234);
  std::vector<int32_t> x(10);
  std::iota(x.begin(), x.end(), 0);
  a.shuffle(std::span<int32_t>(x));
  EXPECT_EQ(x, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  NumpyRandomState b(7);
  std::vector<int64_t> y(100000);
  std::iota(y.begin(), y.end(), 0);
  b.shuffle(std::span<int64_t>(y));
  EXPECT_EQ(std::vector<int64_t>(y.begin(), y.begin() + 5),
            (std::vector<int64_t>{33909, 92307, 89107, 9538, 31008}));
  EXPECT_EQ(std::vector<int64_t>(y.end() - 3, y.end()),
            (std::vector<int64_t>{49689, 58564, 61615}));
}

TEST(Split, MegatronRounding) {
  // Megatron-Core's split matrix: boundaries round(cumulative weight * n), half to even
  // (values by hand and from Python's round()).
  auto w = parse_split("949,50,1", "/data/split");
  EXPECT_EQ(split_boundaries(w, 1000), (std::vector<int64_t>{0, 949, 999, 1000}));
  // round(9.49) = 9, round(9.99) = 10.
  EXPECT_EQ(split_boundaries(w, 10), (std::vector<int64_t>{0, 9, 10, 10}));
  auto even = parse_split("1,1", "/data/split");
  // round(2.5) = 2 (half to even), round(5) = 5.
  EXPECT_EQ(split_boundaries(even, 5), (std::vector<int64_t>{0, 2, 5, 5}));
  // round(1.5) = 2, round(3.0) = 3 (the legacy per-weight rounding gave 0, 1, 3, 10).
  EXPECT_EQ(split_boundaries(parse_split("15,15,70", "/p"), 10),
            (std::vector<int64_t>{0, 2, 3, 10}));
  EXPECT_EQ(split_boundaries(parse_split("100", "/p"), 7), (std::vector<int64_t>{0, 7, 7, 7}));
  EXPECT_THROW(parse_split("a,b", "/data/split"), SpecError);
  EXPECT_THROW(parse_split("0,0,0", "/data/split"), SpecError);
  EXPECT_THROW(parse_split("1,2,3,4", "/data/split"), SpecError);
}

TEST(Blend, GreedyIndicesFollowTheWeights) {
  std::vector<int16_t> ds;
  std::vector<int64_t> sample;
  blending_indices({0.5, 0.3, 0.2}, 1000, ds, sample);
  // The first draws, by hand: i=0 picks 0 (ties: first); i=1 errors (-0.5, 0.3, 0.2) -> 1;
  // i=2 errors (0, -0.4, 0.4) -> 2; i=3 errors (0.5, -0.1, -0.4) -> 0.
  EXPECT_EQ(std::vector<int16_t>(ds.begin(), ds.begin() + 4), (std::vector<int16_t>{0, 1, 2, 0}));
  std::vector<int64_t> count(3, 0);
  for (size_t i = 0; i < ds.size(); ++i) {
    EXPECT_EQ(sample[i], count[ds[i]]) << i;  // each dataset's samples in order
    ++count[ds[i]];
  }
  EXPECT_NEAR(count[0], 500, 1);
  EXPECT_NEAR(count[1], 300, 1);
  EXPECT_NEAR(count[2], 200, 1);
}

// Every sample is T + 1 consecutive tokens of the shuffled document stream, the unshuffled
// samples tile it with one token of overlap, and the indices are a pure function of their
// parameters (the cache gives back exactly what was built).
TEST(GptDataset, SamplesTileTheShuffledDocumentStream) {
  fs::path dir = temp_dir("tile");
  auto lengths = write_traceable(dir / "docs", 40);
  auto data = std::make_shared<const IndexedDataset>(dir / "docs");
  for (int64_t num_samples : {5, 60, 200}) {  // one epoch; a separate final epoch; several
    GptIndexConfig config{7, 1234, dir / "cache"};
    GptDataset ds(data, 3, 37, num_samples, "train", config);
    ASSERT_GE(ds.size(), num_samples);
    EXPECT_FALSE(ds.from_cache());
    // The document stream in document_index order.
    std::vector<int32_t> stream;
    std::vector<int64_t> doc_start;  // stream offset of each document_index position
    for (int32_t d : ds.document_index()) {
      ASSERT_GE(d, 3);
      ASSERT_LT(d, 37);
      doc_start.push_back(static_cast<int64_t>(stream.size()));
      for (int64_t p = 0; p < lengths[d]; ++p) stream.push_back(static_cast<int32_t>(100 * d + p));
    }
    // Each epoch holds every document of the split once.
    int64_t per_epoch = 34;
    ASSERT_EQ(static_cast<int64_t>(ds.document_index().size()), ds.epochs() * per_epoch);
    // Unshuffled sample i starts at stream offset i * T.
    const auto& si = ds.sample_index();
    for (int64_t i = 0; i <= ds.size(); ++i)
      EXPECT_EQ(doc_start[si[2 * i]] + si[2 * i + 1], i * 7) << "sample " << i;
    // Shuffled access: a permutation, and each window is the stream at its start.
    std::vector<int64_t> seen(static_cast<size_t>(ds.size()), 0);
    std::vector<int32_t> window(8);
    for (int64_t j = 0; j < ds.size(); ++j) {
      int64_t i = ds.shuffle_index()[j];
      ++seen[i];
      ds.sample(j, window.data());
      EXPECT_EQ(window, std::vector<int32_t>(stream.begin() + i * 7, stream.begin() + i * 7 + 8))
          << "sample " << j;
    }
    for (int64_t c : seen) EXPECT_EQ(c, 1);
    // Built again: from the cache, identical.
    GptDataset again(data, 3, 37, num_samples, "train", config);
    EXPECT_TRUE(again.from_cache());
    EXPECT_EQ(again.document_index(), ds.document_index());
    EXPECT_EQ(again.sample_index(), ds.sample_index());
    EXPECT_EQ(again.shuffle_index(), ds.shuffle_index());
  }
}

TEST(GptDataset, DamagedOrStaleCacheIsRebuilt) {
  fs::path dir = temp_dir("cache");
  write_traceable(dir / "docs", 20);
  auto data = std::make_shared<const IndexedDataset>(dir / "docs");
  GptIndexConfig config{5, 99, dir / "cache"};
  GptDataset first(data, 0, 20, 30, "train", config);
  fs::path doc = first.cache_stem().string() + "-document_index.npy";
  ASSERT_TRUE(fs::exists(doc));
  fs::resize_file(doc, fs::file_size(doc) - 4);  // truncated
  GptDataset second(data, 0, 20, 30, "train", config);
  EXPECT_FALSE(second.from_cache());
  EXPECT_EQ(second.document_index(), first.document_index());
  EXPECT_EQ(second.shuffle_index(), first.shuffle_index());
  // Other parameters are other files.
  GptDataset other_seed(data, 0, 20, 30, "train", GptIndexConfig{5, 100, dir / "cache"});
  EXPECT_NE(other_seed.cache_stem(), first.cache_stem());
  EXPECT_NE(other_seed.shuffle_index(), first.shuffle_index());
  // An unwritable cache directory only costs the cache.
  fs::path blocked = dir / "file_not_dir";
  std::ofstream(blocked) << "x";
  GptDataset uncached(data, 0, 20, 30, "train", GptIndexConfig{5, 99, blocked / "sub"});
  EXPECT_EQ(uncached.shuffle_index(), first.shuffle_index());
}

// Megatron-Core's GPTDataset works over sequences: a document of several sequences
// (--split-sentences) is several entries of the document index, and a document with no
// sequence is nothing. The same tokens as one sequence per document must give the same
// token stream per sequence id and the walk of build_sample_idx over sequence lengths.
TEST(GptDataset, IndicesCountSequencesNotDocuments) {
  fs::path dir = temp_dir("sequences");
  // 6 documents: 2 sequences, none, 1, 3, none, 1 -> 7 sequences of lengths 3,2,4,1,5,2,6.
  const std::vector<std::vector<int32_t>> docs = {{3, 2}, {}, {4}, {1, 5, 2}, {}, {6}};
  IndexedDatasetWriter writer(dir / "docs", IndexedDType::kI32);
  std::vector<int32_t> lengths;
  int32_t next = 0;
  for (const auto& doc : docs) {
    int32_t n = 0;
    for (int32_t l : doc) n += l, lengths.push_back(l);
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (auto& t : tokens) t = next++;
    writer.add_document(tokens, doc);
  }
  writer.finish();
  auto data = std::make_shared<const IndexedDataset>(dir / "docs");
  ASSERT_EQ(data->documents(), 6);
  ASSERT_EQ(data->sequences(), 7);
  EXPECT_EQ(std::vector<int64_t>(data->document_indices().begin(), data->document_indices().end()),
            (std::vector<int64_t>{0, 2, 2, 3, 6, 6, 7}));
  // Split by sequence: "1,1" over 7 sequences is [0, 4) and [4, 7) (round(3.5) = 4).
  auto b = split_boundaries(parse_split("1,1", "/p"), data->sequences());
  ASSERT_EQ(b, (std::vector<int64_t>{0, 4, 7, 7}));
  GptDataset ds(data, b[0], b[1], 3, "train", GptIndexConfig{3, 5, {}});
  // One epoch of sequences 0..3 (10 tokens), shuffled: every entry is a sequence id.
  std::vector<int32_t> sorted = ds.document_index();
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(ds.size(), (10 - 1) / 3);
  // Windows are the shuffled sequences laid end to end (sequence s holds ids from its start).
  std::vector<int32_t> start = {0, 3, 5, 9, 10, 15, 17};
  std::vector<int32_t> stream;
  for (int32_t s : ds.document_index())
    for (int32_t p = 0; p < lengths[s]; ++p) stream.push_back(start[s] + p);
  std::vector<int32_t> window(4);
  for (int64_t j = 0; j < ds.size(); ++j) {
    int64_t i = ds.shuffle_index()[j];
    ds.sample(j, window.data());
    EXPECT_EQ(window, std::vector<int32_t>(stream.begin() + i * 3, stream.begin() + i * 3 + 4));
  }
  GptDataset valid(data, b[1], b[2], 2, "valid", GptIndexConfig{3, 5, {}});
  for (int32_t s : valid.document_index()) EXPECT_GE(s, 4);
}

TEST(GptDataset, RefusesEmptySplitsAndTinyData) {
  fs::path dir = temp_dir("bad");
  write_traceable(dir / "docs", 3);
  auto data = std::make_shared<const IndexedDataset>(dir / "docs");
  GptIndexConfig config{4, 1, {}};
  EXPECT_THROW(GptDataset(data, 2, 2, 10, "valid", config), InvalidArgument);
  EXPECT_THROW(GptDataset(data, 0, 4, 10, "train", config), InvalidArgument);
  EXPECT_THROW(GptDataset(data, 0, 1, 10, "train", config), IoError);  // 1 token
}

TEST(DataPaths, MegatronStyleLists) {
  std::vector<fs::path> prefixes;
  std::vector<double> weights;
  parse_data_paths(nlohmann::json::parse(R"(["a", "b"])"), "/data/paths", prefixes, weights);
  EXPECT_EQ(prefixes, (std::vector<fs::path>{"a", "b"}));
  EXPECT_TRUE(weights.empty());
  parse_data_paths(nlohmann::json::parse(R"([0.7, "a", "0.3", "b"])"), "/data/paths", prefixes,
                   weights);
  EXPECT_EQ(prefixes, (std::vector<fs::path>{"a", "b"}));
  EXPECT_EQ(weights, (std::vector<double>{0.7, 0.3}));
  for (const char* bad : {R"([])", R"([0.5, "a", 0.5])", R"([0.5, 0.5])", R"(["a", 0.5])"}) {
    try {
      parse_data_paths(nlohmann::json::parse(bad), "/data/paths", prefixes, weights);
      ADD_FAILURE() << bad;
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find("/data/paths"), std::string::npos) << e.what();
    }
  }
}

GptDataOptions options_for(const fs::path& prefix) {
  GptDataOptions o;
  o.prefixes = {prefix};
  o.split = "80,20";
  o.batch = 2;
  o.seq_length = 9;
  o.seed = 5;
  o.train_samples = 40;
  o.valid_samples = 4;
  o.vocab_size = 100000;
  return o;
}

TEST(GptData, ResumesAtTheExactNextSample) {
  fs::path dir = temp_dir("resume");
  write_traceable(dir / "docs", 50);
  GptData a(options_for(dir / "docs"));
  Batch batch;
  std::vector<Batch> stream;
  for (int i = 0; i < 6; ++i) {
    a.next_train(batch);
    stream.push_back(batch);
  }
  EXPECT_EQ(a.position(), 12);
  GptData b(options_for(dir / "docs"));
  b.seek(6);
  for (int i = 3; i < 6; ++i) {
    b.next_train(batch);
    EXPECT_EQ(batch.tokens, stream[i].tokens) << i;
    EXPECT_EQ(batch.labels, stream[i].labels) << i;
  }
  // Labels are the tokens shifted by one; validation is fixed.
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t + 1 < 9; ++t)
      EXPECT_EQ(stream[0].labels[r * 9 + t], stream[0].tokens[r * 9 + t + 1]);
  Batch v1, v2;
  ASSERT_TRUE(a.valid_batch(1, v1));
  ASSERT_TRUE(b.valid_batch(1, v2));
  EXPECT_EQ(v1.tokens, v2.tokens);
  // Valid documents are the last 20%: ids 100 * d + p with d >= 40.
  for (int32_t id : v1.tokens) EXPECT_GE(id / 100, 40);
  for (const Batch& s : stream)
    for (int32_t id : s.tokens) EXPECT_LT(id / 100, 40);
  EXPECT_GT(a.unigram_entropy(), 0);
}

TEST(GptData, EodMasksPositionsAndSegmentsFollowMegatron) {
  fs::path dir = temp_dir("eod");
  const int32_t eod = 7;  // the last token of every document (100 * d + p never equals 7 at
                          // the end... set explicitly by write_traceable)
  write_traceable(dir / "docs", 30, eod);
  GptDataOptions o = options_for(dir / "docs");
  o.eod = eod;
  o.eod_mask_loss = true;
  o.reset_position_ids = true;
  o.reset_attention_mask = true;
  GptData data(o);
  Batch batch;
  bool saw_reset = false;
  for (int step = 0; step < 10; ++step) {
    data.next_train(batch);
    ASSERT_EQ(batch.position_ids.size(), 18u);
    ASSERT_EQ(batch.segment_ids.size(), 18u);
    for (int64_t r = 0; r < 2; ++r) {
      int32_t pos = 0, seg = 0;
      for (int64_t t = 0; t < 9; ++t) {
        int64_t i = r * 9 + t;
        EXPECT_EQ(batch.position_ids[i], pos);
        EXPECT_EQ(batch.segment_ids[i], seg);
        EXPECT_EQ(batch.loss_mask[i], batch.tokens[i] == eod ? 0.f : 1.f);
        if (batch.tokens[i] == eod) {
          pos = 0, ++seg;
          saw_reset = true;
        } else {
          ++pos;
        }
      }
    }
  }
  EXPECT_TRUE(saw_reset);
  // The options need an EOD id.
  GptDataOptions missing = options_for(dir / "docs");
  missing.eod_mask_loss = true;
  EXPECT_THROW(GptData{missing}, SpecError);
}

TEST(GptData, BlendsFollowWeightsAndCheckTheVocabulary) {
  fs::path dir = temp_dir("blend");
  write_traceable(dir / "a", 30);
  {
    IndexedDatasetWriter writer(dir / "b", IndexedDType::kU16);
    for (int d = 0; d < 30; ++d) writer.add_document(std::vector<int32_t>(12, 60000 + d));
    writer.finish();
  }
  GptDataOptions o = options_for(dir / "a");
  o.prefixes = {dir / "a", dir / "b"};
  o.weights = {3, 1};
  o.train_samples = 400;
  GptData data(o);
  Batch batch;
  int64_t from_b = 0, rows = 0;
  for (int i = 0; i < 200; ++i, rows += 2) {
    data.next_train(batch);
    for (int r = 0; r < 2; ++r) from_b += batch.tokens[r * 9] >= 60000;
  }
  EXPECT_NEAR(static_cast<double>(from_b) / rows, 0.25, 0.01);
  // Ids beyond the model's vocabulary are refused, naming the split.
  o.vocab_size = 5000;
  GptData small(o);
  try {
    for (int i = 0; i < 20; ++i) small.next_train(batch);
    ADD_FAILURE() << "no error for ids beyond the vocabulary";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
  // A missing prefix names the fix.
  GptDataOptions gone = options_for(dir / "nope");
  try {
    GptData{gone};
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("loom preprocess"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::core
