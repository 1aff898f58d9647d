// DataSource: where the trainer gets its micro-batches. The trainer reads data only
// through this interface; the sources here (synthetic tokens, a flat token file) and the
// indexed datasets of the data issue implement it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::core {

/// One micro-batch on the host: B sequences of T tokens.
struct Batch {
  int64_t batch = 0;                  ///< B
  int64_t seq_length = 0;             ///< T
  std::vector<int32_t> tokens;        ///< (B, T)
  std::vector<int32_t> labels;        ///< (B, T): the next token
  std::vector<float> loss_mask;       ///< (B, T): 1 where the loss counts
  std::vector<int32_t> position_ids;  ///< (B, T), or empty for 0..T-1
  std::vector<int32_t> segment_ids;   ///< (B, T) document of each token, or empty: attention
                                      ///< stays within a segment (reset_attention_mask)

  /// Sizes the buffers for (B, T).
  void resize(int64_t b, int64_t t);
};

class DataSource {
 public:
  virtual ~DataSource() = default;
  /// Fills `out` with the next micro-batch of the training stream.
  virtual void next_train(Batch& out) = 0;
  /// Fills `out` with validation micro-batch `index` (a fixed set, the same every time it
  /// is evaluated). Returns false when this source has no validation split.
  virtual bool valid_batch(int64_t index, Batch& out) = 0;
  /// Index of the next training sample (for exact resume).
  virtual int64_t position() const = 0;
  /// Continues the training stream at sample `position`.
  virtual void seek(int64_t position) = 0;
  /// One line for the start-up banner ("mock: Markov tokens, V=4096").
  virtual std::string describe() const = 0;
};

}  // namespace loom::core
