// attention_fwd / attention_bwd, reference (loom/ops.h): per (batch, head) the score matrix
// (T, S) is materialised, softmax-ed with the mask, dropped out with the Philox mask of a
// (B, H, T, S) tensor, and multiplied by V. Backward recomputes P from the given lse and
// takes delta = dO . O from the given O (so a call over one block of a row's keys, with the
// row's merged O and lse, gives that block's share of the gradients).
// Query head h reads key/value head h / (H / G) (GQA). f64 accumulation throughout.
// A fully masked query row gives O = 0 and lse = -inf; backward gives it zero gradients.
#include "kernels/cpu/attention.h"

#include <loom/cpp/philox.h>

namespace loom::kernels::cpu {

bool attention_fwd_supports(const OpCall* call) {
  return passes([&] { op_checks::check_attention_fwd(call, true, DeviceType::kCpu); });
}
bool attention_bwd_supports(const OpCall* call) {
  return passes([&] { op_checks::check_attention_bwd(call, true, DeviceType::kCpu); });
}

// Forward: Q K^T and P V, 2 flops per multiply-add; backward: dV, dP, dQ, dK (recompute of
// Q K^T is not model work, so MFU leaves it out).
Status attention_fwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_fwd(call, true, DeviceType::kCpu);
    *out = io_cost(call, 4.0 * op_checks::attention_pairs(s) * static_cast<double>(s.d));
  });
}
Status attention_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_bwd(call, true, DeviceType::kCpu);
    *out = io_cost(call, 8.0 * op_checks::attention_pairs(s) * static_cast<double>(s.d));
  });
}

namespace {

// Offsets of row (b, t, head) in a packed (B, T, H, D) (O, dO and the f64 accumulators) and
// of (b, s, g) in a packed (B, S, G, D); Q, K, V, dQ, dK, dV use their own row strides.
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
  const int32_t* key_seg = s.key_segments >= 0
                               ? static_cast<const int32_t*>(call->inputs[s.key_segments].data)
                               : nullptr;
  const op_checks::SegmentRows rows =
      op_checks::segment_rows(s, seg.data != nullptr ? i32(seg) : nullptr, key_seg, b);
  for (int64_t t = 0; t < s.t; ++t) {
    double* row = &P[t * s.s];
    double m = -INFINITY;
    for (int64_t k = 0; k < s.s; ++k) {
      if (attention_masked(s.attrs.causal, t, k, s.t, s.s, rows.q, rows.k)) {
        row[k] = -INFINITY;
        continue;
      }
      double dot = 0.0;
      for (int64_t i = 0; i < s.d; ++i)
        dot += static_cast<double>(load(Q, s.q.at(b, t, h) + i)) * load(K, s.k.at(b, k, g) + i);
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
    AttentionShape s = op_checks::check_attention_fwd(call, false, DeviceType::kCpu);
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
                acc += P[t * s.s + k] * keep[t * s.s + k] * load(V, s.v.at(b, k, g) + i);
            store(O, q_off(s, b, t, h) + i, static_cast<float>(acc));
          }
      }
  });
}

Status attention_bwd_ref(const OpCall* call) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_bwd(call, false, DeviceType::kCpu);
    const TensorView &dO = call->inputs[0], &Q = call->inputs[1], &K = call->inputs[2];
    const TensorView &V = call->inputs[3], &O = call->inputs[4];
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
          // dP = (dO V^T) * keep / (1 - p); dS = P * (dP - delta), delta = dO . O, which is
          // sum(P * dP) over the whole row (this call's keys may be one block of it).
          double row_dot = 0.0;
          for (int64_t i = 0; i < s.d; ++i)
            row_dot += static_cast<double>(load(dO, q_off(s, b, t, h) + i)) *
                       load(O, q_off(s, b, t, h) + i);
          for (int64_t k = 0; k < s.s; ++k) {
            double dp = 0.0;
            for (int64_t i = 0; i < s.d; ++i)
              dp += static_cast<double>(load(dO, q_off(s, b, t, h) + i)) *
                    load(V, s.v.at(b, k, g) + i);
            dS[t * s.s + k] = dp * keep[t * s.s + k];
          }
          for (int64_t k = 0; k < s.s; ++k)
            dS[t * s.s + k] = P[t * s.s + k] * (dS[t * s.s + k] - row_dot);
        }
        for (int64_t t = 0; t < s.t; ++t)
          for (int64_t k = 0; k < s.s; ++k) {
            double ds = s.attrs.scale * dS[t * s.s + k], pd = P[t * s.s + k] * keep[t * s.s + k];
            if (ds == 0.0 && pd == 0.0) continue;
            for (int64_t i = 0; i < s.d; ++i) {
              dq[q_off(s, b, t, h) + i] += ds * load(K, s.k.at(b, k, g) + i);
              dk[kv_off(s, b, k, g) + i] += ds * load(Q, s.q.at(b, t, h) + i);
              dv[kv_off(s, b, k, g) + i] += pd * load(dO, q_off(s, b, t, h) + i);
            }
          }
      }
    for (int64_t b = 0; b < s.b; ++b) {  // into the outputs' (maybe strided) rows
      for (int64_t t = 0; t < s.t; ++t)
        for (int64_t h = 0; h < s.h; ++h)
          for (int64_t i = 0; i < s.d; ++i)
            store(call->outputs[0], s.dq.at(b, t, h) + i,
                  static_cast<float>(dq[q_off(s, b, t, h) + i]));
      for (int64_t k = 0; k < s.s; ++k)
        for (int64_t g = 0; g < s.g; ++g)
          for (int64_t i = 0; i < s.d; ++i) {
            store(call->outputs[1], s.dk.at(b, k, g) + i,
                  static_cast<float>(dk[kv_off(s, b, k, g) + i]));
            store(call->outputs[2], s.dv.at(b, k, g) + i,
                  static_cast<float>(dv[kv_off(s, b, k, g) + i]));
          }
    }
  });
}

// attention_merge: f64 arithmetic per row (b, t, h).
Status attention_merge_ref(const OpCall* call) {
  return guard([&] {
    auto s = op_checks::check_attention_merge(call, false, DeviceType::kCpu);
    const TensorView& part = call->inputs[0];
    const float* lse_part = f32(call->inputs[1]);
    const TensorView& O = call->outputs[0];
    float* lse = f32_mut(call->outputs[1]);
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t t = 0; t < s.t; ++t)
        for (int64_t h = 0; h < s.h; ++h) {
          const int64_t r = (b * s.h + h) * s.t + t, row = ((b * s.t + t) * s.h + h) * s.d;
          const double lp = lse_part[r], lo = lse[r];
          if (lp == -INFINITY) continue;  // nothing visible in this block
          const auto [merged, wo, wp] = merge_weights(lo, lp);
          for (int64_t i = 0; i < s.d; ++i)
            store(O, row + i,
                  static_cast<float>((wo == 0.0 ? 0.0 : wo * load(O, row + i)) +
                                     wp * load(part, row + i)));
          lse[r] = static_cast<float>(merged);
        }
  });
}
bool attention_merge_supports(const OpCall* call) {
  return passes([&] { op_checks::check_attention_merge(call, true, DeviceType::kCpu); });
}
Status attention_merge_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    auto s = op_checks::check_attention_merge(call, true, DeviceType::kCpu);
    *out = io_cost(call, 4.0 * static_cast<double>(s.b * s.t * s.h * s.d));
  });
}

}  // namespace

void add_attention_kernels(std::vector<KernelDesc>& out) {
  add_kernels(out, ops::kAttentionFwd, kRefName, kRefPriority, attention_fwd_ref,
              attention_fwd_supports, attention_fwd_cost);
  add_kernels(out, ops::kAttentionBwd, kRefName, kRefPriority, attention_bwd_ref,
              attention_bwd_supports, attention_bwd_cost);
  add_kernels(out, ops::kAttentionMerge, kRefName, kRefPriority, attention_merge_ref,
              attention_merge_supports, attention_merge_cost);
}

}  // namespace loom::kernels::cpu
