// Tokenizer files (core/data/tokenizer_load.cc): the input up to its first NUL byte is the
// JSON file (a GPT-2 vocab.json, or a Hugging Face tokenizer.json: told apart by content),
// the rest is merges.txt beside it (no NUL: no merges.txt). A tokenizer that loads then
// encodes and decodes a fixed text and the merges bytes, and names every id (at most 4096).
#include <algorithm>
#include <string>

#include "core/data/tokenizer.h"
#include "tests/fuzz/fuzz_target.h"

LOOM_FUZZ_TARGET(tokenizer) {
  std::string_view text = loom::fuzz::as_text(data, size);
  const std::filesystem::path dir = loom::fuzz::scratch_dir() / "tokenizer";
  std::filesystem::create_directories(dir);
  size_t nul = text.find('\0');
  loom::fuzz::write_bytes(dir / "vocab.json", text.substr(0, nul));
  std::filesystem::remove(dir / "merges.txt");
  std::string_view merges;
  if (nul != std::string_view::npos) {
    merges = text.substr(nul + 1);
    loom::fuzz::write_bytes(dir / "merges.txt", merges);
  }
  std::unique_ptr<loom::core::Tokenizer> t = loom::core::Tokenizer::load(dir / "vocab.json");
  for (std::string_view sample :
       {std::string_view("Hello world, it's 2024! \xc3\xa9t\xc3\xa9 <|endoftext|>  \n\tend"),
        merges.substr(0, 512)}) {
    std::vector<int32_t> ids = t->encode(sample);
    for (int32_t id : ids)
      if (id < 0 || id >= t->vocab_size()) {
        std::fprintf(stderr, "tokenizer: encode gave id %d outside [0, %lld)\n", id,
                     static_cast<long long>(t->vocab_size()));
        std::abort();
      }
    (void)t->decode(ids);
  }
  int64_t named = std::min<int64_t>(t->vocab_size(), 4096);
  for (int64_t id = 0; id < named; ++id) {
    std::string token = t->id_to_token(static_cast<int32_t>(id));
    (void)t->token_to_id(token);
  }
  (void)t->eod();
  (void)t->describe();
}
