// Argument checks and shape helpers of attention_fwd / attention_bwd (loom/ops.h), shared by
// the kernel libraries so that the CPU and the CUDA kernels refuse a bad call with the same
// words (header-only; nothing here crosses the plugin boundary).
//
//   AttentionShape s = loom::op_checks::check_attention_fwd(call, shapes_only, DeviceType::kCuda);
#pragma once

#include <stdint.h>

#include <string>

#include "loom/cpp/op_args.h"
#include "loom/kernel.h"
#include "loom/ops.h"

namespace loom::op_checks {

/// Q, K, V, dQ, dK and dV of an attention call may be views with strided rows
/// (ops::kAttentionFwd), e.g. of one fused QKV projection; O, dO and lse are packed.
using loom::RowStrides;

/// The extents of one attention call and its attributes.
struct AttentionShape {
  int64_t b, t, s, h, g, d;  ///< batch, queries, keys, query heads, kv heads, head dim
  ops::AttentionAttrs attrs;
  /// Index of the key segment ids among the call's inputs, or -1 when the call has none
  /// (then keys take the query segment ids, T == S).
  int key_segments = -1;
  /// The block's place in the whole for the dropout index (AttentionBlockAttrs; the call
  /// itself, 0, 0, T, S, with AttentionAttrs).
  int64_t q_offset = 0, k_offset = 0, q_total = 0, k_total = 0;
  /// Row strides of Q, K, V (both passes) and of dQ, dK, dV (backward; zero in forward).
  RowStrides q, k, v, dq{}, dk{}, dv{};
};

/// The segment id rows of batch entry b: the queries' (B, T) and the keys' ((B, S) when the
/// call has key segment ids, else the queries'); both null without segment ids.
struct SegmentRows {
  const int32_t* q;
  const int32_t* k;
};
inline SegmentRows segment_rows(const AttentionShape& s, const int32_t* seg, const int32_t* key_seg,
                                int64_t b) {
  if (seg == nullptr) return {nullptr, nullptr};
  return {seg + b * s.t, key_seg != nullptr ? key_seg + b * s.s : seg + b * s.t};
}

namespace detail {

// Q, K, V (inputs q, k, v), the optional segment ids (input seg) and the attributes.
inline void check_attention_common(const OpCall* call, const OpArgs& a, AttentionShape& s, int q,
                                   int k, int v, int seg, int kseg) {
  const bool block = call->attrs != nullptr && call->attrs_size == sizeof(ops::AttentionBlockAttrs);
  if (block) {
    const auto& b = *static_cast<const ops::AttentionBlockAttrs*>(call->attrs);
    s.attrs = b.base;
    s.q_offset = b.q_offset, s.k_offset = b.k_offset, s.q_total = b.q_total, s.k_total = b.k_total;
  } else {
    s.attrs = a.attrs<ops::AttentionAttrs>();
  }
  const TensorView& Q = a.float_rows_in(q);
  const TensorView& K = a.float_rows_in(k);
  const TensorView& V = a.float_rows_in(v);
  if (Q.ndim != 4)
    a.fail(a.in_label(q) + " has shape " + view_shape_str(Q) + ", expected (B, T, H, D)");
  if (K.ndim != 4)
    a.fail(a.in_label(k) + " has shape " + view_shape_str(K) + ", expected (B, S, G, D)");
  s.b = Q.shape[0], s.t = Q.shape[1], s.h = Q.shape[2], s.d = Q.shape[3];
  s.s = K.shape[1], s.g = K.shape[2];
  a.shape_in(k, {s.b, s.s, s.g, s.d}, "(B, S, G, D) with Q's B and D");
  a.shape_in(v, {s.b, s.s, s.g, s.d}, "K's shape (B, S, G, D)");
  s.q = RowStrides::of(Q), s.k = RowStrides::of(K), s.v = RowStrides::of(V);
  if (s.g <= 0 || s.h % s.g != 0)
    a.fail("query heads H = " + std::to_string(s.h) +
           " must be a multiple of key/value heads G = " + std::to_string(s.g));
  const bool keys = kseg >= 0 && a.opt_i32_in(kseg) != nullptr;
  if (a.opt_i32_in(seg)) {
    a.shape_in(seg, {s.b, s.t}, "(B, T)");
    if (keys) {
      a.shape_in(kseg, {s.b, s.s}, "(B, S)");
      s.key_segments = kseg;
    } else if (s.t != s.s) {
      a.fail("segment ids need as many keys as queries (T = " + std::to_string(s.t) +
             ", S = " + std::to_string(s.s) + ") unless the keys' own ids come too (" +
             a.in_label(kseg >= 0 ? kseg : seg) + ")");
    }
  } else if (keys) {
    a.fail(a.in_label(kseg) + " are given without the queries' (" + a.in_label(seg) + ")");
  }
  if (!(s.attrs.dropout_p >= 0.0f && s.attrs.dropout_p < 1.0f))
    a.fail("dropout_p = " + std::to_string(s.attrs.dropout_p) + " must be in [0, 1)");
  if (!block) {
    s.q_total = s.t, s.k_total = s.s;
  } else if (s.q_offset < 0 || s.k_offset < 0 || s.q_offset + s.t > s.q_total ||
             s.k_offset + s.s > s.k_total) {
    a.fail("the block's queries [" + std::to_string(s.q_offset) + ", " +
           std::to_string(s.q_offset + s.t) + ") and keys [" + std::to_string(s.k_offset) + ", " +
           std::to_string(s.k_offset + s.s) + ") must lie within the whole's " +
           std::to_string(s.q_total) + " queries and " + std::to_string(s.k_total) +
           " keys (AttentionBlockAttrs)");
  }
}

}  // namespace detail

/// Checks an attention_fwd call for kernels running on `device`; throws loom::Error
/// (kInvalidArgument, message starting "attention_fwd: ") on a bad call.
/// \param call         the call
/// \param shapes_only  true inside `supports` (data pointers may be null)
/// \param device       the device family of the kernel; tensors elsewhere are refused
inline AttentionShape check_attention_fwd(const OpCall* call, bool shapes_only, DeviceType device) {
  const bool keys = call != nullptr && call->num_inputs == 5;  // key segment ids [4]
  OpArgs a(call, ops::kAttentionFwd,
           keys ? std::vector<std::string>{"Q", "K", "V", "segment_ids", "key_segment_ids"}
                : std::vector<std::string>{"Q", "K", "V", "segment_ids"},
           {"O", "lse"}, shapes_only, device);
  AttentionShape s{};
  detail::check_attention_common(call, a, s, 0, 1, 2, 3, keys ? 4 : -1);
  a.float_out(0);
  a.shape_out(0, {s.b, s.t, s.h, s.d}, "Q's shape (B, T, H, D)");
  a.f32_out(1);
  a.shape_out(1, {s.b, s.h, s.t}, "(B, H, T)");
  return s;
}

/// Checks an attention_bwd call, as check_attention_fwd does.
inline AttentionShape check_attention_bwd(const OpCall* call, bool shapes_only, DeviceType device) {
  const bool keys = call != nullptr && call->num_inputs == 8;  // key segment ids [7]
  std::vector<std::string> inputs{"dO", "Q", "K", "V", "O", "lse", "segment_ids"};
  if (keys) inputs.push_back("key_segment_ids");
  OpArgs a(call, ops::kAttentionBwd, inputs, {"dQ", "dK", "dV"}, shapes_only, device);
  AttentionShape s{};
  detail::check_attention_common(call, a, s, 1, 2, 3, 6, keys ? 7 : -1);
  a.float_in(0);
  a.shape_in(0, {s.b, s.t, s.h, s.d}, "Q's shape (B, T, H, D)");
  a.float_in(4);
  a.shape_in(4, {s.b, s.t, s.h, s.d}, "Q's shape (B, T, H, D)");
  a.f32_in(5);
  a.shape_in(5, {s.b, s.h, s.t}, "(B, H, T)");
  s.dq = RowStrides::of(a.float_rows_out(0));
  a.shape_out(0, {s.b, s.t, s.h, s.d}, "Q's shape (B, T, H, D)");
  s.dk = RowStrides::of(a.float_rows_out(1));
  a.shape_out(1, {s.b, s.s, s.g, s.d}, "K's shape (B, S, G, D)");
  s.dv = RowStrides::of(a.float_rows_out(2));
  a.shape_out(2, {s.b, s.s, s.g, s.d}, "V's shape (B, S, G, D)");
  return s;
}

/// The extents (B, T, H, D) of an attention_merge call.
struct AttentionMergeShape {
  int64_t b, t, h, d;
};

/// Checks an attention_merge call, as check_attention_fwd does.
inline AttentionMergeShape check_attention_merge(const OpCall* call, bool shapes_only,
                                                 DeviceType device) {
  OpArgs a(call, ops::kAttentionMerge, {"O_part", "lse_part"}, {"O", "lse"}, shapes_only, device);
  const TensorView& O = a.float_out(0);
  if (O.ndim != 4)
    a.fail(a.out_label(0) + " has shape " + view_shape_str(O) + ", expected (B, T, H, D)");
  AttentionMergeShape s{O.shape[0], O.shape[1], O.shape[2], O.shape[3]};
  a.float_in(0);
  a.shape_in(0, {s.b, s.t, s.h, s.d}, "O's shape (B, T, H, D)");
  a.f32_in(1);
  a.shape_in(1, {s.b, s.h, s.t}, "(B, H, T)");
  a.f32_out(1);
  a.shape_out(1, {s.b, s.h, s.t}, "(B, H, T)");
  return s;
}

/// Philox element index of probability (b, h, t, k) (loom/ops.h, attention_fwd): that of
/// a (B, H, T, S) tensor, or for a block (AttentionBlockAttrs) that of its place in the
/// (B, H, q_total, k_total) whole.
inline uint64_t attention_dropout_index(const AttentionShape& s, int64_t b, int64_t h, int64_t t,
                                        int64_t k) {
  return static_cast<uint64_t>(((b * s.h + h) * s.q_total + s.q_offset + t) * s.k_total +
                               s.k_offset + k);
}

/// Keys [0, limit) may be visible to query t (causal: k <= t + S - T); at most S, maybe <= 0.
inline int64_t attention_key_limit(const AttentionShape& s, int64_t t) {
  if (!s.attrs.causal) return s.s;
  int64_t limit = t + s.s - s.t + 1;
  return limit < s.s ? limit : s.s;
}

/// Visible (query, key) pairs under the causal mask, summed over batch and heads: the work
/// of one of the attention matmuls divided by D (segment ids are not counted: the cost
/// model looks at shapes only).
inline double attention_pairs(const AttentionShape& s) {
  double pairs = 0.0;
  for (int64_t t = 0; t < s.t; ++t) {
    int64_t limit = attention_key_limit(s, t);
    pairs += static_cast<double>(limit > 0 ? limit : 0);
  }
  return pairs * static_cast<double>(s.b * s.h);
}

}  // namespace loom::op_checks
