// Argument checks of embedding_fwd / embedding_bwd (loom/ops.h), shared by every kernel
// library so that all of them refuse a bad call with the same words. Each check throws
// loom::Error(kInvalidArgument) naming the op; `shapes_only` is true inside a kernel's
// `supports` (data may be null there), and `device` is the family of the calling kernel.
//
// Whether every id lies in the vocabulary depends on the ids' values, so each kernel
// library validates them itself (the CPU reads them, a GPU validates on the device);
// out_of_range_id_message gives all of them the same words for the kOutOfRange error.
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// What an embedding call works on.
struct EmbShape {
  int64_t v, c, n;  ///< table rows, row width, ids (rows of Y / dY)
  int64_t start;    ///< vocabulary row of table row 0 (0 without attrs)
  int64_t vocab;    ///< rows of the whole vocabulary (v without attrs)
  bool sharded;     ///< called with EmbeddingAttrs

  /// Table row of `id`, or -1 when another shard holds it.
  int64_t row(int32_t id) const {
    int64_t r = id - start;
    return r >= 0 && r < v ? r : -1;
  }
};

/// Both directions: the table (forward input 0) or its gradient (backward output 0, f32) is
/// (V, C); ids are i32 of any shape (N = their element count); Y / dY is (..., C) with N
/// rows; optional EmbeddingAttrs place the table inside a larger vocabulary.
inline EmbShape check_embedding(const OpCall* call, bool shapes_only, DeviceType device, bool bwd) {
  OpArgs a(call, bwd ? ops::kEmbeddingBwd : ops::kEmbeddingFwd, {bwd ? "dY" : "table", "ids"},
           {bwd ? "dtable" : "Y"}, shapes_only, device);
  const TensorView& ids = a.i32_in(1);
  const TensorView& table = bwd ? a.f32_out(0) : a.float_in(0);
  const TensorView& rows = bwd ? a.float_in(0) : a.float_out(0);
  if (table.ndim != 2)
    a.fail((bwd ? a.out_label(0) : a.in_label(0)) + " has shape " + view_shape_str(table) +
           ", expected (V, C)");
  EmbShape s{table.shape[0], table.shape[1], numel(ids), 0, table.shape[0], false};
  if (rows.ndim < 1 || last_dim(rows) != s.c || rows_of(rows) != s.n)
    a.fail((bwd ? a.in_label(0) : a.out_label(0)) + " has shape " + view_shape_str(rows) +
           ", expected (N, C) with N = " + std::to_string(s.n) +
           " (the ids) and C = " + std::to_string(s.c));
  if (const ops::EmbeddingAttrs* at = a.opt_attrs<ops::EmbeddingAttrs>()) {
    // Table rows at or beyond vocabulary row vocab_size are padding (a padded vocabulary):
    // ids are checked against vocab_size, so no id reaches them.
    if (at->vocab_start < 0 || at->vocab_size < 0)
      a.fail("attrs vocab_start = " + std::to_string(at->vocab_start) + ", vocab_size = " +
             std::to_string(at->vocab_size) + ": both must be >= 0");
    s.start = at->vocab_start;
    s.vocab = at->vocab_size;
    s.sharded = true;
  }
  return s;
}

inline EmbShape check_embedding_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  return check_embedding(call, shapes_only, device, false);
}

inline EmbShape check_embedding_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  return check_embedding(call, shapes_only, device, true);
}

/// The message of the kOutOfRange error for ids[index] = id outside [0, s.vocab), e.g.
/// "embedding_fwd: ids[1] = 5 is outside [0, 5) (the table's rows)".
inline std::string out_of_range_id_message(const char* op, int64_t index, int32_t id,
                                           const EmbShape& s) {
  return std::string(op) + ": ids[" + std::to_string(index) + "] = " + std::to_string(id) +
         " is outside [0, " + std::to_string(s.vocab) +
         (s.sharded ? ") (the vocabulary; this table holds its rows [" + std::to_string(s.start) +
                          ", " + std::to_string(s.start + s.v) + "))"
                    : ") (the table's rows)");
}

}  // namespace loom::op_checks
