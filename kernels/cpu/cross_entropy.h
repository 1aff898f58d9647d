// Shapes and checks shared by cross_entropy_fwd / cross_entropy_bwd (cross_entropy.cc) and
// the vocab-parallel cross_entropy_shard_stats / cross_entropy_combine
// (cross_entropy_shard.cc). Every one of these ops takes labels at input 1 and the optional
// mask at input 2; fwd and combine write loss, lse and mean at outputs 0, 1, 2.
#pragma once

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {

struct CeShape {
  int64_t n, v;       // rows, columns of these logits
  int64_t start = 0;  // vocabulary column of logits column 0 (0 without shard attrs)
  int64_t vocab = 0;  // columns of the whole vocabulary (v without shard attrs)

  // Column of `label` in these logits, or -1 when another shard (or no shard) holds it.
  int64_t column(int32_t label) const {
    int64_t j = label - start;
    return j >= 0 && j < v ? j : -1;
  }
};

// logits float (N, V) at input 0, labels i32 (N) at 1, mask f32 (N) or empty at 2.
CeShape check_ce_inputs(const Args& a);

// Takes the shard's place in the vocabulary from `at` (null: the logits are the whole
// vocabulary), checking that vocab_start >= 0 and vocab_start + V <= vocab_size.
void apply_shard_attrs(const Args& a, const ops::CrossEntropyShardAttrs* at, CeShape* s);

inline float ce_mask_at(const OpCall* call, int64_t n) {
  const TensorView& m = call->inputs[2];
  return m.data != nullptr ? f32(m)[n] : 1.0f;
}

// Labels outside [0, vocab) are an error (kOutOfRange) unless masked out; returns
// sum(mask) in f64.
double ce_check_labels(const OpCall* call, int64_t n, int64_t vocab, const char* op);

// mean = sum mask * loss / sum mask (0 when the mask is all zero): loss at output 0, mean at
// output 2.
void ce_write_mean(const OpCall* call, int64_t n, double mask_total);

}  // namespace loom::kernels::cpu
