// Writes a random sentence-split indexed dataset (documents of 0 to 3 sequences) and GPT
// dataset indices for several splits and sizes, and numpy RandomState shuffles, for
// check_gpt_indices.py to rebuild with numpy from Megatron's algorithm and compare.
// usage: gpt_indices OUT_DIR   (writes OUT_DIR/docs.{bin,idx}, OUT_DIR/cache/*.npy and
// OUT_DIR/manifest.json)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <span>
#include <string>

#include "core/data/gpt_dataset.h"
#include "core/data/indexed_dataset.h"
#include "core/data/npy_file.h"
#include "core/data/numpy_random.h"

namespace fs = std::filesystem;
using namespace loom::core;

static std::string fmt_shuffle_name(uint32_t seed, int64_t n) {
  return "shuffle-" + std::to_string(seed) + "-" + std::to_string(n) + ".npy";
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpt_indices OUT_DIR\n");
    return 2;
  }
  fs::path out = argv[1];
  fs::create_directories(out);
  std::mt19937_64 rng(42);
  {
    // As Megatron's --split-sentences writes: 0 to 3 sequences per document, so some
    // documents have several sequences and some none (an empty text).
    IndexedDatasetWriter writer(out / "docs", IndexedDType::kU16);
    for (int d = 0; d < 300; ++d) {
      std::vector<int32_t> lengths(d % 11 == 5 ? 0 : rng() % 4);
      std::vector<int32_t> tokens;
      for (auto& l : lengths) {
        l = static_cast<int32_t>(1 + rng() % 97);
        for (int32_t i = 0; i < l; ++i) tokens.push_back(static_cast<int32_t>(rng() % 50000));
      }
      writer.add_document(tokens, lengths);
    }
    writer.finish();
  }
  auto data = std::make_shared<const IndexedDataset>(out / "docs");
  nlohmann::json manifest = nlohmann::json::object();
  nlohmann::json cases = nlohmann::json::array();
  struct Case {
    const char* split;
    int which;  // 0 train, 1 valid, 2 test
    int64_t samples, seq;
    uint32_t seed;
  };
  // One epoch; a final epoch shuffled apart (< 80% used); a final epoch shuffled with the
  // rest; splits in the middle of the dataset (sequence ranges by Megatron-Core's rounding).
  for (const Case& c : {Case{"95,5,0", 0, 100, 128, 1234}, Case{"95,5,0", 0, 1300, 64, 7},
                        Case{"100", 0, 1150, 32, 3}, Case{"95,4,1", 1, 50, 16, 1234},
                        Case{"15,15,70", 1, 40, 16, 9}}) {
    std::vector<int64_t> b = split_boundaries(parse_split(c.split, "/split"), data->sequences());
    const char* name = c.which == 0 ? "train" : c.which == 1 ? "valid" : "test";
    GptDataset ds(data, b[c.which], b[c.which + 1], c.samples, name,
                  {c.seq, c.seed, out / "cache"});
    int64_t n = std::min<int64_t>(ds.size(), 64);
    std::vector<int64_t> windows;
    std::vector<int32_t> w(static_cast<size_t>(c.seq + 1));
    for (int64_t i = 0; i < n; ++i) {
      ds.sample(i, w.data());
      windows.insert(windows.end(), w.begin(), w.end());
    }
    fs::path samples = ds.cache_stem().string() + "-first_samples.npy";
    write_npy(samples, "<i4", {n, c.seq + 1}, windows);
    cases.push_back({{"split", c.split},
                     {"which", c.which},
                     {"begin", b[c.which]},
                     {"end", b[c.which + 1]},
                     {"num_samples", c.samples},
                     {"seq_length", c.seq},
                     {"seed", c.seed},
                     {"epochs", ds.epochs()},
                     {"stem", ds.cache_stem().string()},
                     {"samples", samples.string()}});
  }
  manifest["cases"] = cases;
  // NumpyRandomState.shuffle of arange(n) for numpy to recompute (the unit test's recorded
  // values among them: seed 1234 n 10, seed 7 n 100000).
  struct Shuffle {
    uint32_t seed;
    int64_t n;
    const char* dtype;
  };
  nlohmann::json shuffles = nlohmann::json::array();
  for (const Shuffle& c : {Shuffle{1234, 10, "<i4"}, Shuffle{7, 100000, "<i8"},
                           Shuffle{0, 1, "<i4"}, Shuffle{4294967295u, 2, "<u4"},
                           Shuffle{42, 65537, "<u4"}, Shuffle{5, 1000, "<i4"}}) {
    std::vector<int64_t> x(static_cast<size_t>(c.n));
    std::iota(x.begin(), x.end(), 0);
    NumpyRandomState random(c.seed);
    random.shuffle(std::span<int64_t>(x));
    fs::path file = out / fmt_shuffle_name(c.seed, c.n);
    write_npy(file, c.dtype, {c.n}, x);
    shuffles.push_back({{"seed", c.seed}, {"n", c.n}, {"dtype", c.dtype}, {"file", file.string()}});
  }
  manifest["shuffles"] = shuffles;
  std::ofstream(out / "manifest.json") << manifest.dump(2) << "\n";
  return 0;
}
