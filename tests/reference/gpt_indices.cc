// Writes a random indexed dataset and GPT dataset indices for several configurations, for
// check_gpt_indices.py to rebuild with numpy from Megatron's algorithm and compare.
// usage: gpt_indices OUT_DIR   (writes OUT_DIR/docs.{bin,idx}, OUT_DIR/cache/*.npy and
// OUT_DIR/manifest.json)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/data/gpt_dataset.h"
#include "core/data/indexed_dataset.h"
#include "core/data/npy_file.h"

namespace fs = std::filesystem;
using namespace loom::core;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpt_indices OUT_DIR\n");
    return 2;
  }
  fs::path out = argv[1];
  fs::create_directories(out);
  std::mt19937_64 rng(42);
  {
    IndexedDatasetWriter writer(out / "docs", IndexedDType::kU16);
    for (int d = 0; d < 300; ++d) {
      std::vector<int32_t> tokens(1 + rng() % 97);
      for (auto& t : tokens) t = static_cast<int32_t>(rng() % 50000);
      writer.add_document(tokens);
    }
    writer.finish();
  }
  auto data = std::make_shared<const IndexedDataset>(out / "docs");
  nlohmann::json manifest = nlohmann::json::array();
  struct Case {
    int64_t begin, end, samples, seq;
    uint32_t seed;
  };
  // One epoch; a final epoch shuffled apart (< 80% used); a final epoch shuffled with the
  // rest; a split in the middle of the dataset.
  for (const Case& c : {Case{0, 285, 100, 128, 1234}, Case{0, 285, 1300, 64, 7},
                        Case{0, 300, 1150, 32, 3}, Case{285, 299, 50, 16, 1234}}) {
    GptDataset ds(data, c.begin, c.end, c.samples, "train", {c.seq, c.seed, out / "cache"});
    int64_t n = std::min<int64_t>(ds.size(), 64);
    std::vector<int64_t> windows;
    std::vector<int32_t> w(static_cast<size_t>(c.seq + 1));
    for (int64_t i = 0; i < n; ++i) {
      ds.sample(i, w.data());
      windows.insert(windows.end(), w.begin(), w.end());
    }
    fs::path samples = ds.cache_stem().string() + "-first_samples.npy";
    write_npy(samples, "<i4", {n, c.seq + 1}, windows);
    manifest.push_back({{"begin", c.begin},
                        {"end", c.end},
                        {"num_samples", c.samples},
                        {"seq_length", c.seq},
                        {"seed", c.seed},
                        {"epochs", ds.epochs()},
                        {"stem", ds.cache_stem().string()},
                        {"samples", samples.string()}});
  }
  std::ofstream(out / "manifest.json") << manifest.dump(2) << "\n";
  return 0;
}
