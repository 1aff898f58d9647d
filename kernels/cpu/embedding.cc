// embedding_fwd: Y[n] = table[ids[n]]; embedding_bwd: dtable[ids[n]] += dY[n] (loom/ops.h).
// With EmbeddingAttrs the table is the rows [vocab_start, vocab_start + V) of a larger
// vocabulary (vocab-parallel): other ids give zero rows / add nothing.
//   reference: row by row.
//   fast: forward OpenMP over rows; backward OpenMP over column blocks, so that each
//         thread owns its columns of dtable and repeated ids need no atomics (and the
//         sum order, hence the result, is the reference's).
#include <loom/cpp/op_checks/embedding.h>

#include <algorithm>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::EmbShape;

EmbShape check_embedding_fwd(const OpCall* c, bool s) {
  return op_checks::check_embedding_fwd(c, s, DeviceType::kCpu);
}
EmbShape check_embedding_bwd(const OpCall* c, bool s) {
  return op_checks::check_embedding_bwd(c, s, DeviceType::kCpu);
}

// Every id must be a row of the vocabulary (the table's rows without attrs).
void check_ids(const OpCall* call, const EmbShape& s, const char* op) {
  const int32_t* ids = i32(call->inputs[1]);
  for (int64_t n = 0; n < s.n; ++n)
    if (ids[n] < 0 || ids[n] >= s.vocab)
      throw Error(Code::kOutOfRange, op_checks::out_of_range_id_message(op, n, ids[n], s));
}

Status embedding_fwd_ref(const OpCall* call) {
  return guard([&] {
    EmbShape s = check_embedding_fwd(call, false);
    check_ids(call, s, ops::kEmbeddingFwd);
    const int32_t* ids = i32(call->inputs[1]);
    for (int64_t n = 0; n < s.n; ++n) {
      int64_t r = s.row(ids[n]);
      for (int64_t c = 0; c < s.c; ++c)
        store(call->outputs[0], n * s.c + c, r < 0 ? 0.0f : load(call->inputs[0], r * s.c + c));
    }
  });
}

Status embedding_bwd_ref(const OpCall* call) {
  return guard([&] {
    EmbShape s = check_embedding_bwd(call, false);
    check_ids(call, s, ops::kEmbeddingBwd);
    const int32_t* ids = i32(call->inputs[1]);
    float* dtable = f32_mut(call->outputs[0]);
    for (int64_t n = 0; n < s.n; ++n) {
      int64_t r = s.row(ids[n]);
      if (r < 0) continue;
      for (int64_t c = 0; c < s.c; ++c) dtable[r * s.c + c] += load(call->inputs[0], n * s.c + c);
    }
  });
}

LOOM_CPU_FAST_BEGIN

Status embedding_fwd_fast(const OpCall* call) {
  return guard([&] {
    EmbShape s = check_embedding_fwd(call, false);
    check_ids(call, s, ops::kEmbeddingFwd);
    const int32_t* ids = i32(call->inputs[1]);
    const TensorView &T = call->inputs[0], &Y = call->outputs[0];
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(s.c));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < s.n; ++n) {
        int64_t r = s.row(ids[n]);
        if (r < 0)
          std::fill(row.begin(), row.end(), 0.0f);
        else
          load_row(T.data, T.dtype, r * s.c, s.c, row.data());
        store_row(Y.data, Y.dtype, n * s.c, s.c, row.data());
      }
    }
  });
}

Status embedding_bwd_fast(const OpCall* call) {
  return guard([&] {
    EmbShape s = check_embedding_bwd(call, false);
    check_ids(call, s, ops::kEmbeddingBwd);
    const int32_t* ids = i32(call->inputs[1]);
    const TensorView& dY = call->inputs[0];
    float* dtable = f32_mut(call->outputs[0]);
    constexpr int64_t kCols = 256;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < s.c; c0 += kCols) {
      float row[kCols];
      int64_t len = std::min(kCols, s.c - c0);
      for (int64_t n = 0; n < s.n; ++n) {
        int64_t r = s.row(ids[n]);
        if (r < 0) continue;
        load_row(dY.data, dY.dtype, n * s.c + c0, len, row);
        simd::axpy(1.0f, row, dtable + r * s.c + c0, len);
      }
    }
  });
}

LOOM_CPU_FAST_END

LOOM_CPU_HOOKS(embedding_fwd, check_embedding_fwd, 0)
LOOM_CPU_HOOKS(embedding_bwd, check_embedding_bwd, 1)

}  // namespace

void add_embedding_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kEmbeddingFwd, embedding_fwd);
  LOOM_CPU_REGISTER(out, ops::kEmbeddingBwd, embedding_bwd);
}

}  // namespace loom::kernels::cpu
