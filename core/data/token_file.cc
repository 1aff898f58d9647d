#include "core/data/token_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "core/runtime/forward_context.h"
#include "core/util/errors.h"

namespace loom::core {

TokenFile::TokenFile(const std::filesystem::path& path, const std::string& dtype,
                     int64_t vocab_size, int64_t batch, int64_t seq_length,
                     const std::string& split, uint64_t seed)
    : path_(path),
      width_(dtype == "i32" ? 4 : 2),
      vocab_(vocab_size),
      batch_(batch),
      seq_(seq_length),
      seed_(seed) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    throw IoError(
        fmt::format("data.token_file {}: cannot open ({}); fix the path in spec "
                    "/data/token_file",
                    path.string(), std::strerror(errno)));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ % width_ != 0) {
    ::close(fd);
    throw IoError(
        fmt::format("data.token_file {}: size {} is not a multiple of {} bytes; is "
                    "/data/token_dtype ({}) right?",
                    path.string(), size_, width_, dtype));
  }
  int64_t tokens = static_cast<int64_t>(size_ / width_);
  windows_ = tokens > 0 ? (tokens - 1) / seq_ : 0;
  if (windows_ < 1) {
    ::close(fd);
    throw IoError(
        fmt::format("data.token_file {}: {} tokens is fewer than one sample of "
                    "seq_length + 1 = {}",
                    path.string(), tokens, seq_ + 1));
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw IoError(fmt::format("data.token_file {}: mmap failed", path.string()));
  data_ = static_cast<const unsigned char*>(p);
  // Split weights: train, valid (test is not used by the trainer).
  std::vector<double> w;
  std::stringstream list(split);
  std::string item;
  while (std::getline(list, item, ',')) w.push_back(std::stod(item));
  while (w.size() < 3) w.push_back(0);
  double total = w[0] + w[1] + w[2];
  if (total <= 0) throw SpecError("/data/split", "weights sum to zero");
  train_windows_ = static_cast<int64_t>(windows_ * (w[0] / total));
  valid_windows_ = static_cast<int64_t>(windows_ * (w[1] / total));
  if (train_windows_ < 1) train_windows_ = 1;
  if (train_windows_ + valid_windows_ > windows_) valid_windows_ = windows_ - train_windows_;
}

TokenFile::~TokenFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

// Window of training sample `sample`: a seeded permutation per epoch (Feistel-free:
// an affine map with an odd multiplier coprime to the count, cheap and exact).
int64_t TokenFile::train_window(int64_t sample) const {
  int64_t n = train_windows_;
  int64_t epoch = sample / n, i = sample % n;
  uint64_t h = mix64(seed_ ^ mix64(static_cast<uint64_t>(epoch)));
  auto gcd = [](int64_t a, int64_t b) {
    while (b) {
      int64_t t = a % b;
      a = b;
      b = t;
    }
    return a;
  };
  int64_t a = static_cast<int64_t>(h % static_cast<uint64_t>(n)) | 1;
  while (gcd(a, n) != 1) a += 2;
  int64_t b = static_cast<int64_t>((h >> 32) % static_cast<uint64_t>(n));
  return static_cast<int64_t>((static_cast<__int128>(a) * i + b) % n);
}

void TokenFile::window(int64_t index, int64_t row, Batch& out) const {
  int64_t start = index * seq_;
  for (int64_t t = 0; t <= seq_; ++t) {
    int64_t id;
    if (width_ == 2) {
      uint16_t v;
      std::memcpy(&v, data_ + (start + t) * 2, 2);
      id = v;
    } else {
      int32_t v;
      std::memcpy(&v, data_ + (start + t) * 4, 4);
      id = v;
    }
    if (id < 0 || id >= vocab_)
      throw IoError(
          fmt::format("data.token_file {}: token {} at position {} is outside the "
                      "vocabulary [0, {}); wrong /data/token_dtype or model vocab_size?",
                      path_.string(), id, start + t, vocab_));
    if (t < seq_) out.tokens[row * seq_ + t] = static_cast<int32_t>(id);
    if (t > 0) out.labels[row * seq_ + t - 1] = static_cast<int32_t>(id);
  }
}

void TokenFile::next_train(Batch& out) {
  out.resize(batch_, seq_);
  for (int64_t b = 0; b < batch_; ++b) window(train_window(position_++), b, out);
}

bool TokenFile::valid_batch(int64_t index, Batch& out) {
  if (valid_windows_ == 0) return false;
  out.resize(batch_, seq_);
  for (int64_t b = 0; b < batch_; ++b)
    window(train_windows_ + (index * batch_ + b) % valid_windows_, b, out);
  return true;
}

std::string TokenFile::describe() const {
  return fmt::format("token file {}: {} windows of {} tokens ({} train, {} valid)", path_.string(),
                     windows_, seq_ + 1, train_windows_, valid_windows_);
}

}  // namespace loom::core
