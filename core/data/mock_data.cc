#include "core/data/mock_data.h"

#include <fmt/format.h>

#include <cmath>

#include "core/runtime/forward_context.h"

namespace loom::core {

void Batch::resize(int64_t b, int64_t t) {
  batch = b;
  seq_length = t;
  tokens.assign(static_cast<size_t>(b * t), 0);
  labels.assign(static_cast<size_t>(b * t), 0);
  loss_mask.assign(static_cast<size_t>(b * t), 1.f);
  position_ids.clear();
  segment_ids.clear();
}

MockData::MockData(int64_t vocab_size, int64_t batch, int64_t seq_length, uint64_t seed,
                   int32_t branching)
    : vocab_(vocab_size), batch_(batch), seq_(seq_length), seed_(seed), branching_(branching) {
  successors_.resize(static_cast<size_t>(vocab_ * branching_));
  uint64_t x = mix64(seed ^ 0x6d6f636bull);  // "mock"
  for (auto& s : successors_) {
    x = mix64(x);
    s = static_cast<int32_t>(x % static_cast<uint64_t>(vocab_));
  }
}

// Row `row` of the sample stream `stream`: T + 1 tokens of one walk.
void MockData::sample(uint64_t stream, int64_t row, Batch& out) const {
  uint64_t x = mix64(seed_ ^ mix64(stream));
  int32_t token = static_cast<int32_t>(x % static_cast<uint64_t>(vocab_));
  int32_t* tokens = out.tokens.data() + row * seq_;
  int32_t* labels = out.labels.data() + row * seq_;
  for (int64_t t = 0; t < seq_; ++t) {
    x = mix64(x);
    int32_t next = successors_[static_cast<size_t>(token) * branching_ +
                               static_cast<size_t>(x % static_cast<uint64_t>(branching_))];
    tokens[t] = token;
    labels[t] = next;
    token = next;
  }
}

void MockData::next_train(Batch& out) {
  out.resize(batch_, seq_);
  for (int64_t b = 0; b < batch_; ++b) sample(static_cast<uint64_t>(position_++), b, out);
}

bool MockData::valid_batch(int64_t index, Batch& out) {
  out.resize(batch_, seq_);
  for (int64_t b = 0; b < batch_; ++b)
    sample((1ull << 62) + static_cast<uint64_t>(index * batch_ + b), b, out);
  return true;
}

std::string MockData::describe() const {
  return fmt::format("mock: Markov-chain tokens, V={}, {} successors per token (loss floor {:.3f})",
                     vocab_, branching_, std::log(static_cast<double>(branching_)));
}

}  // namespace loom::core
