// TokenFile: a flat file of token ids (little-endian uint16 or int32, as written by
// `numpy.ndarray.tofile` or llm.c's data scripts), cut into non-overlapping windows of
// T + 1 tokens. The first share of windows (data.split) trains, the next validates;
// training windows are visited in a seeded random order, epoch after epoch. The indexed
// datasets of the data issue replace this for real corpora.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/data/data_source.h"

namespace loom::core {

class TokenFile final : public DataSource {
 public:
  /// \param path        the file
  /// \param dtype       "u16" or "i32"
  /// \param vocab_size  ids must be below it (checked while reading)
  /// \param batch, seq_length  B, T
  /// \param split       weights "train,valid[,test]" (Megatron's data.split)
  /// \param seed        shuffle seed
  TokenFile(const std::filesystem::path& path, const std::string& dtype, int64_t vocab_size,
            int64_t batch, int64_t seq_length, const std::string& split, uint64_t seed);
  ~TokenFile() override;

  void next_train(Batch& out) override;
  bool valid_batch(int64_t index, Batch& out) override;
  int64_t position() const override { return position_; }
  void seek(int64_t position) override { position_ = position; }
  std::string describe() const override;

 private:
  void window(int64_t index, int64_t row, Batch& out) const;
  int64_t train_window(int64_t sample) const;
  std::filesystem::path path_;
  int64_t width_;  // bytes per token
  int64_t vocab_, batch_, seq_;
  uint64_t seed_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  int64_t windows_ = 0, train_windows_ = 0, valid_windows_ = 0;
  int64_t position_ = 0;
};

}  // namespace loom::core
