// Helpers shared by cross_entropy_fwd / cross_entropy_bwd (cross_entropy.cc) and the
// vocab-parallel cross_entropy_shard_stats / cross_entropy_combine (cross_entropy_shard.cc):
// the data-dependent parts, which read host memory (mask, label range, masked mean). Every
// one of these ops takes labels at input 1 and the optional mask at input 2; fwd and
// combine write loss, lse and mean at outputs 0, 1, 2.
#pragma once

#include <loom/cpp/op_checks/cross_entropy.h>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {

// Shapes and checks: loom/cpp/op_checks/cross_entropy.h, shared with the CUDA kernels.
using op_checks::CeShape;

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
