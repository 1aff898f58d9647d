// attention_fwd / attention_bwd, reference (loom/ops.h): per (batch, head) the score matrix
// (T, S) is materialised, softmax-ed with the mask, dropped out with the Philox mask of a
// (B, H, T, S) tensor, and multiplied by V. Backward recomputes P from the saved lse.
// Query head h reads key/value head h / (H / G) (GQA). f64 accumulation throughout.
// A fully masked query row gives O = 0 and lse = -inf; backward gives it zero gradients.
#include "kernels/cpu/attention.h"

#include "kernels/cpu/philox.h"

namespace loom::kernels::cpu {

namespace {

void check_common(const Args& a, AttentionShape& s, int q, int k, int v, int seg) {
  s.attrs = a.attrs<ops::AttentionAttrs>();
  const TensorView& Q = a.float_in(q);
  const TensorView& K = a.float_in(k);
  a.float_in(v);
  if (Q.ndim != 4) a.fail(a.in_label(q) + " has shape " + shape_str(Q) + ", expected (B, T, H, D)");
  if (K.ndim != 4) a.fail(a.in_label(k) + " has shape " + shape_str(K) + ", expected (B, S, G, D)");
  s.b = Q.shape[0], s.t = Q.shape[1], s.h = Q.shape[2], s.d = Q.shape[3];
  s.s = K.shape[1], s.g = K.shape[2];
  a.shape_in(k, {s.b, s.s, s.g, s.d}, "(B, S, G, D) with Q's B and D");
  a.shape_in(v, {s.b, s.s, s.g, s.d}, "K's shape (B, S, G, D)");
  if (s.g <= 0 || s.h % s.g != 0)
    a.fail("query heads H = " + std::to_string(s.h) +
           " must be a multiple of key/value heads G = " + std::to_string(s.g));
  if (a.opt_i32_in(seg)) {
    a.shape_in(seg, {s.b, s.t}, "(B, T)");
    if (s.t != s.s)
      a.fail("segment ids need as many keys as queries (T = " + std::to_string(s.t) +
             ", S = " + std::to_string(s.s) + ")");
  }
  if (!(s.attrs.dropout_p >= 0.0f && s.attrs.dropout_p < 1.0f))
    a.fail("dropout_p = " + std::to_string(s.attrs.dropout_p) + " must be in [0, 1)");
}

// Visible (query, key) pairs summed over batch and heads: the work of one matmul / D.
double attention_pairs(const AttentionShape& s) {
  double pairs = 0.0;
  for (int64_t t = 0; t < s.t; ++t)
    pairs += static_cast<double>(std::max<int64_t>(0, attention_key_limit(s, t)));
  return pairs * static_cast<double>(s.b * s.h);
}

}  // namespace

AttentionShape check_attention_fwd(const OpCall* call, bool shapes_only) {
  Args a(call, ops::kAttentionFwd, {"Q", "K", "V", "segment_ids"}, {"O", "lse"}, shapes_only);
  AttentionShape s{};
  check_common(a, s, 0, 1, 2, 3);
  a.float_out(0);
  a.shape_out(0, {s.b, s.t, s.h, s.d}, "Q's shape (B, T, H, D)");
  a.f32_out(1);
  a.shape_out(1, {s.b, s.h, s.t}, "(B, H, T)");
  return s;
}

AttentionShape check_attention_bwd(const OpCall* call, bool shapes_only) {
  Args a(call, ops::kAttentionBwd, {"dO", "Q", "K", "V", "O", "lse", "segment_ids"},
         {"dQ", "dK", "dV"}, shapes_only);
  AttentionShape s{};
  check_common(a, s, 1, 2, 3, 6);
  a.float_in(0);
  a.shape_in(0, {s.b, s.t, s.h, s.d}, "Q's shape (B, T, H, D)");
  a.float_in(4);
  a.shape_in(4, {s.b, s.t, s.h, s.d}, "Q's shape (B, T, H, D)");
  a.f32_in(5);
  a.shape_in(5, {s.b, s.h, s.t}, "(B, H, T)");
  a.float_out(0);
  a.shape_out(0, {s.b, s.t, s.h, s.d}, "Q's shape (B, T, H, D)");
  a.float_out(1);
  a.shape_out(1, {s.b, s.s, s.g, s.d}, "K's shape (B, S, G, D)");
  a.float_out(2);
  a.shape_out(2, {s.b, s.s, s.g, s.d}, "V's shape (B, S, G, D)");
  return s;
}

bool attention_fwd_supports(const OpCall* call) {
  return passes([&] { check_attention_fwd(call, true); });
}
bool attention_bwd_supports(const OpCall* call) {
  return passes([&] { check_attention_bwd(call, true); });
}

// Forward: Q K^T and P V, 2 flops per multiply-add; backward: dV, dP, dQ, dK (recompute of
// Q K^T is not model work, so MFU leaves it out).
Status attention_fwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    AttentionShape s = check_attention_fwd(call, true);
    *out = io_cost(call, 4.0 * attention_pairs(s) * static_cast<double>(s.d));
  });
}
Status attention_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    AttentionShape s = check_attention_bwd(call, true);
    *out = io_cost(call, 8.0 * attention_pairs(s) * static_cast<double>(s.d));
  });
}

namespace {

// Offsets of row (b, t, head) in (B, T, H, D) and of (b, s, g) in (B, S, G, D).
int64_t q_off(const AttentionShape& s, int64_t b, int64_t t, int64_t h) {
  return ((b * s.t + t) * s.h + h) * s.d;
}
int64_t kv_off(const AttentionShape& s, int64_t b, int64_t k, int64_t g) {
  return ((b * s.s + k) * s.g + g) * s.d;
}

// Fills P (T, S) with softmax probabilities of (b, h) (zeros where masked), from lse when
// `lse` is given, else computing it into lse_out (T).
void probabilities(const OpCall* call, const AttentionShape& s, int64_t b, int64_t h,
                   const TensorView& Q, const TensorView& K, const TensorView& seg,
                   std::vector<double>& P, const float* lse, float* lse_out) {
  int64_t g = h / (s.h / s.g);
  const int32_t* seg_row = seg.data != nullptr ? i32(seg) + b * s.t : nullptr;
  for (int64_t t = 0; t < s.t; ++t) {
    double* row = &P[t * s.s];
    double m = -INFINITY;
    for (int64_t k = 0; k < s.s; ++k) {
      if (attention_masked(s.attrs.causal, t, k, s.t, s.s, seg_row)) {
        row[k] = -INFINITY;
        continue;
      }
      double dot = 0.0;
      for (int64_t i = 0; i < s.d; ++i)
        dot +=
            static_cast<double>(load(Q, q_off(s, b, t, h) + i)) * load(K, kv_off(s, b, k, g) + i);
      row[k] = s.attrs.scale * dot;
      m = std::max(m, row[k]);
    }
    double row_lse;
    if (lse != nullptr) {
      row_lse = lse[(b * s.h + h) * s.t + t];
    } else if (m == -INFINITY) {
      row_lse = -INFINITY;
    } else {
      double sum = 0.0;
      for (int64_t k = 0; k < s.s; ++k) sum += std::exp(row[k] - m);
      row_lse = m + std::log(sum);
    }
    if (lse_out != nullptr) lse_out[(b * s.h + h) * s.t + t] = static_cast<float>(row_lse);
    for (int64_t k = 0; k < s.s; ++k)
      row[k] = (row_lse == -INFINITY || row[k] == -INFINITY) ? 0.0 : std::exp(row[k] - row_lse);
  }
}

// keep(t, s) / (1 - p) of (b, h) into Keep (T, S); all ones without dropout.
void dropout_scale(const AttentionShape& s, int64_t b, int64_t h, std::vector<double>& keep) {
  const ops::AttentionAttrs& at = s.attrs;
  uint32_t threshold = keep_threshold(at.dropout_p);
  double inv = 1.0 / (1.0 - static_cast<double>(at.dropout_p));
  for (int64_t t = 0; t < s.t; ++t)
    for (int64_t k = 0; k < s.s; ++k)
      keep[t * s.s + k] =
          at.dropout_p == 0.0f
              ? 1.0
              : (philox_keep(at.key, at.counter, attention_dropout_index(s, b, h, t, k), threshold)
                     ? inv
                     : 0.0);
}

Status attention_fwd_ref(const OpCall* call) {
  return guard([&] {
    AttentionShape s = check_attention_fwd(call, false);
    const TensorView &Q = call->inputs[0], &K = call->inputs[1], &V = call->inputs[2];
    const TensorView& O = call->outputs[0];
    std::vector<double> P(static_cast<size_t>(s.t * s.s)), keep(P.size());  // (T, S)
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        int64_t g = h / (s.h / s.g);
        probabilities(call, s, b, h, Q, K, call->inputs[3], P, nullptr, f32_mut(call->outputs[1]));
        dropout_scale(s, b, h, keep);
        for (int64_t t = 0; t < s.t; ++t)
          for (int64_t i = 0; i < s.d; ++i) {
            double acc = 0.0;
            for (int64_t k = 0; k < s.s; ++k)
              if (P[t * s.s + k] != 0.0)
                acc += P[t * s.s + k] * keep[t * s.s + k] * load(V, kv_off(s, b, k, g) + i);
            store(O, q_off(s, b, t, h) + i, static_cast<float>(acc));
          }
      }
  });
}

Status attention_bwd_ref(const OpCall* call) {
  return guard([&] {
    AttentionShape s = check_attention_bwd(call, false);
    const TensorView &dO = call->inputs[0], &Q = call->inputs[1], &K = call->inputs[2];
    const TensorView& V = call->inputs[3];
    const float* lse = f32(call->inputs[5]);
    std::vector<double> P(static_cast<size_t>(s.t * s.s)), keep(P.size()), dS(P.size());
    std::vector<double> dq(static_cast<size_t>(s.b * s.t * s.h * s.d));  // (B, T, H, D)
    std::vector<double> dk(static_cast<size_t>(s.b * s.s * s.g * s.d));  // (B, S, G, D)
    std::vector<double> dv(dk.size());                                   // (B, S, G, D)
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        int64_t g = h / (s.h / s.g);
        probabilities(call, s, b, h, Q, K, call->inputs[6], P, lse, nullptr);
        dropout_scale(s, b, h, keep);
        for (int64_t t = 0; t < s.t; ++t) {
          // dP = (dO V^T) * keep / (1 - p); dS = P * (dP - sum(P * dP))
          double row_dot = 0.0;
          for (int64_t k = 0; k < s.s; ++k) {
            double dp = 0.0;
            for (int64_t i = 0; i < s.d; ++i)
              dp += static_cast<double>(load(dO, q_off(s, b, t, h) + i)) *
                    load(V, kv_off(s, b, k, g) + i);
            dS[t * s.s + k] = dp * keep[t * s.s + k];
            row_dot += P[t * s.s + k] * dS[t * s.s + k];
          }
          for (int64_t k = 0; k < s.s; ++k)
            dS[t * s.s + k] = P[t * s.s + k] * (dS[t * s.s + k] - row_dot);
        }
        for (int64_t t = 0; t < s.t; ++t)
          for (int64_t k = 0; k < s.s; ++k) {
            double ds = s.attrs.scale * dS[t * s.s + k], pd = P[t * s.s + k] * keep[t * s.s + k];
            if (ds == 0.0 && pd == 0.0) continue;
            for (int64_t i = 0; i < s.d; ++i) {
              dq[q_off(s, b, t, h) + i] += ds * load(K, kv_off(s, b, k, g) + i);
              dk[kv_off(s, b, k, g) + i] += ds * load(Q, q_off(s, b, t, h) + i);
              dv[kv_off(s, b, k, g) + i] += pd * load(dO, q_off(s, b, t, h) + i);
            }
          }
      }
    for (size_t i = 0; i < dq.size(); ++i) store(call->outputs[0], i, static_cast<float>(dq[i]));
    for (size_t i = 0; i < dk.size(); ++i) {
      store(call->outputs[1], i, static_cast<float>(dk[i]));
      store(call->outputs[2], i, static_cast<float>(dv[i]));
    }
  });
}

}  // namespace

void add_attention_kernels(std::vector<KernelDesc>& out) {
  add_kernels(out, ops::kAttentionFwd, kRefName, kRefPriority, attention_fwd_ref,
              attention_fwd_supports, attention_fwd_cost);
  add_kernels(out, ops::kAttentionBwd, kRefName, kRefPriority, attention_bwd_ref,
              attention_bwd_supports, attention_bwd_cost);
}

}  // namespace loom::kernels::cpu
