#include "core/data/indexed_dataset.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/util/errors.h"
#include "core/util/files.h"
#include "loom/cpp/error.h"

namespace loom::core {

// The reader hands out the index arrays and the writer stores ids as the host lays them
// out; both files are little-endian.
static_assert(std::endian::native == std::endian::little,
              "indexed datasets need a little-endian host");

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, S, D
constexpr size_t kFlushBytes = size_t{1} << 20;

fs::path with_suffix(const fs::path& prefix, const char* suffix) {
  fs::path p = prefix;
  p += suffix;
  return p;
}

std::string to_string(unsigned __int128 v) {
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return digits;
}

bool valid_code(uint8_t code) { return code >= 1 && code <= 8; }

bool is_float(IndexedDType dtype) {
  return dtype == IndexedDType::kF32 || dtype == IndexedDType::kF64;
}

// [lo, hi] of the ids a dtype holds, as int64 (int32 ids fit every integer dtype but the
// narrow ones).
std::pair<int64_t, int64_t> id_range(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::kU8:
      return {0, 255};
    case IndexedDType::kI8:
      return {-128, 127};
    case IndexedDType::kI16:
      return {-32768, 32767};
    case IndexedDType::kU16:
      return {0, 65535};
    default:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  }
}

// Reads exactly `size` bytes at `offset` of `fd`.
void read_at(int fd, uint64_t offset, void* dst, size_t size, const fs::path& path) {
  auto* p = static_cast<unsigned char*>(dst);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw IoError(fmt::format("{}: read failed: {}", path.string(), std::strerror(errno)));
    if (n == 0) throw IoError(fmt::format("{}: file shrank while being read", path.string()));
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

// Opens `path` read-only and returns its size; the IoError says which of the pair is missing.
int open_for_read(const fs::path& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    throw IoError(
        fmt::format("{}: cannot open ({}){}", path.string(), std::strerror(err),
                    err == ENOENT ? "; a dataset PREFIX names PREFIX.idx and PREFIX.bin" : ""));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(fmt::format("{}: not a regular file", path.string()));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// Closes a file descriptor when the scope ends.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

template <class T>
void convert(const unsigned char* src, int64_t count, int32_t* out) {
  // memcpy per element: .bin offsets are multiples of the element size, but a caller's
  // pointer arithmetic is not ours to trust for alignment.
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, src + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    out[i] = static_cast<int32_t>(v);
  }
}

}  // namespace

int64_t indexed_dtype_size(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::kU8:
    case IndexedDType::kI8:
      return 1;
    case IndexedDType::kI16:
    case IndexedDType::kU16:
      return 2;
    case IndexedDType::kI32:
    case IndexedDType::kF32:
      return 4;
    case IndexedDType::kI64:
    case IndexedDType::kF64:
      return 8;
  }
  return 0;
}

const char* indexed_dtype_name(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::kU8:
      return "u8";
    case IndexedDType::kI8:
      return "i8";
    case IndexedDType::kI16:
      return "i16";
    case IndexedDType::kI32:
      return "i32";
    case IndexedDType::kI64:
      return "i64";
    case IndexedDType::kF64:
      return "f64";
    case IndexedDType::kF32:
      return "f32";
    case IndexedDType::kU16:
      return "u16";
  }
  return "?";
}

IndexedDType indexed_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::kU16 : IndexedDType::kI32;
}

// ---------------------------------------------------------------------------------------
// Reader

IndexedDataset::IndexedDataset(const fs::path& prefix) : prefix_(prefix) {
  const fs::path idx_path = with_suffix(prefix, ".idx");
  const fs::path bin_path = with_suffix(prefix, ".bin");
  const std::string idx_name = idx_path.string();

  uint64_t idx_size = 0;
  FdCloser idx{open_for_read(idx_path, &idx_size)};
  if (idx_size == 0)
    throw IoError(fmt::format("{}: empty file; a Megatron .idx starts with a {}-byte header",
                              idx_name, kHeaderBytes));
  if (idx_size < kHeaderBytes)
    throw IoError(
        fmt::format("{}: truncated header: {} bytes, {} needed", idx_name, idx_size, kHeaderBytes));

  unsigned char header[kHeaderBytes];
  read_at(idx.fd, 0, header, kHeaderBytes, idx_path);
  if (std::memcmp(header, kMagic, sizeof kMagic) != 0)
    throw IoError(
        fmt::format("{}: bad magic (expected MMIDIDX\\0\\0; is this a Megatron .idx?)", idx_name));
  uint64_t version, sequences, doc_count;
  std::memcpy(&version, header + 9, 8);
  uint8_t code = header[17];
  std::memcpy(&sequences, header + 18, 8);
  std::memcpy(&doc_count, header + 26, 8);
  if (version != 1)
    throw IoError(fmt::format("{}: version {} is not supported (expected 1)", idx_name, version));
  if (!valid_code(code))
    throw IoError(fmt::format(
        "{}: unknown dtype code {} (Megatron's codes are 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, "
        "6 f64, 7 f32, 8 u16)",
        idx_name, code));
  dtype_ = static_cast<IndexedDType>(code);
  if (is_float(dtype_))
    throw IoError(
        fmt::format("{}: dtype {} (code {}) holds no token ids; loom reads integer "
                    "token datasets",
                    idx_name, indexed_dtype_name(dtype_), code));
  if (doc_count == 0)
    throw IoError(fmt::format(
        "{}: header says 0 document indices; at least the leading 0 is needed", idx_name));

  // Sizes in unsigned 128-bit arithmetic: a corrupt header must not wrap around.
  using u128 = unsigned __int128;
  const u128 needed = u128{kHeaderBytes} + u128{sequences} * 12 + u128{doc_count} * 8;
  if (u128{idx_size} < needed)
    throw IoError(fmt::format(
        "{}: header says {} sequences and {} document indices but the file holds {} bytes, {} "
        "needed",
        idx_name, sequences, doc_count, idx_size, to_string(needed)));
  // Megatron's multimodal datasets append int8[S] sequence modes; text needs none of them.
  if (u128{idx_size} != needed && u128{idx_size} != needed + sequences)
    throw IoError(fmt::format(
        "{}: {} bytes, but {} sequences and {} document indices take {} ({} trailing bytes)",
        idx_name, idx_size, sequences, doc_count, to_string(needed),
        to_string(u128{idx_size} - needed)));

  lengths_.resize(sequences);
  pointers_.resize(sequences);
  doc_index_.resize(doc_count);
  uint64_t offset = kHeaderBytes;
  read_at(idx.fd, offset, lengths_.data(), sequences * 4, idx_path);
  offset += sequences * 4;
  read_at(idx.fd, offset, pointers_.data(), sequences * 8, idx_path);
  offset += sequences * 8;
  read_at(idx.fd, offset, doc_index_.data(), doc_count * 8, idx_path);

  // Pointers are contiguous from 0, as Megatron's _IndexWriter computes them.
  const int64_t width = indexed_dtype_size(dtype_);
  int64_t expected = 0;
  for (uint64_t i = 0; i < sequences; ++i) {
    if (lengths_[i] < 0)
      throw IoError(
          fmt::format("{}: sequence {} has negative length {}", idx_name, i, lengths_[i]));
    if (pointers_[i] != expected) {
      if (i == 0)
        throw IoError(fmt::format("{}: sequence 0 pointer {} != 0", idx_name, pointers_[0]));
      throw IoError(fmt::format("{}: sequence {} pointer {} != previous pointer + length * {} = {}",
                                idx_name, i, pointers_[i], width, expected));
    }
    expected += int64_t{lengths_[i]} * width;
    tokens_ += lengths_[i];
  }
  if (doc_index_[0] != 0)
    throw IoError(fmt::format("{}: first document index {} != 0", idx_name, doc_index_[0]));
  for (uint64_t d = 1; d < doc_count; ++d)
    if (doc_index_[d] < doc_index_[d - 1])
      throw IoError(
          fmt::format("{}: document index {} is {}, less than the previous {}; they "
                      "must not decrease",
                      idx_name, d, doc_index_[d], doc_index_[d - 1]));
  if (doc_index_.back() != static_cast<int64_t>(sequences))
    throw IoError(fmt::format("{}: last document index {} != sequence count {}", idx_name,
                              doc_index_.back(), sequences));

  uint64_t bin_size = 0;
  FdCloser bin{open_for_read(bin_path, &bin_size)};
  const uint64_t bin_needed = static_cast<uint64_t>(expected);
  if (bin_size < bin_needed)
    throw IoError(fmt::format("{}: {} bytes but the index needs {}", bin_path.string(), bin_size,
                              bin_needed));
  if (bin_size > bin_needed)
    throw IoError(
        fmt::format("{}: {} bytes but the index accounts for only {}; is {} the "
                    "index of this file?",
                    bin_path.string(), bin_size, bin_needed, idx_name));
  bin_size_ = static_cast<size_t>(bin_size);
  if (bin_size_ > 0) {
    void* p = ::mmap(nullptr, bin_size_, PROT_READ, MAP_SHARED, bin.fd, 0);
    if (p == MAP_FAILED)
      throw IoError(fmt::format("{}: mmap failed: {}", bin_path.string(), std::strerror(errno)));
    bin_ = static_cast<const unsigned char*>(p);
  }
}

IndexedDataset::~IndexedDataset() {
  if (bin_ != nullptr) ::munmap(const_cast<unsigned char*>(bin_), bin_size_);
}

void IndexedDataset::read(int64_t sequence, int64_t offset, int64_t count, int32_t* out) const {
  if (sequence < 0 || sequence >= sequences())
    fail(Code::kInvalidArgument, fmt::format("{}: sequence {} out of range [0, {})",
                                             prefix_.string(), sequence, sequences()));
  const int64_t length = lengths_[sequence];
  if (offset < 0 || count < 0 || offset > length || count > length - offset)
    fail(Code::kInvalidArgument,
         fmt::format("{}: tokens [{}, {}) out of range of sequence {} (length {})",
                     prefix_.string(), offset, offset + count, sequence, length));
  if (count == 0) return;
  const unsigned char* src = bin_ + pointers_[sequence] + offset * indexed_dtype_size(dtype_);
  switch (dtype_) {
    case IndexedDType::kU8:
      return convert<uint8_t>(src, count, out);
    case IndexedDType::kI8:
      return convert<int8_t>(src, count, out);
    case IndexedDType::kI16:
      return convert<int16_t>(src, count, out);
    case IndexedDType::kU16:
      return convert<uint16_t>(src, count, out);
    case IndexedDType::kI32:
      std::memcpy(out, src, count * 4);
      return;
    case IndexedDType::kI64:
      for (int64_t i = 0; i < count; ++i) {
        int64_t v;
        std::memcpy(&v, src + i * 8, 8);
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
          fail(Code::kInvalidArgument, fmt::format("{}: sequence {} token {} is {}, outside int32",
                                                   prefix_.string(), sequence, offset + i, v));
        out[i] = static_cast<int32_t>(v);
      }
      return;
    case IndexedDType::kF32:
    case IndexedDType::kF64:
      break;  // refused on open
  }
  LOOM_CHECK(false, "dtype ", static_cast<int>(dtype_));
}

std::vector<int32_t> IndexedDataset::sequence(int64_t sequence) const {
  if (sequence < 0 || sequence >= sequences())
    fail(Code::kInvalidArgument, fmt::format("{}: sequence {} out of range [0, {})",
                                             prefix_.string(), sequence, sequences()));
  std::vector<int32_t> out(static_cast<size_t>(lengths_[sequence]));
  read(sequence, 0, lengths_[sequence], out.data());
  return out;
}

// ---------------------------------------------------------------------------------------
// Writer

IndexedDatasetWriter::IndexedDatasetWriter(const fs::path& prefix, IndexedDType dtype)
    : prefix_(prefix), dtype_(dtype) {
  if (!valid_code(static_cast<uint8_t>(dtype)) || is_float(dtype))
    fail(Code::kInvalidArgument,
         fmt::format("{}: token datasets need an integer dtype, not code {}", prefix.string(),
                     static_cast<int>(dtype)));
  const fs::path bin = with_suffix(prefix, ".bin");
  bin_tmp_ = temporary_path(bin);
  idx_tmp_ = temporary_path(with_suffix(prefix, ".idx"));
  fd_ = ::open(bin_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    int err = errno;
    fs::path dir = prefix.parent_path().empty() ? fs::path(".") : prefix.parent_path();
    throw IoError(fmt::format(
        "{}: cannot create ({}){}", bin.string(), std::strerror(err),
        err == ENOENT ? fmt::format("; does the directory {} exist?", dir.string()) : ""));
  }
  buffer_.reserve(kFlushBytes + 4096);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (finished_) return;
  if (fd_ >= 0) ::close(fd_);
  std::error_code ignored;
  fs::remove(bin_tmp_, ignored);
  fs::remove(idx_tmp_, ignored);
}

void IndexedDatasetWriter::flush() {
  write_all(fd_, buffer_.data(), buffer_.size(), bin_tmp_);
  buffer_.clear();
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  if (tokens.empty()) return add_document(tokens, {});
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail(Code::kInvalidArgument,
         fmt::format("{}: a document of {} tokens does not fit the index's int32 lengths",
                     prefix_.string(), tokens.size()));
  const int32_t length = static_cast<int32_t>(tokens.size());
  add_document(tokens, std::span<const int32_t>(&length, 1));
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens,
                                        std::span<const int32_t> sequence_lengths) {
  LOOM_CHECK(!finished_, "add_document after finish: ", prefix_.string());
  int64_t total = 0;
  for (int32_t length : sequence_lengths) {
    if (length < 0)
      fail(Code::kInvalidArgument, fmt::format("{}: document {} has a sequence of length {}",
                                               prefix_.string(), documents(), length));
    total += length;
  }
  if (total != static_cast<int64_t>(tokens.size()))
    fail(Code::kInvalidArgument,
         fmt::format("{}: document {} has {} tokens but sequence lengths summing to {}",
                     prefix_.string(), documents(), tokens.size(), total));
  const auto [lo, hi] = id_range(dtype_);
  if (lo > std::numeric_limits<int32_t>::min() || hi < std::numeric_limits<int32_t>::max()) {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < lo || tokens[i] > hi)
        fail(Code::kInvalidArgument,
             fmt::format("{}: token id {} (document {}, position {}) does not fit dtype {} "
                         "([{}, {}])",
                         prefix_.string(), tokens[i], documents(), i,
                         indexed_dtype_name(dtype_), lo, hi));
  }
  const size_t width = static_cast<size_t>(indexed_dtype_size(dtype_));
  const size_t at = buffer_.size();
  buffer_.resize(at + tokens.size() * width);
  unsigned char* dst = buffer_.data() + at;
  switch (dtype_) {
    case IndexedDType::kU8:
    case IndexedDType::kI8:
      for (int32_t t : tokens) *dst++ = static_cast<unsigned char>(t);
      break;
    case IndexedDType::kI16:
    case IndexedDType::kU16:
      for (int32_t t : tokens) {
        uint16_t v = static_cast<uint16_t>(t);
        std::memcpy(dst, &v, 2);
        dst += 2;
      }
      break;
    case IndexedDType::kI32:
      if (!tokens.empty()) std::memcpy(dst, tokens.data(), tokens.size() * 4);
      break;
    case IndexedDType::kI64:
      for (int32_t t : tokens) {
        int64_t v = t;
        std::memcpy(dst, &v, 8);
        dst += 8;
      }
      break;
    case IndexedDType::kF32:
    case IndexedDType::kF64:
      LOOM_CHECK(false, "float dtype in writer");
  }
  lengths_.insert(lengths_.end(), sequence_lengths.begin(), sequence_lengths.end());
  doc_index_.push_back(static_cast<int64_t>(lengths_.size()));
  tokens_ += static_cast<int64_t>(tokens.size());
  if (buffer_.size() >= kFlushBytes) flush();
}

void IndexedDatasetWriter::finish() {
  LOOM_CHECK(!finished_, "finish called twice: ", prefix_.string());
  flush();

  // The index, streamed through one buffer: header, lengths, pointers, document indices.
  const fs::path idx = with_suffix(prefix_, ".idx");
  const fs::path bin = with_suffix(prefix_, ".bin");
  int idx_fd = ::open(idx_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (idx_fd < 0)
    throw IoError(fmt::format("{}: cannot create ({})", idx.string(), std::strerror(errno)));
  try {
    const uint64_t sequences = lengths_.size();
    std::vector<unsigned char> out;
    out.reserve(kFlushBytes + 64);
    auto put = [&](const void* p, size_t n) {
      const auto* b = static_cast<const unsigned char*>(p);
      out.insert(out.end(), b, b + n);
      if (out.size() >= kFlushBytes) {
        write_all(idx_fd, out.data(), out.size(), idx_tmp_);
        out.clear();
      }
    };
    const uint64_t version = 1, doc_count = doc_index_.size();
    const uint8_t code = static_cast<uint8_t>(dtype_);
    put(kMagic, sizeof kMagic);
    put(&version, 8);
    put(&code, 1);
    put(&sequences, 8);
    put(&doc_count, 8);
    // lengths in chunks (a whole-array put would copy it into the buffer anyway)
    for (size_t i = 0; i < lengths_.size(); i += 65536)
      put(lengths_.data() + i, std::min<size_t>(65536, lengths_.size() - i) * 4);
    const int64_t width = indexed_dtype_size(dtype_);
    int64_t pointer = 0;
    for (int32_t length : lengths_) {
      put(&pointer, 8);
      pointer += int64_t{length} * width;
    }
    for (size_t i = 0; i < doc_index_.size(); i += 65536)
      put(doc_index_.data() + i, std::min<size_t>(65536, doc_index_.size() - i) * 8);
    write_all(idx_fd, out.data(), out.size(), idx_tmp_);
  } catch (...) {
    ::close(idx_fd);
    throw;  // the destructor removes both temporary files
  }

  int bin_fd = fd_;
  fd_ = -1;  // commit_file closes it, whatever happens
  try {
    commit_file(bin_fd, bin_tmp_, bin);
  } catch (...) {
    ::close(idx_fd);
    throw;
  }
  try {
    commit_file(idx_fd, idx_tmp_, idx);
  } catch (...) {
    // A .bin without its .idx is no dataset; leave neither behind.
    std::error_code ignored;
    fs::remove(bin, ignored);
    throw;
  }
  finished_ = true;
}

}  // namespace loom::core
