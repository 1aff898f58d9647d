// Writes deterministic random indexed datasets with loom's writer and prints, as JSON, what
// an independent reader must find in them (tests/reference/check_indexed_numpy.py).
// usage: write_indexed DIR  (writes DIR/<name>.bin/.idx, prints the expectations to stdout)
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/data/indexed_dataset.h"

namespace {

using loom::core::IndexedDType;

// Written with weights (i % 997 + 1) over all tokens in order, as the checker computes them.
nlohmann::json write_one(const std::filesystem::path& dir, const char* name, IndexedDType dtype,
                         int32_t vocab, int documents, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::uniform_int_distribution<int> length(0, 400);
  loom::core::IndexedDatasetWriter writer(dir / name, dtype);
  nlohmann::json lengths = nlohmann::json::array(), sums = nlohmann::json::array();
  nlohmann::json doc_index = nlohmann::json::array({0});
  int64_t index = 0, weighted = 0;
  std::vector<int32_t> doc;
  for (int d = 0; d < documents; ++d) {
    // Document 3 is empty: a document with no sequence (as Megatron's preprocess_data.py
    // writes a text without tokens).
    doc.resize(static_cast<size_t>(d == 3 ? 0 : length(rng)));
    int64_t sum = 0;
    for (int32_t& t : doc) {
      t = id(rng);
      sum += t;
      weighted += int64_t{t} * (index++ % 997 + 1);
    }
    writer.add_document(doc);
    if (!doc.empty()) {
      lengths.push_back(doc.size());
      sums.push_back(sum);
    }
    doc_index.push_back(lengths.size());
  }
  writer.finish();
  return {{"prefix", (dir / name).string()},
          {"dtype_code", static_cast<int>(dtype)},
          {"sequences", lengths.size()},
          {"document_indices", doc_index},
          {"tokens", index},
          {"lengths", lengths},
          {"sums", sums},
          {"weighted", weighted}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_indexed DIR\n");
    return 2;
  }
  std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  nlohmann::json out = nlohmann::json::array();
  out.push_back(write_one(dir, "u16", loom::core::indexed_dtype_for_vocab(50257), 50257, 300, 1));
  out.push_back(write_one(dir, "i32", loom::core::indexed_dtype_for_vocab(128256), 128256, 200, 2));
  out.push_back(write_one(dir, "u8", IndexedDType::kU8, 256, 50, 3));
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
