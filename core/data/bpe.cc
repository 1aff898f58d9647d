#include "core/data/bpe.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <queue>

#include "core/data/unicode.h"

namespace loom::core {
namespace {

struct ByteTables {
  std::array<uint32_t, 256> code_point{};
  std::array<uint8_t, 256> order{};
  // code point -> byte + 1 for the 324 code points below U+0144 (0: not a byte's symbol).
  std::array<uint16_t, 0x144> byte_of{};
};

// GPT-2's bytes_to_unicode(): printable bytes stand for themselves, the others for 256 + n in
// increasing order.
ByteTables make_byte_tables() {
  ByteTables t;
  std::array<bool, 256> printable{};
  int n = 0;
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  for (int b = 0; b < 256; ++b)
    if (printable[b]) t.order[n++] = static_cast<uint8_t>(b);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    if (printable[b]) {
      t.code_point[b] = static_cast<uint32_t>(b);
    } else {
      t.code_point[b] = static_cast<uint32_t>(256 + extra++);
      t.order[n++] = static_cast<uint8_t>(b);
    }
    t.byte_of[t.code_point[b]] = static_cast<uint16_t>(b + 1);
  }
  return t;
}

const ByteTables& tables() {
  static const ByteTables t = make_byte_tables();
  return t;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_code_point() { return tables().code_point; }
const std::array<uint8_t, 256>& gpt2_byte_order() { return tables().order; }

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& cp = tables().code_point;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) unicode::append_utf8(cp[static_cast<unsigned char>(c)], out);
  return out;
}

bool byte_level_to_bytes(std::string_view token, std::string& out) {
  const auto& byte_of = tables().byte_of;
  size_t start = out.size();
  for (size_t i = 0; i < token.size();) {
    unicode::Utf8Char c = unicode::decode_utf8(token.data() + i, token.data() + token.size());
    if (c.cp >= byte_of.size() || byte_of[c.cp] == 0) {
      out.resize(start);
      return false;
    }
    out.push_back(static_cast<char>(byte_of[c.cp] - 1));
    i += c.len;
  }
  return true;
}

void BpeMerges::insert(int32_t left, int32_t right, Merge merge) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  uint64_t key = pack(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.merge = merge;
      return;
    }
    if (s.key == kEmpty) {
      s = {key, merge};
      ++size_;
      return;
    }
  }
}

void BpeMerges::grow() {
  std::vector<Slot> old = std::move(slots_);
  size_t capacity = std::max<size_t>(64, old.size() * 2);
  slots_.assign(capacity, Slot{kEmpty, {0, 0}});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t i = slot_of(s.key);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void bpe_merge_scan(const BpeMerges& merges, std::vector<int32_t>& symbols) {
  // rank[i], id[i]: the merge of (symbols[i], symbols[i + 1]); INT_MAX when there is none.
  constexpr size_t kInline = 64;
  size_t n = symbols.size();
  if (n < 2) return;
  int32_t inline_rank[kInline], inline_id[kInline];
  std::vector<int32_t> heap_rank, heap_id;
  int32_t* rank = inline_rank;
  int32_t* id = inline_id;
  if (n > kInline) {
    heap_rank.resize(n);
    heap_id.resize(n);
    rank = heap_rank.data();
    id = heap_id.data();
  }
  int32_t* sym = symbols.data();
  auto look = [&](size_t i) {
    const BpeMerges::Merge* m = merges.find(sym[i], sym[i + 1]);
    rank[i] = m ? m->rank : INT_MAX;
    id[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT_MAX) break;
    sym[best] = id[best];
    // Drop symbol best + 1 and pair best; pairs best - 1 and best change.
    std::copy(sym + best + 2, sym + n, sym + best + 1);
    std::copy(rank + best + 1, rank + n - 1, rank + best);
    std::copy(id + best + 1, id + n - 1, id + best);
    --n;
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
  symbols.resize(n);
}

void bpe_merge_heap(const BpeMerges& merges, std::vector<int32_t>& symbols) {
  // Hugging Face's Word::merge_all: a min-heap of (rank, position) over a linked list of
  // symbols; stale entries are skipped when popped.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool live;
  };
  struct Entry {
    int32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  size_t n = symbols.size();
  if (n < 2) return;
  std::vector<Symbol> s(n);
  std::vector<Entry> storage;
  storage.reserve(n);
  for (size_t i = 0; i < n; ++i)
    s[i] = {symbols[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1,
            true};
  for (size_t i = 0; i + 1 < n; ++i)
    if (const BpeMerges::Merge* m = merges.find(symbols[i], symbols[i + 1]))
      storage.push_back({m->rank, static_cast<int32_t>(i), m->id});
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue(std::greater<Entry>(),
                                                                            std::move(storage));
  while (!queue.empty()) {
    Entry top = queue.top();
    queue.pop();
    Symbol& left = s[top.pos];
    if (!left.live || left.next < 0) continue;
    Symbol& right = s[left.next];
    const BpeMerges::Merge* m = merges.find(left.id, right.id);
    if (m == nullptr || m->id != top.id) continue;  // stale: the pair has changed
    left.id = top.id;
    right.live = false;
    left.next = right.next;
    if (right.next >= 0) s[right.next].prev = top.pos;
    if (left.prev >= 0)
      if (const BpeMerges::Merge* p = merges.find(s[left.prev].id, left.id))
        queue.push({p->rank, left.prev, p->id});
    if (left.next >= 0)
      if (const BpeMerges::Merge* p = merges.find(left.id, s[left.next].id))
        queue.push({p->rank, top.pos, p->id});
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i)
    if (s[i].live) symbols[out++] = s[i].id;
  symbols.resize(out);
}

void bpe_merge(const BpeMerges& merges, std::vector<int32_t>& symbols) {
  // The scan is quadratic but allocation-free and faster below a few dozen symbols.
  if (symbols.size() <= 48)
    bpe_merge_scan(merges, symbols);
  else
    bpe_merge_heap(merges, symbols);
}

}  // namespace loom::core
