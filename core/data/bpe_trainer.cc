// BPE training: count the pre-tokens (words) of the corpus, then repeatedly merge the most
// frequent adjacent pair. Pair counts live in a hash map with, per pair, the words that hold
// it; a max-heap of (count, pair) is invalidated lazily, and a merge rewrites only the words
// that hold its pair.
#include "core/data/bpe_trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>
#include <unordered_map>

#include "core/data/bpe.h"
#include "core/data/pretokenize.h"
#include "core/data/unicode.h"
#include "core/util/errors.h"
#include "core/util/files.h"

namespace loom::core {
namespace {

// Pieces of the documents that can be pre-tokenised independently: special tokens removed,
// and long text cut after a '\n' followed by a printable ASCII character (the GPT-2 pattern
// always ends a pre-token there, so the cut changes no pre-token).
std::vector<std::string_view> split_work(const std::vector<std::string_view>& documents,
                                         const std::vector<std::string>& specials) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<std::string_view> pieces;
  auto chunk = [&](std::string_view text) {
    while (text.size() > kChunk) {
      size_t cut = text.find('\n', kChunk);
      while (cut != std::string_view::npos && cut + 1 < text.size() &&
             !(text[cut + 1] > ' ' && text[cut + 1] < 0x7F))
        cut = text.find('\n', cut + 1);
      if (cut == std::string_view::npos || cut + 1 >= text.size()) break;
      pieces.push_back(text.substr(0, cut + 1));
      text.remove_prefix(cut + 1);
    }
    if (!text.empty()) pieces.push_back(text);
  };
  for (std::string_view doc : documents) {
    // Leftmost-longest occurrences of the special tokens.
    size_t done = 0;
    while (done < doc.size()) {
      size_t best = std::string_view::npos, best_len = 0;
      for (const std::string& s : specials) {
        size_t at = doc.find(s, done);
        if (at < best || (at == best && at != std::string_view::npos && s.size() > best_len)) {
          best = at;
          best_len = s.size();
        }
      }
      if (best == std::string_view::npos) break;
      chunk(doc.substr(done, best - done));
      done = best + best_len;
    }
    if (done < doc.size()) chunk(doc.substr(done));
  }
  return pieces;
}

using Pair = uint64_t;  // left id << 32 | right id
Pair pair_of(int32_t a, int32_t b) {
  return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
}
int32_t left_of(Pair p) { return static_cast<int32_t>(p >> 32); }
int32_t right_of(Pair p) { return static_cast<int32_t>(p & 0xFFFFFFFF); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

struct PairInfo {
  int64_t count = 0;
  std::vector<uint32_t> words;  // may repeat and may list words that lost the pair
};

}  // namespace

std::vector<std::pair<std::string_view, int64_t>> count_words(
    const std::vector<std::string_view>& documents, const std::vector<std::string>& special_tokens,
    int threads) {
  std::vector<std::string_view> pieces = split_work(documents, special_tokens);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1, std::min<int>(threads, static_cast<int>(pieces.size())));
  using Counts = std::unordered_map<std::string_view, int64_t>;
  std::vector<Counts> counts(threads);
  std::atomic<size_t> next{0};
  auto work = [&](int t) {
    Counts& c = counts[t];
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      std::string_view text = pieces[i];
      for (size_t pos = 0; pos < text.size();) {
        size_t end = pretoken_end(PreTokenPattern::kGpt2, text, pos);
        ++c[text.substr(pos, end - pos)];
        pos = end;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  if (threads > 0) work(0);
  for (std::thread& th : pool) th.join();
  for (int t = 1; t < threads; ++t)
    for (const auto& [word, n] : counts[t]) counts[0][word] += n;
  std::vector<std::pair<std::string_view, int64_t>> out;
  if (!counts.empty()) out.assign(counts[0].begin(), counts[0].end());
  // A fixed order, so that everything downstream is deterministic.
  std::sort(out.begin(), out.end());
  return out;
}

BpeVocabulary learn_bpe(const std::vector<std::string_view>& documents,
                        const BpeTrainOptions& options) {
  int64_t n_special = static_cast<int64_t>(options.special_tokens.size());
  if (options.vocab_size < 256 + n_special)
    throw Error(Code::kInvalidArgument,
                fmt::format("vocabulary size {} is too small: the 256 byte tokens and {} special "
                            "token(s) need at least {}",
                            options.vocab_size, n_special, 256 + n_special));
  for (size_t i = 0; i < options.special_tokens.size(); ++i) {
    const std::string& s = options.special_tokens[i];
    if (s.empty()) throw Error(Code::kInvalidArgument, "a special token is empty");
    for (size_t pos = 0; pos < s.size();) {
      unicode::Utf8Char c = unicode::decode_utf8(s.data() + pos, s.data() + s.size());
      if (c.cp == unicode::kInvalidCodePoint)
        throw Error(Code::kInvalidArgument,
                    fmt::format("special token '{}' is not valid UTF-8", s));
      pos += c.len;
    }
    for (size_t j = 0; j < i; ++j)
      if (options.special_tokens[j] == s)
        throw Error(Code::kInvalidArgument, fmt::format("special token '{}' is given twice", s));
  }

  BpeVocabulary v;
  std::array<int32_t, 256> byte_id{};
  for (int i = 0; i < 256; ++i) {
    uint8_t b = gpt2_byte_order()[i];
    byte_id[b] = i;
    v.tokens.push_back(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
  }

  std::vector<Word> words;
  {
    auto counts = count_words(documents, options.special_tokens);
    words.reserve(counts.size());
    for (const auto& [text, n] : counts) {
      Word w{std::vector<int32_t>(text.size()), n};
      for (size_t i = 0; i < text.size(); ++i)
        w.symbols[i] = byte_id[static_cast<uint8_t>(text[i])];
      words.push_back(std::move(w));
    }
  }
  std::unordered_map<Pair, PairInfo> pairs;
  for (uint32_t i = 0; i < words.size(); ++i) {
    const Word& w = words[i];
    for (size_t k = 0; k + 1 < w.symbols.size(); ++k) {
      PairInfo& info = pairs[pair_of(w.symbols[k], w.symbols[k + 1])];
      info.count += w.count;
      if (info.words.empty() || info.words.back() != i) info.words.push_back(i);
    }
  }

  // Max-heap on count; among equal counts the smallest (left, right) by strings on top.
  struct Entry {
    int64_t count;
    Pair pair;
  };
  const std::vector<std::string>& tokens = v.tokens;
  auto below = [&tokens](const Entry& a, const Entry& b) {
    if (a.count != b.count) return a.count < b.count;
    const std::string& al = tokens[left_of(a.pair)];
    const std::string& bl = tokens[left_of(b.pair)];
    if (al != bl) return al > bl;
    return tokens[right_of(a.pair)] > tokens[right_of(b.pair)];
  };
  std::vector<Entry> initial;
  initial.reserve(pairs.size());
  for (const auto& [p, info] : pairs)
    if (info.count >= options.min_frequency) initial.push_back({info.count, p});
  std::priority_queue<Entry, std::vector<Entry>, decltype(below)> heap(below, std::move(initial));

  int64_t target = options.vocab_size - n_special;
  std::vector<Pair> touched;
  std::vector<int32_t> merged;
  while (static_cast<int64_t>(v.tokens.size()) < target && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    auto it = pairs.find(top.pair);
    int64_t actual = it == pairs.end() ? 0 : it->second.count;
    if (actual != top.count) {  // stale: the count dropped since this entry was pushed
      if (actual >= options.min_frequency) heap.push({actual, top.pair});
      continue;
    }
    if (actual < options.min_frequency) break;
    int32_t a = left_of(top.pair), b = right_of(top.pair);
    auto id = static_cast<int32_t>(v.tokens.size());
    v.tokens.push_back(v.tokens[a] + v.tokens[b]);
    v.merges.emplace_back(a, b);

    std::vector<uint32_t> where = std::move(it->second.words);
    std::sort(where.begin(), where.end());
    where.erase(std::unique(where.begin(), where.end()), where.end());
    touched.clear();
    for (uint32_t wi : where) {
      Word& w = words[wi];
      std::vector<int32_t>& s = w.symbols;
      // Rewrite the word: every (a, b) left to right becomes `id`; adjust the counts of the
      // pairs it loses and gains.
      merged.clear();
      bool changed = false;
      for (size_t k = 0; k < s.size(); ++k) {
        if (k + 1 < s.size() && s[k] == a && s[k + 1] == b) {
          merged.push_back(id);
          ++k;
          changed = true;
        } else {
          merged.push_back(s[k]);
        }
      }
      if (!changed) continue;
      for (size_t k = 0; k + 1 < s.size(); ++k) pairs[pair_of(s[k], s[k + 1])].count -= w.count;
      for (size_t k = 0; k + 1 < merged.size(); ++k) {
        Pair p = pair_of(merged[k], merged[k + 1]);
        PairInfo& info = pairs[p];
        info.count += w.count;
        if (merged[k] == id || merged[k + 1] == id) {
          if (info.words.empty() || info.words.back() != wi) info.words.push_back(wi);
          touched.push_back(p);
        }
      }
      s.swap(merged);
    }
    pairs.erase(top.pair);
    // Only pairs with the new token gained counts; the others are fixed when popped.
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (Pair p : touched) {
      int64_t count = pairs[p].count;
      if (count >= options.min_frequency) heap.push({count, p});
    }
    if (options.progress && (v.merges.size() % 500 == 0 || v.tokens.size() == size_t(target)))
      std::fprintf(stderr, "\r  merges: %zu / %lld (last pair seen %lld times)   ", v.merges.size(),
                   static_cast<long long>(target - 256), static_cast<long long>(actual));
  }
  if (options.progress) std::fprintf(stderr, "\n");

  v.special_begin = static_cast<int64_t>(v.tokens.size());
  for (const std::string& s : options.special_tokens) {
    if (std::find(v.tokens.begin(), v.tokens.end(), s) != v.tokens.end())
      throw Error(Code::kInvalidArgument,
                  fmt::format("special token '{}' is also a learnt token; choose a string that "
                              "text does not make, such as <|{}|>",
                              s, s));
    v.tokens.push_back(s);
  }
  return v;
}

void write_gpt2_files(const BpeVocabulary& v, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw IoError(fmt::format("{}: cannot create the directory ({})", dir.string(), ec.message()));
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t id = 0; id < v.tokens.size(); ++id) vocab[v.tokens[id]] = id;
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : v.merges) {
    merges += v.tokens[a];
    merges += ' ';
    merges += v.tokens[b];
    merges += '\n';
  }
  write_file_atomic(dir / "vocab.json", vocab.dump() + "\n");
  write_file_atomic(dir / "merges.txt", merges);
}

void train_bpe(const std::vector<std::string_view>& documents, const BpeTrainOptions& options,
               const std::filesystem::path& dir) {
  write_gpt2_files(learn_bpe(documents, options), dir);
}

}  // namespace loom::core
