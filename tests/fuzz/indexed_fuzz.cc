// Megatron .idx/.bin pairs (core/data/indexed_dataset): the input is
//   uint32 LE n, then n bytes of PREFIX.idx, then the rest: PREFIX.bin
// (n beyond the input takes all of it for the .idx and leaves the .bin empty). Opening
// checks the header and every invariant; then every sequence (at most 64) is read.
#include <algorithm>
#include <cstring>

#include "core/data/indexed_dataset.h"
#include "tests/fuzz/fuzz_target.h"

LOOM_FUZZ_TARGET(indexed) {
  uint32_t n = 0;
  if (size >= 4) std::memcpy(&n, data, 4);  // the fuzz hosts are little-endian
  std::string_view rest = loom::fuzz::as_text(data, size).substr(std::min<size_t>(size, 4));
  size_t idx_size = std::min<size_t>(n, rest.size());
  const std::filesystem::path prefix = loom::fuzz::scratch_dir() / "data";
  loom::fuzz::write_bytes(prefix.string() + ".idx", rest.substr(0, idx_size));
  loom::fuzz::write_bytes(prefix.string() + ".bin", rest.substr(idx_size));
  loom::core::IndexedDataset dataset(prefix);
  int64_t sequences = std::min<int64_t>(dataset.sequences(), 64);
  for (int64_t s = 0; s < sequences; ++s) {
    std::vector<int32_t> tokens = dataset.sequence(s);
    if (!tokens.empty()) {
      int32_t last = 0;
      dataset.read(s, static_cast<int64_t>(tokens.size()) - 1, 1, &last);
      if (last != tokens.back()) std::abort();
    }
  }
  (void)dataset.documents();
}
