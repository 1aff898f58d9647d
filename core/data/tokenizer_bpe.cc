// Encoding with a byte-level BPE: added tokens, pre-tokenisation, a per-thread word cache and
// the merge loop. See tokenizer.h for the pipeline.
#include "core/data/tokenizer_bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <unordered_map>

#include "core/data/bpe.h"
#include "core/data/unicode.h"
#include "core/util/errors.h"

namespace loom::core {
namespace {

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xC2B2AE3D27D4EB4Full);
  const char* p = s.data();
  size_t n = s.size();
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  if (n > 0) {
    uint64_t v = 0;
    std::memcpy(&v, p, n);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
  }
  h ^= h >> 29;
  h *= 0x9E3779B97F4A7C15ull;
  h ^= h >> 32;
  return h | 1;  // 0 marks an empty cache slot
}

// Pre-token bytes -> token ids, for one thread and one tokenizer. Open addressing over two
// arenas (key bytes, ids): no allocation per entry. Cleared when full, which keeps the
// frequent words of the current text cached.
class WordCache {
 public:
  static constexpr size_t kMaxKey = 255;  // longer pre-tokens are not cached
  static constexpr size_t kMaxSlots = size_t{1} << 18;

  bool lookup(std::string_view key, uint64_t hash, std::vector<int32_t>& out) const {
    if (slots_.empty()) return false;
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return false;
      if (s.hash == hash && s.key_len == key.size() &&
          std::memcmp(keys_.data() + s.key_off, key.data(), key.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.n_ids);
        return true;
      }
    }
  }

  void insert(std::string_view key, uint64_t hash, const int32_t* ids, size_t n) {
    if (key.size() > kMaxKey || n > 0xFFFF) return;
    if ((used_ + 1) * 2 > slots_.size()) {
      if (slots_.size() >= kMaxSlots)
        clear();
      else
        grow();
    }
    size_t i = hash & mask_;
    while (slots_[i].hash != 0) i = (i + 1) & mask_;
    slots_[i] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                 static_cast<uint16_t>(key.size()), static_cast<uint16_t>(n)};
    keys_.append(key);
    ids_.insert(ids_.end(), ids, ids + n);
    ++used_;
  }

  void release() { *this = WordCache(); }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, n_ids = 0;
  };

  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    used_ = 0;
  }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(std::max<size_t>(4096, old.size() * 2), Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.hash == 0) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].hash != 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t used_ = 0;
  std::string keys_;
  std::vector<int32_t> ids_;
};

// The cache of `owner` (a tokenizer's serial number) on this thread. A few tokenizers may be
// in use on one thread at once; the least recently used cache is recycled.
WordCache& thread_cache(uint64_t owner) {
  struct Entry {
    uint64_t owner = 0;
    uint64_t last_used = 0;
    WordCache cache;
  };
  thread_local std::array<Entry, 4> entries;
  thread_local uint64_t clock = 0;
  ++clock;
  Entry* victim = &entries[0];
  for (Entry& e : entries) {
    if (e.owner == owner) {
      e.last_used = clock;
      return e.cache;
    }
    if (e.last_used < victim->last_used) victim = &e;
  }
  victim->owner = owner;
  victim->last_used = clock;
  victim->cache.release();
  return victim->cache;
}

std::atomic<uint64_t> next_serial{1};

// Per-thread scratch of the encoder.
thread_local std::vector<int32_t> tl_symbols;
thread_local std::string tl_prefixed;

struct TransparentHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return hash_bytes(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, TransparentHash, std::equal_to<>>;

// Leftmost-longest matching of the added tokens (Hugging Face uses Aho-Corasick with
// MatchKind::LeftmostLongest; a trie walked from each candidate start gives the same matches).
class TokenMatcher {
 public:
  bool empty() const { return nodes_.size() == 1; }

  void add(std::string_view content, int32_t index) {
    int32_t node = 0;
    for (char ch : content) {
      auto c = static_cast<unsigned char>(ch);
      int32_t child = find_child(node, c);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].next.push_back({c, child});
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].token = index;
    first_[static_cast<unsigned char>(content[0])] = true;
  }

  // The first match at or after `from`: [start, end) and the token's index.
  bool find(std::string_view text, size_t from, size_t& start, size_t& end, int32_t& index) const {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_[s[i]]) continue;
      int32_t node = 0;
      index = -1;
      for (size_t j = i; j < text.size(); ++j) {
        node = find_child(node, s[j]);
        if (node < 0) break;
        if (nodes_[node].token >= 0) {
          index = nodes_[node].token;
          end = j + 1;
        }
      }
      if (index >= 0) {
        start = i;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    int32_t token = -1;
    std::vector<std::pair<unsigned char, int32_t>> next;
  };
  int32_t find_child(int32_t node, unsigned char c) const {
    for (const auto& [byte, child] : nodes_[node].next)
      if (byte == c) return child;
    return -1;
  }
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

bool is_space_at(std::string_view s, size_t pos, uint32_t* len) {
  unicode::Utf8Char c = unicode::decode_utf8(s.data() + pos, s.data() + s.size());
  *len = c.len;
  return unicode::char_class(c.cp) == unicode::CharClass::kSpace;
}

// Where the white space that ends at `end` starts (Rust regex `\s*$` on s[..end]).
size_t space_start_before(std::string_view s, size_t end) {
  while (end > 0) {
    size_t k = end - 1;
    while (k > 0 && end - k < 4 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    uint32_t len = 0;
    if (!is_space_at(s.substr(0, end), k, &len) || k + len != end) break;
    end = k;
  }
  return end;
}

// Where the white space that starts at `pos` ends (`^\s*` on s[pos..]).
size_t space_end_after(std::string_view s, size_t pos) {
  uint32_t len = 0;
  while (pos < s.size() && is_space_at(s, pos, &len)) pos += len;
  return pos;
}

// A token quoted for a message, control bytes escaped.
std::string printable(std::string_view token) {
  std::string out = "'";
  for (char ch : token) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F)
      out += fmt::format("\\x{:02x}", c);
    else
      out += ch;
  }
  return out + "'";
}

class ByteLevelBpe final : public Tokenizer {
 public:
  explicit ByteLevelBpe(ByteLevelBpeConfig config);

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    encode_into(text, ids);
    return ids;
  }

  void encode_into(std::string_view text, std::vector<int32_t>& out) const override {
    WordCache& cache = thread_cache(serial_);
    auto token = [&](int32_t id) { out.push_back(id); };
    auto segment = [&](std::string_view s) { encode_segment(s, cache, out); };
    // Hugging Face: tokens with normalized=false are split off first, then those with
    // normalized=true in what is left.
    split_added(
        unnormalized_, text,
        [&](std::string_view piece) { split_added(normalized_, piece, segment, token); }, token);
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size_ || kind_[id] == kNone)
        throw Error(Code::kInvalidArgument,
                    fmt::format("cannot decode id {}: {}", id,
                                id < 0 || id >= vocab_size_
                                    ? fmt::format("the vocabulary has ids 0..{}", vocab_size_ - 1)
                                    : std::string("no token has this id (a gap in the ids)")));
      out.append(decoded_, decoded_off_[id], decoded_off_[id + 1] - decoded_off_[id]);
    }
    return out;
  }

  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eod() const override { return eod_; }

  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
    if (auto it = token_ids_.find(token); it != token_ids_.end()) return it->second;
    return std::nullopt;
  }

  std::string id_to_token(int32_t id) const override {
    return id >= 0 && id < vocab_size_ ? token_[id] : std::string();
  }

  std::string describe() const override { return description_; }

 private:
  enum Kind : uint8_t { kNone, kModel, kAdded };

  template <class OnText, class OnToken>
  void split_added(const TokenMatcher& matcher, std::string_view s, OnText&& on_text,
                   OnToken&& on_token) const {
    if (matcher.empty()) {
      on_text(s);
      return;
    }
    // Hugging Face's AddedVocabulary::find_matches, lstrip/rstrip included.
    size_t done = 0, pos = 0, start = 0, end = 0;
    int32_t index = -1;
    while (pos < s.size() && matcher.find(s, pos, start, end, index)) {
      pos = end;
      const AddedToken& t = added_[index];
      if (t.lstrip) start = std::max(space_start_before(s, start), done);
      if (t.rstrip) end = space_end_after(s, end);
      if (done < start) on_text(s.substr(done, start - done));
      on_token(t.id);
      done = end;
    }
    if (done < s.size()) on_text(s.substr(done));
  }

  void encode_segment(std::string_view s, WordCache& cache, std::vector<int32_t>& out) const {
    if (s.empty()) return;
    if (!split_) {
      encode_piece(s, cache, out);
      return;
    }
    for (size_t pos = 0; pos < s.size();) {
      size_t end = pretoken_end(*split_, s, pos);
      encode_piece(s.substr(pos, end - pos), cache, out);
      pos = end;
    }
  }

  // Hugging Face's ByteLevel pre-tokeniser on one piece: the prefix space, then the GPT-2
  // pattern.
  void encode_piece(std::string_view s, WordCache& cache, std::vector<int32_t>& out) const {
    if (add_prefix_space_ && s[0] != ' ') {
      tl_prefixed.assign(1, ' ');
      tl_prefixed.append(s);
      s = tl_prefixed;
    }
    if (!byte_level_regex_) {
      encode_word(s, cache, out);
      return;
    }
    for (size_t pos = 0; pos < s.size();) {
      size_t end = pretoken_end(PreTokenPattern::kGpt2, s, pos);
      encode_word(s.substr(pos, end - pos), cache, out);
      pos = end;
    }
  }

  void encode_word(std::string_view w, WordCache& cache, std::vector<int32_t>& out) const {
    const auto* b = reinterpret_cast<const unsigned char*>(w.data());
    if (w.size() == 1) {
      out.push_back(byte_id_[b[0]]);
      return;
    }
    if (w.size() == 2 && !ignore_merges_) {
      int32_t l = byte_id_[b[0]], r = byte_id_[b[1]];
      if (const BpeMerges::Merge* m = merges_.find(l, r)) {
        out.push_back(m->id);
      } else {
        out.push_back(l);
        out.push_back(r);
      }
      return;
    }
    uint64_t hash = hash_bytes(w);
    if (cache.lookup(w, hash, out)) return;
    size_t start = out.size();
    auto whole = ignore_merges_ ? raw_vocab_.find(w) : raw_vocab_.end();
    if (whole != raw_vocab_.end()) {
      out.push_back(whole->second);
    } else {
      std::vector<int32_t>& symbols = tl_symbols;
      symbols.resize(w.size());
      for (size_t i = 0; i < w.size(); ++i) symbols[i] = byte_id_[b[i]];
      bpe_merge(merges_, symbols);
      out.insert(out.end(), symbols.begin(), symbols.end());
    }
    cache.insert(w, hash, out.data() + start, out.size() - start);
  }

  uint64_t serial_ = next_serial.fetch_add(1);
  int64_t vocab_size_ = 0;
  BpeMerges merges_;
  std::array<int32_t, 256> byte_id_{};
  std::optional<PreTokenPattern> split_;
  bool add_prefix_space_ = false;
  bool byte_level_regex_ = true;
  bool ignore_merges_ = false;

  std::vector<AddedToken> added_;
  TokenMatcher unnormalized_, normalized_;

  StringMap token_ids_;  // vocabulary string -> id
  StringMap added_ids_;  // added token content -> id
  StringMap raw_vocab_;  // raw bytes -> id (ignore_merges only)
  std::vector<std::string> token_;
  std::vector<Kind> kind_;
  std::string decoded_;              // the bytes of every id, back to back
  std::vector<size_t> decoded_off_;  // id -> offset in decoded_ (vocab_size + 1)
  std::optional<int32_t> eod_;
  std::string description_;
};

ByteLevelBpe::ByteLevelBpe(ByteLevelBpeConfig c)
    : split_(c.split),
      add_prefix_space_(c.add_prefix_space),
      byte_level_regex_(c.byte_level_regex),
      ignore_merges_(c.ignore_merges),
      description_(c.description) {
  // Ids: the vocabulary's and the added tokens', with holes allowed.
  int64_t max_id = -1;
  for (const auto& [token, id] : c.vocab) {
    if (id < 0)
      throw IoError(
          fmt::format("{}: token {} has the negative id {}", c.vocab_source, printable(token), id));
    max_id = std::max<int64_t>(max_id, id);
  }
  for (const AddedToken& t : c.added_tokens) {
    if (t.id < 0)
      throw IoError(fmt::format("{}: added token {} has the negative id {}", c.vocab_source,
                                printable(t.content), t.id));
    max_id = std::max<int64_t>(max_id, t.id);
  }
  vocab_size_ = max_id + 1;
  token_.resize(vocab_size_);
  kind_.assign(vocab_size_, kNone);
  token_ids_.reserve(c.vocab.size());
  for (const auto& [token, id] : c.vocab) {
    if (kind_[id] != kNone)
      throw IoError(fmt::format("{}: tokens {} and {} both have id {}; ids must be unique",
                                c.vocab_source, printable(token_[id]), printable(token), id));
    kind_[id] = kModel;
    token_[id] = token;
    token_ids_.emplace(token, id);
  }

  // Every byte needs a token, or some text could not be encoded.
  std::string missing;
  int n_missing = 0;
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    unicode::append_utf8(byte_to_code_point()[b], symbol);
    auto it = token_ids_.find(symbol);
    if (it != token_ids_.end()) {
      byte_id_[b] = it->second;
    } else if (n_missing++ < 8) {
      missing += fmt::format("{}0x{:02X} ('{}')", missing.empty() ? "" : ", ", b, symbol);
    }
  }
  if (n_missing > 0)
    throw IoError(fmt::format(
        "{}: {} of the 256 byte tokens are missing ({}{}); a byte-level BPE vocabulary needs "
        "one token per byte (GPT-2's bytes_to_unicode) so that any text can be encoded; train "
        "it with the byte-level alphabet (Hugging Face: initial_alphabet=ByteLevel.alphabet())",
        c.vocab_source, n_missing, missing, n_missing > 8 ? ", ..." : ""));

  for (size_t k = 0; k < c.merges.size(); ++k) {
    const std::string& left = c.merges[k].first;
    const std::string& right = c.merges[k].second;
    std::string where = k < c.merge_lines.size()
                            ? fmt::format("{}:{}", c.merges_source, c.merge_lines[k])
                            : fmt::format("{} (merge {})", c.merges_source, k);
    auto id_of = [&](const std::string& token, const char* what) {
      auto it = token_ids_.find(token);
      if (it == token_ids_.end())
        throw IoError(fmt::format("{}: merge '{} {}': {} {} is not in the vocabulary ({})", where,
                                  left, right, what, printable(token), c.vocab_source));
      return it->second;
    };
    int32_t l = id_of(left, "its left part");
    int32_t r = id_of(right, "its right part");
    int32_t m = id_of(left + right, "the merged token");
    merges_.insert(l, r, {static_cast<int32_t>(k), m});
  }

  // Added tokens: matched in the text, decoded to their content.
  for (const AddedToken& t : c.added_tokens) {
    if (t.content.empty()) continue;
    auto index = static_cast<int32_t>(added_.size());
    added_.push_back(t);
    (t.normalized ? normalized_ : unnormalized_).add(t.content, index);
    added_ids_[t.content] = t.id;
    token_[t.id] = t.content;
    kind_[t.id] = kAdded;
  }

  decoded_off_.resize(vocab_size_ + 1);
  for (int64_t id = 0; id < vocab_size_; ++id) {
    decoded_off_[id] = decoded_.size();
    // As Hugging Face's ByteLevel decoder: a token with a character outside the byte table
    // stands for its UTF-8 bytes. Added tokens always do (so text round-trips).
    if (kind_[id] == kAdded || !byte_level_to_bytes(token_[id], decoded_)) decoded_ += token_[id];
  }
  decoded_off_[vocab_size_] = decoded_.size();

  if (ignore_merges_) {
    std::string raw;
    for (const auto& [token, id] : c.vocab) {
      raw.clear();
      if (byte_level_to_bytes(token, raw)) raw_vocab_.emplace(raw, id);
    }
  }

  for (const std::string& name : {std::string("<|endoftext|>"), c.eos_token.value_or(""),
                                  std::string("<|end_of_text|>"), std::string("</s>")}) {
    if (name.empty()) continue;
    if (std::optional<int32_t> id = token_to_id(name)) {
      eod_ = id;
      break;
    }
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_level_bpe(ByteLevelBpeConfig config) {
  return std::make_unique<ByteLevelBpe>(std::move(config));
}

}  // namespace loom::core
