// Argument checks of the cross-entropy ops of loom/ops.h (cross_entropy_fwd / _bwd and the
// vocab-parallel cross_entropy_shard_stats / cross_entropy_combine), shared by every kernel
// library so that the CPU and CUDA kernels reject a bad call with the same words
// (header-only; see loom/cpp/op_args.h). Every one of these ops takes labels at input 1 and
// the optional mask at input 2.
//
// These checks look at shapes, dtypes and attributes only. Labels outside the vocabulary
// are a data error that each kernel library detects where the labels live (the CPU kernels
// before computing, the CUDA kernels on the device).
//   call:         the call
//   shapes_only:  true inside `supports` (data may be null)
//   device:       the device family of the kernel
#pragma once

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// The rows and vocabulary columns of a cross-entropy call.
struct CeShape {
  int64_t n, v;       ///< rows, columns of these logits (the row stride)
  int64_t start = 0;  ///< vocabulary column of logits column 0 (0 without shard attrs)
  int64_t vocab = 0;  ///< columns of the whole vocabulary (v without shard attrs)
  int64_t valid = 0;  ///< columns [0, valid) of these logits are vocabulary, the rest padding:
                      ///< clamp(vocab - start, 0, v)

  /// Column of `label` in these logits, or -1 when another shard (or no shard) holds it.
  int64_t column(int32_t label) const {
    int64_t j = label - start;
    return j >= 0 && j < valid ? j : -1;
  }
};

/// logits float (N, V) at input 0, labels i32 (N) at 1, mask f32 (N) or empty at 2.
inline CeShape check_ce_inputs(const OpArgs& a) {
  const TensorView& logits = a.float_in(0);
  a.rank_in(0, 1, "(N, V)");
  CeShape s{rows_of(logits), last_dim(logits)};
  s.vocab = s.valid = s.v;
  a.i32_in(1);
  a.numel_in(1, s.n, "(N)");
  if (a.opt_f32_in(2)) a.numel_in(2, s.n, "(N)");
  return s;
}

/// Takes the shard's place in the vocabulary from `at` (null: the logits are the whole
/// vocabulary, no padding), checking that vocab_start >= 0 and vocab_size >= 0. Columns at
/// or beyond vocabulary column vocab_size are padding (a padded vocabulary: CeShape::valid).
inline void apply_shard_attrs(const OpArgs& a, const ops::CrossEntropyShardAttrs* at, CeShape* s) {
  if (at == nullptr) return;
  if (at->vocab_start < 0 || at->vocab_size < 0)
    a.fail("attrs vocab_start = " + std::to_string(at->vocab_start) +
           ", vocab_size = " + std::to_string(at->vocab_size) + ": both must be >= 0");
  s->start = at->vocab_start;
  s->vocab = at->vocab_size;
  // vocab - start < v rather than start + v > vocab: no overflow.
  s->valid = at->vocab_size - at->vocab_start >= s->v ? s->v
             : at->vocab_size > at->vocab_start       ? at->vocab_size - at->vocab_start
                                                      : 0;
}

/// Outputs [0..2] loss f32 (N), lse f32 (N), mean f32 (1): the forward's, the one pass's and
/// the combine's.
inline void check_loss_outputs(const OpArgs& a, int64_t n) {
  a.f32_out(0);
  a.numel_out(0, n, "(N)");
  a.f32_out(1);
  a.numel_out(1, n, "(N)");
  a.f32_out(2);
  a.shape_out(2, {1}, "(1)");
}

/// The optional CrossEntropyShardAttrs of an op over the whole vocabulary, padded or not
/// (vocab_start 0, 1 <= vocab_size <= V), applied to `s`; `shards` tells where a shard goes.
inline void apply_whole_vocab_attrs(const OpArgs& a, CeShape* s, const char* shards) {
  const auto* at = a.opt_attrs<ops::CrossEntropyShardAttrs>();
  if (at != nullptr && (at->vocab_start != 0 || at->vocab_size < 1 || at->vocab_size > s->v))
    a.fail("attrs vocab_start = " + std::to_string(at->vocab_start) + ", vocab_size = " +
           std::to_string(at->vocab_size) + ": the op takes the whole vocabulary, padded or not " +
           "(vocab_start 0, 1 <= vocab_size <= V = " + std::to_string(s->v) + ")" + shards);
  apply_shard_attrs(a, at, s);
}

/// cross_entropy_fwd: logits, labels, mask -> loss f32 (N), lse f32 (N), mean f32 (1);
/// optional CrossEntropyShardAttrs with vocab_start 0 and 1 <= vocab_size <= V: columns
/// [vocab_size, V) are padding.
inline CeShape check_cross_entropy_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kCrossEntropyFwd, {"logits", "labels", "mask"}, {"loss", "lse", "mean"},
           shapes_only, device);
  CeShape s = check_ce_inputs(a);
  check_loss_outputs(a, s.n);
  apply_whole_vocab_attrs(a, &s, "; a shard of it goes through cross_entropy_shard_stats");
  return s;
}

/// cross_entropy_fwd_bwd: logits, labels, mask, dmean f32 (1) -> loss f32 (N), lse f32 (N),
/// mean f32 (1), dlogits float (N, V) (may be the logits themselves, else apart from every
/// input); attrs as cross_entropy_fwd's.
inline CeShape check_cross_entropy_fwd_bwd(const OpCall* call, bool shapes_only,
                                           DeviceType device) {
  OpArgs a(call, ops::kCrossEntropyFwdBwd, {"logits", "labels", "mask", "dmean"},
           {"loss", "lse", "mean", "dlogits"}, shapes_only, device);
  CeShape s = check_ce_inputs(a);
  a.f32_in(3);
  a.shape_in(3, {1}, "(1)");
  check_loss_outputs(a, s.n);
  a.float_out(3);
  a.numel_out(3, s.n * s.v, "logits' shape (N, V)");
  if (!shapes_only) {
    const TensorView &x = call->inputs[0], &dx = call->outputs[3];
    const auto* lo = static_cast<const char*>(x.data);
    const auto* dlo = static_cast<const char*>(dx.data);
    const auto* hi = lo + s.n * s.v * static_cast<int64_t>(dtype_size(x.dtype));
    const auto* dhi = dlo + s.n * s.v * static_cast<int64_t>(dtype_size(dx.dtype));
    const bool in_place = lo == dlo && x.dtype == dx.dtype;
    if (!in_place && lo < dhi && dlo < hi)
      a.fail(
          "outputs[3] (dlogits) overlaps inputs[0] (logits) without being them: pass the "
          "logits' own view to compute in place, or a buffer apart from them");
  }
  apply_whole_vocab_attrs(a, &s, "");
  return s;
}

/// cross_entropy_bwd: logits, labels, mask, lse f32 (N), dmean f32 (1) -> dlogits float
/// (N, V); optional CrossEntropyShardAttrs: these logits are columns [start, start + V) of
/// the vocabulary.
inline CeShape check_cross_entropy_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kCrossEntropyBwd, {"logits", "labels", "mask", "lse", "dmean"}, {"dlogits"},
           shapes_only, device);
  CeShape s = check_ce_inputs(a);
  a.f32_in(3);
  a.numel_in(3, s.n, "(N)");
  a.f32_in(4);
  a.shape_in(4, {1}, "(1)");
  a.float_out(0);
  a.numel_out(0, s.n * s.v, "logits' shape (N, V)");
  apply_shard_attrs(a, a.opt_attrs<ops::CrossEntropyShardAttrs>(), &s);
  return s;
}

/// cross_entropy_shard_stats: logits (N, V) of columns [start, start + V), labels (N),
/// mask (N) -> stats f32 (N, 3); CrossEntropyShardAttrs required.
inline CeShape check_cross_entropy_shard_stats(const OpCall* call, bool shapes_only,
                                               DeviceType device) {
  OpArgs a(call, ops::kCrossEntropyShardStats, {"logits", "labels", "mask"}, {"stats"}, shapes_only,
           device);
  CeShape s = check_ce_inputs(a);
  a.f32_out(0);
  a.numel_out(0, s.n * 3, "(N, 3)");
  apply_shard_attrs(a, &a.attrs<ops::CrossEntropyShardAttrs>(), &s);
  return s;
}

/// The shards, rows and vocabulary of a cross_entropy_combine call.
struct CombineShape {
  int64_t p, n, vocab;
};

/// cross_entropy_combine: stats f32 (P, N, 3), labels (N), mask (N) -> loss (N), lse (N),
/// mean (1); CrossEntropyShardAttrs required (vocab_size is used).
inline CombineShape check_cross_entropy_combine(const OpCall* call, bool shapes_only,
                                                DeviceType device) {
  OpArgs a(call, ops::kCrossEntropyCombine, {"stats", "labels", "mask"}, {"loss", "lse", "mean"},
           shapes_only, device);
  const TensorView& stats = a.f32_in(0);
  int64_t n = numel(a.i32_in(1));
  if (a.opt_f32_in(2)) a.numel_in(2, n, "(N)");
  int64_t p = stats.ndim >= 2 ? stats.shape[0] : 0;
  if (stats.ndim < 2 || p < 1 || last_dim(stats) != 3 || numel(stats) != p * n * 3)
    a.fail(a.in_label(0) + " has shape " + view_shape_str(stats) +
           ", expected (P, N, 3) with P >= 1 shards and N = " + std::to_string(n) +
           " (the labels)");
  check_loss_outputs(a, n);
  const auto& at = a.attrs<ops::CrossEntropyShardAttrs>();
  if (at.vocab_size < 0)
    a.fail("attrs vocab_size = " + std::to_string(at.vocab_size) + " is negative");
  return {p, n, at.vocab_size};
}

/// The message of a label outside [0, vocab) whose mask is not 0 (Code::kOutOfRange), the
/// same from every kernel library.
inline std::string label_out_of_range_message(const char* op, int64_t row, int64_t label,
                                              int64_t vocab) {
  return std::string(op) + ": labels[" + std::to_string(row) + "] = " + std::to_string(label) +
         " is outside [0, " + std::to_string(vocab) +
         ") (the vocabulary); fix the data or set its mask to 0";
}

/// masked_sum: x f32 (N), mask f32 (N) or empty -> out f32 (2); returns N.
inline int64_t check_masked_sum(const OpCall* call, bool shapes_only, DeviceType device) {
  OpArgs a(call, ops::kMaskedSum, {"x", "mask"}, {"out"}, shapes_only, device);
  int64_t n = numel(a.f32_in(0));
  if (a.opt_f32_in(1)) a.numel_in(1, n, "(N)");
  a.f32_out(0);
  a.shape_out(0, {2}, "(2)");
  return n;
}

}  // namespace loom::op_checks
