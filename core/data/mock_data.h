// MockData: synthetic tokens for benchmarks and smoke tests, the counterpart of
// Megatron's --mock-data. Sequences are walks of a fixed random first-order Markov chain
// over the vocabulary, in which every token has `branching` equally likely successors,
// so a model can learn them: the loss falls from ln(V) towards ln(branching). Sample i is
// a pure function of (seed, i), so streams are reproducible and seekable.
#pragma once

#include <cstdint>
#include <vector>

#include "core/data/data_source.h"

namespace loom::core {

class MockData final : public DataSource {
 public:
  /// \param vocab_size  V, the model's vocabulary
  /// \param batch       B,  \param seq_length  T
  /// \param seed        chain and sample seed
  /// \param branching   successors per token (entropy floor ln(branching))
  MockData(int64_t vocab_size, int64_t batch, int64_t seq_length, uint64_t seed,
           int32_t branching = 4);

  void next_train(Batch& out) override;
  bool valid_batch(int64_t index, Batch& out) override;
  int64_t position() const override { return position_; }
  void seek(int64_t position) override { position_ = position; }
  std::string describe() const override;

 private:
  void sample(uint64_t stream, int64_t row, Batch& out) const;
  int64_t vocab_, batch_, seq_;
  uint64_t seed_;
  int32_t branching_;
  std::vector<int32_t> successors_;  // (V, branching)
  int64_t position_ = 0;
};

}  // namespace loom::core
