// Megatron's .bin/.idx format: loom's writer checked byte for byte by a reader written here
// from the format description (not loom's), loom's reader on files built by hand, every
// malformed file it must refuse, and random round trips.
#include "core/data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/util/errors.h"

namespace loom::core {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test.
fs::path test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / "indexed" / info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Little-endian byte builders for hand-made files.
struct Bytes {
  std::string s;
  Bytes& raw(const std::string& b) {
    s += b;
    return *this;
  }
  Bytes& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
    return *this;
  }
  Bytes& u8(uint64_t v) { return le(v, 1); }
  Bytes& u16(uint64_t v) { return le(v, 2); }
  Bytes& i32(int64_t v) { return le(static_cast<uint64_t>(v), 4); }
  Bytes& i64(int64_t v) { return le(static_cast<uint64_t>(v), 8); }
  Bytes& u64(uint64_t v) { return le(v, 8); }
};

const std::string kMagic("MMIDIDX\0\0", 9);

// An .idx from its parts, as Megatron's _IndexWriter lays it out.
std::string make_idx(uint8_t code, const std::vector<int32_t>& lengths,
                     const std::vector<int64_t>& pointers, const std::vector<int64_t>& docs) {
  Bytes b;
  b.raw(kMagic).u64(1).u8(code).u64(lengths.size()).u64(docs.size());
  for (int32_t l : lengths) b.i32(l);
  for (int64_t p : pointers) b.i64(p);
  for (int64_t d : docs) b.i64(d);
  return b.s;
}

// Contiguous pointers for `lengths` of `width`-byte tokens.
std::vector<int64_t> pointers_for(const std::vector<int32_t>& lengths, int64_t width) {
  std::vector<int64_t> p;
  int64_t at = 0;
  for (int32_t l : lengths) {
    p.push_back(at);
    at += l * width;
  }
  return p;
}

// ---- An independent reader, written from the format description only. -----------------

struct ParsedDataset {
  uint8_t code = 0;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, docs;
  std::vector<std::vector<int64_t>> sequences;  // token values, sign-correct per dtype
};

uint64_t get_le(const std::string& s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s.at(at + i))) << (8 * i);
  return v;
}

int64_t token_at(const std::string& bin, size_t at, uint8_t code) {
  switch (code) {
    case 1:
      return static_cast<uint8_t>(get_le(bin, at, 1));
    case 2:
      return static_cast<int8_t>(get_le(bin, at, 1));
    case 3:
      return static_cast<int16_t>(get_le(bin, at, 2));
    case 4:
      return static_cast<int32_t>(get_le(bin, at, 4));
    case 5:
      return static_cast<int64_t>(get_le(bin, at, 8));
    case 8:
      return static_cast<uint16_t>(get_le(bin, at, 2));
  }
  ADD_FAILURE() << "code " << int(code);
  return 0;
}

int width_of(uint8_t code) {
  switch (code) {
    case 1:
    case 2:
      return 1;
    case 3:
    case 8:
      return 2;
    case 4:
      return 4;
    case 5:
      return 8;
  }
  return 0;
}

ParsedDataset parse(const fs::path& prefix) {
  std::string idx = slurp(prefix.string() + ".idx");
  std::string bin = slurp(prefix.string() + ".bin");
  ParsedDataset p;
  EXPECT_EQ(idx.substr(0, 9), kMagic);
  EXPECT_EQ(get_le(idx, 9, 8), 1u);
  p.code = static_cast<uint8_t>(get_le(idx, 17, 1));
  uint64_t s = get_le(idx, 18, 8), d = get_le(idx, 26, 8);
  EXPECT_EQ(idx.size(), 34 + 4 * s + 8 * s + 8 * d);
  size_t at = 34;
  for (uint64_t i = 0; i < s; ++i, at += 4)
    p.lengths.push_back(static_cast<int32_t>(get_le(idx, at, 4)));
  for (uint64_t i = 0; i < s; ++i, at += 8)
    p.pointers.push_back(static_cast<int64_t>(get_le(idx, at, 8)));
  for (uint64_t i = 0; i < d; ++i, at += 8)
    p.docs.push_back(static_cast<int64_t>(get_le(idx, at, 8)));
  const int w = width_of(p.code);
  for (uint64_t i = 0; i < s; ++i) {
    std::vector<int64_t> seq;
    for (int32_t t = 0; t < p.lengths[i]; ++t)
      seq.push_back(token_at(bin, static_cast<size_t>(p.pointers[i]) + t * w, p.code));
    p.sequences.push_back(seq);
  }
  int64_t total = 0;
  for (int32_t l : p.lengths) total += l;
  EXPECT_EQ(static_cast<int64_t>(bin.size()), total * w);
  return p;
}

// The IoError message of opening `prefix` ("" and a test failure when it opens).
std::string open_error(const fs::path& prefix) {
  try {
    IndexedDataset ds(prefix);
    ADD_FAILURE() << prefix << " opened, but should not have";
  } catch (const IoError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an IoError: " << e.what();
  }
  return "";
}

// ---- Writer: byte-exact files. --------------------------------------------------------

TEST(IndexedDatasetWriter, WritesExactlyMegatronsBytesU16) {
  fs::path prefix = test_dir() / "tiny";
  {
    IndexedDatasetWriter w(prefix, IndexedDType::kU16);
    std::vector<int32_t> a = {1, 2, 3}, b = {}, c = {65535, 0};
    w.add_document(a);
    w.add_document(b);
    w.add_document(c);
    EXPECT_EQ(w.documents(), 3);
    EXPECT_EQ(w.tokens(), 5);
    w.finish();
  }
  // The empty document has no sequence, as Megatron's add_document(tokens=[], lengths=[]).
  Bytes idx;
  idx.raw(kMagic).u64(1).u8(8).u64(2).u64(4);
  idx.i32(3).i32(2);
  idx.i64(0).i64(6);
  idx.i64(0).i64(1).i64(1).i64(2);
  EXPECT_EQ(slurp(prefix.string() + ".idx"), idx.s);
  Bytes bin;
  bin.u16(1).u16(2).u16(3).u16(65535).u16(0);
  EXPECT_EQ(slurp(prefix.string() + ".bin"), bin.s);
  // No temporary files left beside them.
  EXPECT_EQ(std::distance(fs::directory_iterator(prefix.parent_path()), fs::directory_iterator()),
            2);
}

// Several sequences per document (what Megatron's --split-sentences writes).
TEST(IndexedDatasetWriter, WritesSentenceSplitDocuments) {
  fs::path prefix = test_dir() / "split";
  {
    IndexedDatasetWriter w(prefix, IndexedDType::kU16);
    std::vector<int32_t> a = {10, 11, 20, 30, 31, 32}, la = {2, 1, 3}, d = {40, 41}, ld = {2};
    w.add_document(a, la);
    w.add_document({}, {});
    w.add_document(d, ld);
    EXPECT_THROW(w.add_document(d, la), loom::Error);  // lengths do not sum to the tokens
    EXPECT_EQ(w.documents(), 3);
    EXPECT_EQ(w.sequences(), 4);
    w.finish();
  }
  Bytes idx;
  idx.raw(kMagic).u64(1).u8(8).u64(4).u64(4);
  idx.i32(2).i32(1).i32(3).i32(2);
  idx.i64(0).i64(4).i64(6).i64(12);
  idx.i64(0).i64(3).i64(3).i64(4);
  EXPECT_EQ(slurp(prefix.string() + ".idx"), idx.s);
}

TEST(IndexedDatasetWriter, WritesExactlyMegatronsBytesI32) {
  fs::path prefix = test_dir() / "tiny";
  {
    IndexedDatasetWriter w(prefix, indexed_dtype_for_vocab(100000));
    std::vector<int32_t> a = {70000, 1}, b = {2147483647};
    w.add_document(a);
    w.add_document(b);
    w.finish();
  }
  Bytes idx;
  idx.raw(kMagic).u64(1).u8(4).u64(2).u64(3);
  idx.i32(2).i32(1);
  idx.i64(0).i64(8);
  idx.i64(0).i64(1).i64(2);
  EXPECT_EQ(slurp(prefix.string() + ".idx"), idx.s);
  Bytes bin;
  bin.i32(70000).i32(1).i32(2147483647);
  EXPECT_EQ(slurp(prefix.string() + ".bin"), bin.s);
}

TEST(IndexedDatasetWriter, EmptyDatasetIsValid) {
  fs::path prefix = test_dir() / "empty";
  IndexedDatasetWriter(prefix, IndexedDType::kU16).finish();
  EXPECT_EQ(slurp(prefix.string() + ".idx"), make_idx(8, {}, {}, {0}));
  EXPECT_EQ(slurp(prefix.string() + ".bin"), "");
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequences(), 0);
  EXPECT_EQ(ds.documents(), 0);
  EXPECT_EQ(ds.tokens(), 0);
}

TEST(IndexedDtype, MegatronsChoiceAndNames) {
  EXPECT_EQ(indexed_dtype_for_vocab(50257), IndexedDType::kU16);
  EXPECT_EQ(indexed_dtype_for_vocab(65499), IndexedDType::kU16);
  EXPECT_EQ(indexed_dtype_for_vocab(65500), IndexedDType::kI32);
  EXPECT_EQ(indexed_dtype_for_vocab(128256), IndexedDType::kI32);
  EXPECT_EQ(indexed_dtype_size(IndexedDType::kU16), 2);
  EXPECT_EQ(indexed_dtype_size(IndexedDType::kI64), 8);
  EXPECT_STREQ(indexed_dtype_name(IndexedDType::kU16), "u16");
  EXPECT_STREQ(indexed_dtype_name(IndexedDType::kI32), "i32");
}

// ---- Round trips over every integer dtype. --------------------------------------------

struct DtypeCase {
  IndexedDType dtype;
  int64_t lo, hi;
};

class RoundTrip : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(RoundTrip, RandomDatasets) {
  const DtypeCase c = GetParam();
  std::mt19937_64 rng(static_cast<uint64_t>(c.dtype) * 7919);
  for (int trial = 0; trial < 4; ++trial) {
    fs::path prefix = test_dir() / ("r" + std::to_string(trial));
    std::uniform_int_distribution<int64_t> id(c.lo, c.hi);
    std::uniform_int_distribution<int> docs(0, 300), len(1, trial == 3 ? 5000 : 40);
    std::vector<std::vector<int32_t>> want(static_cast<size_t>(docs(rng)));
    {
      IndexedDatasetWriter w(prefix, c.dtype);
      for (auto& d : want) {
        d.resize(static_cast<size_t>(len(rng)));
        for (int32_t& t : d) t = static_cast<int32_t>(id(rng));
        w.add_document(d);
      }
      w.finish();
    }
    // The independent reader sees what was written...
    ParsedDataset p = parse(prefix);
    EXPECT_EQ(p.code, static_cast<uint8_t>(c.dtype));
    ASSERT_EQ(p.sequences.size(), want.size());
    ASSERT_EQ(p.docs.size(), want.size() + 1);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(p.docs[i], static_cast<int64_t>(i));
      EXPECT_EQ(p.sequences[i], std::vector<int64_t>(want[i].begin(), want[i].end())) << i;
    }
    EXPECT_EQ(p.pointers, pointers_for(p.lengths, indexed_dtype_size(c.dtype)));
    // ...and so does loom's.
    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), c.dtype);
    ASSERT_EQ(ds.sequences(), static_cast<int64_t>(want.size()));
    EXPECT_EQ(ds.documents(), static_cast<int64_t>(want.size()));
    int64_t tokens = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(ds.sequence(static_cast<int64_t>(i)), want[i]) << i;
      EXPECT_EQ(ds.sequence_lengths()[i], static_cast<int32_t>(want[i].size()));
      tokens += static_cast<int64_t>(want[i].size());
      if (want[i].size() >= 3) {  // a window inside the sequence
        int32_t out[2];
        ds.read(static_cast<int64_t>(i), 1, 2, out);
        EXPECT_EQ(out[0], want[i][1]);
        EXPECT_EQ(out[1], want[i][2]);
      }
    }
    EXPECT_EQ(ds.tokens(), tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, RoundTrip,
    ::testing::Values(DtypeCase{IndexedDType::kU8, 0, 255}, DtypeCase{IndexedDType::kI8, -128, 127},
                      DtypeCase{IndexedDType::kI16, -32768, 32767},
                      DtypeCase{IndexedDType::kU16, 0, 65535},
                      DtypeCase{IndexedDType::kI32, -2147483647 - 1, 2147483647},
                      DtypeCase{IndexedDType::kI64, -2147483647 - 1, 2147483647}),
    [](const auto& info) { return std::string(indexed_dtype_name(info.param.dtype)); });

// ---- Writer refusals and cleanup. -----------------------------------------------------

TEST(IndexedDatasetWriter, RefusesIdsOutsideTheDtype) {
  fs::path prefix = test_dir() / "bad";
  IndexedDatasetWriter w(prefix, IndexedDType::kU16);
  std::vector<int32_t> ok = {5}, big = {1, 65536}, negative = {-1};
  w.add_document(ok);
  try {
    w.add_document(big);
    FAIL() << "65536 accepted as u16";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("65536"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("u16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(w.add_document(negative), loom::Error);
  // A refused document leaves nothing behind.
  EXPECT_EQ(w.documents(), 1);
  w.finish();
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequences(), 1);
  EXPECT_EQ(ds.sequence(0), ok);

  IndexedDatasetWriter w8(test_dir() / "u8", IndexedDType::kU8);
  std::vector<int32_t> b256 = {256};
  EXPECT_THROW(w8.add_document(b256), loom::Error);
  EXPECT_THROW(IndexedDatasetWriter(test_dir() / "f", IndexedDType::kF32), loom::Error);
}

TEST(IndexedDatasetWriter, DestroyedBeforeFinishLeavesNoFiles) {
  fs::path dir = test_dir();
  {
    IndexedDatasetWriter w(dir / "gone", IndexedDType::kU16);
    std::vector<int32_t> doc(300000, 7);  // past the flush size: .bin bytes on disk
    w.add_document(doc);
    w.add_document(doc);
    EXPECT_FALSE(fs::is_empty(dir));
  }
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(IndexedDatasetWriter, MissingDirectoryIsAnIoError) {
  fs::path prefix = test_dir() / "no" / "such" / "dir" / "x";
  try {
    IndexedDatasetWriter w(prefix, IndexedDType::kU16);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("x.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exist"), std::string::npos) << e.what();
  }
}

TEST(IndexedDatasetWriter, ReplacesAnOlderDataset) {
  fs::path prefix = test_dir() / "d";
  for (int32_t value : {1, 2}) {
    IndexedDatasetWriter w(prefix, IndexedDType::kU16);
    std::vector<int32_t> doc(static_cast<size_t>(value), value);
    w.add_document(doc);
    w.finish();
  }
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequence(0), (std::vector<int32_t>{2, 2}));
}

// ---- Reader on hand-built files. ------------------------------------------------------

TEST(IndexedDataset, ReadsSentenceSplitDocumentsAndEmptyDocuments) {
  // Megatron with --split-sentences: document 0 = sequences 0..2, document 1 is empty,
  // document 2 = sequence 3.
  fs::path prefix = test_dir() / "split";
  std::vector<int32_t> lengths = {2, 1, 3, 2};
  spit(prefix.string() + ".idx", make_idx(8, lengths, pointers_for(lengths, 2), {0, 3, 3, 4}));
  Bytes bin;
  for (int t : {10, 11, 20, 30, 31, 32, 40, 41}) bin.u16(t);
  spit(prefix.string() + ".bin", bin.s);
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequences(), 4);
  EXPECT_EQ(ds.documents(), 3);
  EXPECT_EQ(ds.tokens(), 8);
  EXPECT_EQ(ds.dtype(), IndexedDType::kU16);
  EXPECT_EQ(std::vector<int64_t>(ds.document_indices().begin(), ds.document_indices().end()),
            (std::vector<int64_t>{0, 3, 3, 4}));
  EXPECT_EQ(std::vector<int64_t>(ds.sequence_pointers().begin(), ds.sequence_pointers().end()),
            (std::vector<int64_t>{0, 4, 6, 12}));
  EXPECT_EQ(ds.sequence(2), (std::vector<int32_t>{30, 31, 32}));
  EXPECT_EQ(ds.sequence(3), (std::vector<int32_t>{40, 41}));
}

TEST(IndexedDataset, AcceptsAMultimodalIndexAndIgnoresItsModes) {
  fs::path prefix = test_dir() / "mm";
  std::vector<int32_t> lengths = {1, 2};
  spit(prefix.string() + ".idx",
       make_idx(4, lengths, pointers_for(lengths, 4), {0, 1, 2}) + std::string("\x00\x01", 2));
  spit(prefix.string() + ".bin", Bytes().i32(7).i32(8).i32(9).s);
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequence(1), (std::vector<int32_t>{8, 9}));
}

TEST(IndexedDataset, ReadIsBoundsChecked) {
  fs::path prefix = test_dir() / "b";
  {
    IndexedDatasetWriter w(prefix, IndexedDType::kU16);
    std::vector<int32_t> doc = {1, 2, 3};
    w.add_document(doc);
    w.finish();
  }
  IndexedDataset ds(prefix);
  int32_t out[4];
  ds.read(0, 3, 0, out);  // an empty read at the end is fine
  for (auto [seq, off, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 0, 1}, {-1, 0, 1}, {0, 2, 2}, {0, -1, 1}, {0, 0, 4}, {0, 0, -1}}) {
    try {
      ds.read(seq, off, n, out);
      ADD_FAILURE() << seq << " " << off << " " << n;
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), Code::kInvalidArgument);
    }
  }
}

// ---- Every malformed file, with the file named and the problem said. ------------------

struct BadFiles : ::testing::Test {
  fs::path prefix;
  std::string idx_name, bin_name;
  void SetUp() override {
    prefix = test_dir() / "x";
    idx_name = prefix.string() + ".idx";
    bin_name = prefix.string() + ".bin";
  }
  // A good u16 dataset of 10 one-token sequences, 10 documents.
  std::vector<int32_t> lengths = std::vector<int32_t>(10, 1);
  std::vector<int64_t> docs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::string good_idx() { return make_idx(8, lengths, pointers_for(lengths, 2), docs); }
  std::string good_bin() { return std::string(20, '\x01'); }
  void write(const std::string& idx, const std::string& bin) {
    spit(idx_name, idx);
    spit(bin_name, bin);
  }
  void expect(const std::string& message, const std::vector<std::string>& words) {
    for (const std::string& w : words)
      EXPECT_NE(message.find(w), std::string::npos) << "'" << w << "' not in: " << message;
  }
};

TEST_F(BadFiles, GoodFileOpens) {
  write(good_idx(), good_bin());
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.tokens(), 10);
}

TEST_F(BadFiles, Missing) {
  expect(open_error(prefix), {idx_name, "cannot open", "PREFIX.idx and PREFIX.bin"});
  spit(idx_name, good_idx());
  expect(open_error(prefix), {bin_name, "cannot open"});
}

TEST_F(BadFiles, EmptyAndTruncatedHeader) {
  write("", good_bin());
  expect(open_error(prefix), {idx_name, "empty file"});
  write(good_idx().substr(0, 20), good_bin());
  expect(open_error(prefix), {idx_name, "truncated header: 20 bytes, 34 needed"});
}

TEST_F(BadFiles, BadMagic) {
  std::string idx = good_idx();
  idx[0] = 'X';
  write(idx, good_bin());
  expect(open_error(prefix),
         {idx_name, "bad magic (expected MMIDIDX\\0\\0; is this a Megatron .idx?)"});
}

TEST_F(BadFiles, BadVersion) {
  std::string idx = good_idx();
  idx[9] = 2;
  write(idx, good_bin());
  expect(open_error(prefix), {idx_name, "version 2", "expected 1"});
}

TEST_F(BadFiles, UnknownAndFloatDtypeCodes) {
  for (int code : {0, 9, 255}) {
    std::string idx = good_idx();
    idx[17] = static_cast<char>(code);
    write(idx, good_bin());
    expect(open_error(prefix), {idx_name, "unknown dtype code " + std::to_string(code)});
  }
  std::string idx = good_idx();
  idx[17] = 7;
  write(idx, good_bin());
  expect(open_error(prefix), {idx_name, "f32", "no token ids"});
}

TEST_F(BadFiles, TruncatedArrays) {
  std::string idx = good_idx().substr(0, 72);
  write(idx, good_bin());
  expect(open_error(prefix), {idx_name,
                              "header says 10 sequences and 11 document indices but the "
                              "file holds 72 bytes, 242 needed"});
  // A header whose counts would overflow 64-bit sizes.
  idx = good_idx();
  std::string huge = Bytes().u64(~uint64_t{0} / 4).s;
  idx.replace(18, 8, huge);
  write(idx, good_bin());
  expect(open_error(prefix), {idx_name, "needed"});
}

TEST_F(BadFiles, TrailingBytes) {
  write(good_idx() + std::string(3, '\0'), good_bin());
  expect(open_error(prefix), {idx_name, "3 trailing bytes"});
}

TEST_F(BadFiles, NoDocumentIndices) {
  write(make_idx(8, lengths, pointers_for(lengths, 2), {}), good_bin());
  expect(open_error(prefix), {idx_name, "0 document indices"});
}

TEST_F(BadFiles, PointersNotContiguous) {
  std::vector<int64_t> pointers = pointers_for(lengths, 2);
  pointers[3] = 40;
  write(make_idx(8, lengths, pointers, docs), good_bin());
  expect(open_error(prefix),
         {idx_name, "sequence 3 pointer 40 != previous pointer + length * 2 = 6"});
  pointers = pointers_for(lengths, 2);
  for (auto& p : pointers) p += 2;
  write(make_idx(8, lengths, pointers, docs), good_bin());
  expect(open_error(prefix), {idx_name, "sequence 0 pointer 2 != 0"});
}

TEST_F(BadFiles, NegativeLength) {
  std::vector<int32_t> l = lengths;
  l[4] = -1;
  write(make_idx(8, l, pointers_for(l, 2), docs), good_bin());
  expect(open_error(prefix), {idx_name, "sequence 4 has negative length -1"});
}

TEST_F(BadFiles, DocumentIndices) {
  std::vector<int64_t> d = docs;
  d.back() = 9;
  write(make_idx(8, lengths, pointers_for(lengths, 2), d), good_bin());
  expect(open_error(prefix), {idx_name, "last document index 9 != sequence count 10"});
  d = docs;
  d[0] = 1;
  write(make_idx(8, lengths, pointers_for(lengths, 2), d), good_bin());
  expect(open_error(prefix), {idx_name, "first document index 1 != 0"});
  d = docs;
  d[5] = 3;
  write(make_idx(8, lengths, pointers_for(lengths, 2), d), good_bin());
  expect(open_error(prefix), {idx_name, "document index 5 is 3", "must not decrease"});
}

TEST_F(BadFiles, BinSize) {
  write(good_idx(), std::string(12, '\0'));
  expect(open_error(prefix), {bin_name, "12 bytes but the index needs 20"});
  write(good_idx(), std::string(24, '\0'));
  expect(open_error(prefix), {bin_name, "24 bytes but the index accounts for only 20"});
}

}  // namespace
}  // namespace loom::core
