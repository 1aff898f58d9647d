// embedding_fwd: Y[n] = table[ids[n]]; embedding_bwd: dtable[ids[n]] += dY[n] (loom/ops.h).
// With EmbeddingAttrs the table is the rows [vocab_start, vocab_start + V) of a larger
// vocabulary (vocab-parallel): other ids give zero rows / add nothing.
//   reference: row by row.
//   fast: forward OpenMP over rows; backward OpenMP over column blocks, so that each
//         thread owns its columns of dtable and repeated ids need no atomics (and the
//         sum order, hence the result, is the reference's).
#include <algorithm>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

struct EmbShape {
  int64_t v, c, n;
  int64_t start;  // vocabulary row of table row 0 (0 without attrs)
  int64_t vocab;  // rows of the whole vocabulary (v without attrs)
  bool sharded;   // called with EmbeddingAttrs

  // Table row of `id`, or -1 when another shard holds it.
  int64_t row(int32_t id) const {
    int64_t r = id - start;
    return r >= 0 && r < v ? r : -1;
  }
};

// Ids may have any shape (N = their element count); Y / dY is (..., C) with N rows.
EmbShape check_embedding(const OpCall* call, bool shapes_only, bool bwd) {
  Args a(call, bwd ? ops::kEmbeddingBwd : ops::kEmbeddingFwd, {bwd ? "dY" : "table", "ids"},
         {bwd ? "dtable" : "Y"}, shapes_only);
  const TensorView& ids = a.i32_in(1);
  const TensorView& table = bwd ? a.f32_out(0) : a.float_in(0);
  const TensorView& rows = bwd ? a.float_in(0) : a.float_out(0);
  if (table.ndim != 2)
    a.fail((bwd ? a.out_label(0) : a.in_label(0)) + " has shape " + shape_str(table) +
           ", expected (V, C)");
  EmbShape s{table.shape[0], table.shape[1], numel(ids), 0, table.shape[0], false};
  if (rows.ndim < 1 || last_dim(rows) != s.c || rows_of(rows) != s.n)
    a.fail((bwd ? a.in_label(0) : a.out_label(0)) + " has shape " + shape_str(rows) +
           ", expected (N, C) with N = " + std::to_string(s.n) +
           " (the ids) and C = " + std::to_string(s.c));
  if (const ops::EmbeddingAttrs* at = a.opt_attrs<ops::EmbeddingAttrs>()) {
    if (at->vocab_start < 0 || at->vocab_size < 0 || at->vocab_start > at->vocab_size - s.v)
      a.fail("attrs vocab_start = " + std::to_string(at->vocab_start) + ", vocab_size = " +
             std::to_string(at->vocab_size) + " do not place the table's " + std::to_string(s.v) +
             " rows inside the vocabulary: need vocab_start >= 0 and vocab_start + V <= "
             "vocab_size");
    s.start = at->vocab_start;
    s.vocab = at->vocab_size;
    s.sharded = true;
  }
  return s;
}
EmbShape check_embedding_fwd(const OpCall* c, bool s) { return check_embedding(c, s, false); }
EmbShape check_embedding_bwd(const OpCall* c, bool s) { return check_embedding(c, s, true); }

// Every id must be a row of the vocabulary (the table's rows without attrs).
void check_ids(const OpCall* call, const EmbShape& s, const char* op) {
  const int32_t* ids = i32(call->inputs[1]);
  for (int64_t n = 0; n < s.n; ++n)
    if (ids[n] < 0 || ids[n] >= s.vocab)
      throw Error(
          Code::kOutOfRange,
          std::string(op) + ": ids[" + std::to_string(n) + "] = " + std::to_string(ids[n]) +
              " is outside [0, " + std::to_string(s.vocab) +
              (s.sharded ? ") (the vocabulary; this table holds its rows [" +
                               std::to_string(s.start) + ", " + std::to_string(s.start + s.v) + "))"
                         : ") (the table's rows)"));
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
