// attention_fwd / attention_bwd, fused (flash-attention 2 style, loom/ops.h): scores are
// never materialised beyond one block of keys per query row.
//   forward: per (b, h, t), key blocks of kBlock with an online softmax (running max m,
//            running sum l, rescaled accumulator); lse = m + log l is saved.
//   backward: recomputes P = exp(scale q.k - lse) block by block. Two race-free passes:
//            (1) per (b, g, key block): dK, dV of those keys, summed over the group's
//                query heads and all queries; (2) per (b, h, t): dQ. Each output element
//                is written by exactly one task, so the result is deterministic.
// Dropout draws the same Philox bits as the reference for element (b, h, t, s) of a
// (B, H, T, S) tensor. Memory is O(B T H D): operands converted to f32 once, plus one
// key block of scores per thread. Tile products are AVX2 dot / axpy over D: the tiles are
// small and the work is spread over OpenMP threads, where a BLAS call (itself threaded)
// would oversubscribe the cores.
#include <immintrin.h>
#include <loom/cpp/philox.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kBlock = 64;  // keys per block

LOOM_CPU_FAST_BEGIN

struct Operands {
  const AttentionShape& s;
  const float *q, *k, *v;
  const int32_t* seg;      // (B, T) or null
  const int32_t* key_seg;  // (B, S) or null: the keys' own ids
  uint32_t threshold;      // Philox keep threshold
  float keep_scale;        // 1 / (1 - p)

  const float* q_row(int64_t b, int64_t t, int64_t h) const {
    return q + ((b * s.t + t) * s.h + h) * s.d;
  }
  const float* k_row(int64_t b, int64_t k, int64_t g) const {
    return this->k + ((b * s.s + k) * s.g + g) * s.d;
  }
  const float* v_row(int64_t b, int64_t k, int64_t g) const {
    return v + ((b * s.s + k) * s.g + g) * s.d;
  }

  // sc[j] = scale * q . k_{k0 + j} for j < n, -inf where masked.
  void scores(const float* qr, int64_t b, int64_t t, int64_t g, int64_t k0, int64_t n,
              float* sc) const {
    const op_checks::SegmentRows rows = op_checks::segment_rows(s, seg, key_seg, b);
    for (int64_t j = 0; j < n; ++j)
      sc[j] = attention_masked(s.attrs.causal, t, k0 + j, s.t, s.s, rows.q, rows.k)
                  ? -INFINITY
                  : s.attrs.scale * simd::dot(qr, k_row(b, k0 + j, g), s.d);
  }

  // keep[j] * 1 / (1 - p) for keys k0 .. k0 + n of row (b, h, t); 1 without dropout.
  void dropout(int64_t b, int64_t h, int64_t t, int64_t k0, int64_t n, float* mult) const {
    if (s.attrs.dropout_p == 0.0f) {
      for (int64_t j = 0; j < n; ++j) mult[j] = 1.0f;
      return;
    }
    uint8_t keep[kBlock];
    philox_keep_range(s.attrs.key, s.attrs.counter, attention_dropout_index(s, b, h, t, k0), n,
                      threshold, keep);
    for (int64_t j = 0; j < n; ++j) mult[j] = keep[j] ? keep_scale : 0.0f;
  }
};

Operands make_operands(const OpCall* call, const AttentionShape& s, const float* q, const float* k,
                       const float* v, const TensorView& seg) {
  float p = s.attrs.dropout_p;
  const int32_t* key_seg = s.key_segments >= 0
                               ? static_cast<const int32_t*>(call->inputs[s.key_segments].data)
                               : nullptr;
  return Operands{s,
                  q,
                  k,
                  v,
                  seg.data != nullptr ? i32(seg) : nullptr,
                  key_seg,
                  keep_threshold(p),
                  1.0f / (1.0f - p)};
}

// p[j] = exp(sc[j] - shift) (0 where sc is -inf).
void exp_shift(float* x, float shift, int64_t n) { simd::exp_shift_sum(x, shift, n); }

Status attention_fwd_fast(const OpCall* call) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_fwd(call, false, DeviceType::kCpu);
    F32Copy q(call->inputs[0]), k(call->inputs[1]), v(call->inputs[2]);
    Operands op = make_operands(call, s, q.data(), k.data(), v.data(), call->inputs[3]);
    const TensorView& O = call->outputs[0];
    float* lse = f32_mut(call->outputs[1]);
    int64_t rows = s.b * s.h * s.t, group = s.h / std::max<int64_t>(s.g, 1);
#pragma omp parallel
    {
      std::vector<float> acc(static_cast<size_t>(s.d));
      float sc[kBlock], mult[kBlock];
#pragma omp for schedule(dynamic, 16)
      for (int64_t r = 0; r < rows; ++r) {
        int64_t b = r / (s.h * s.t), h = (r / s.t) % s.h, t = r % s.t, g = h / group;
        const float* qr = op.q_row(b, t, h);
        std::fill(acc.begin(), acc.end(), 0.0f);
        float m = -INFINITY, l = 0.0f;
        int64_t limit = attention_key_limit(s, t);
        for (int64_t k0 = 0; k0 < limit; k0 += kBlock) {
          int64_t n = std::min(kBlock, limit - k0);
          op.scores(qr, b, t, g, k0, n, sc);
          float block_max = simd::max(sc, n);
          if (block_max == -INFINITY) continue;
          float m_new = std::max(m, block_max);
          float correction = m == -INFINITY ? 0.0f : std::exp(m - m_new);
          l = l * correction + simd::exp_shift_sum(sc, m_new, n);  // sc now holds p~
          simd::scal(correction, acc.data(), s.d);
          op.dropout(b, h, t, k0, n, mult);
          for (int64_t j = 0; j < n; ++j)
            if (sc[j] * mult[j] != 0.0f)
              simd::axpy(sc[j] * mult[j], op.v_row(b, k0 + j, g), acc.data(), s.d);
          m = m_new;
        }
        if (l > 0.0f) {
          simd::scal(1.0f / l, acc.data(), s.d);
          lse[(b * s.h + h) * s.t + t] = m + std::log(l);
        } else {
          lse[(b * s.h + h) * s.t + t] = -INFINITY;  // fully masked row: O = 0
        }
        store_row(O.data, O.dtype, ((b * s.t + t) * s.h + h) * s.d, s.d, acc.data());
      }
    }
  });
}

Status attention_bwd_fast(const OpCall* call) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_bwd(call, false, DeviceType::kCpu);
    F32Copy dout(call->inputs[0]), q(call->inputs[1]), k(call->inputs[2]), v(call->inputs[3]);
    F32Copy o(call->inputs[4]);
    const float* lse = f32(call->inputs[5]);
    Operands op = make_operands(call, s, q.data(), k.data(), v.data(), call->inputs[6]);
    const float* dO = dout.data();
    int64_t group = s.h / std::max<int64_t>(s.g, 1), rows = s.b * s.h * s.t;
    auto row_of = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.t + t) * s.h + h) * s.d; };

    // delta[b, h, t] = dO . O = sum_s P dP (holds with dropout too)   // (B, H, T)
    std::vector<float> delta(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t b = r / (s.h * s.t), h = (r / s.t) % s.h, t = r % s.t;
      delta[r] = simd::dot(dO + row_of(b, t, h), o.data() + row_of(b, t, h), s.d);
    }

    // Pass 1: dK, dV per (b, g, key block).
    const TensorView &dK = call->outputs[1], &dV = call->outputs[2];
    int64_t key_blocks = (s.s + kBlock - 1) / kBlock, tasks = s.b * s.g * key_blocks;
#pragma omp parallel
    {
      std::vector<float> dk(static_cast<size_t>(kBlock * s.d)), dv(dk.size());  // (kBlock, D)
      float p[kBlock], mult[kBlock];
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        int64_t b = task / (s.g * key_blocks), g = (task / key_blocks) % s.g;
        int64_t k0 = (task % key_blocks) * kBlock, n = std::min(kBlock, s.s - k0);
        std::fill(dk.begin(), dk.end(), 0.0f);
        std::fill(dv.begin(), dv.end(), 0.0f);
        // Causal: query t sees key k0 only when t >= k0 - (S - T).
        int64_t t_first = s.attrs.causal ? std::max<int64_t>(0, k0 - (s.s - s.t)) : 0;
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          for (int64_t t = t_first; t < s.t; ++t) {
            float row_lse = lse[(b * s.h + h) * s.t + t];
            if (row_lse == -INFINITY) continue;
            const float *qr = op.q_row(b, t, h), *dor = dO + row_of(b, t, h);
            op.scores(qr, b, t, g, k0, n, p);
            exp_shift(p, row_lse, n);
            op.dropout(b, h, t, k0, n, mult);
            float dt = delta[(b * s.h + h) * s.t + t];
            for (int64_t j = 0; j < n; ++j) {
              if (p[j] == 0.0f) continue;
              if (mult[j] != 0.0f) simd::axpy(p[j] * mult[j], dor, &dv[j * s.d], s.d);
              float dp =
                  mult[j] != 0.0f ? simd::dot(dor, op.v_row(b, k0 + j, g), s.d) * mult[j] : 0.0f;
              simd::axpy(s.attrs.scale * p[j] * (dp - dt), qr, &dk[j * s.d], s.d);
            }
          }
        for (int64_t j = 0; j < n; ++j) {
          store_row(dK.data, dK.dtype, s.dk.at(b, k0 + j, g), s.d, &dk[j * s.d]);
          store_row(dV.data, dV.dtype, s.dv.at(b, k0 + j, g), s.d, &dv[j * s.d]);
        }
      }
    }

    // Pass 2: dQ per query row.
    const TensorView& dQ = call->outputs[0];
#pragma omp parallel
    {
      std::vector<float> dq(static_cast<size_t>(s.d));
      float p[kBlock], mult[kBlock];
#pragma omp for schedule(dynamic, 16)
      for (int64_t r = 0; r < rows; ++r) {
        int64_t b = r / (s.h * s.t), h = (r / s.t) % s.h, t = r % s.t, g = h / group;
        std::fill(dq.begin(), dq.end(), 0.0f);
        float row_lse = lse[r];
        int64_t limit = row_lse == -INFINITY ? 0 : attention_key_limit(s, t);
        const float *qr = op.q_row(b, t, h), *dor = dO + row_of(b, t, h);
        for (int64_t k0 = 0; k0 < limit; k0 += kBlock) {
          int64_t n = std::min(kBlock, limit - k0);
          op.scores(qr, b, t, g, k0, n, p);
          exp_shift(p, row_lse, n);
          op.dropout(b, h, t, k0, n, mult);
          for (int64_t j = 0; j < n; ++j) {
            if (p[j] == 0.0f) continue;
            float dp =
                mult[j] != 0.0f ? simd::dot(dor, op.v_row(b, k0 + j, g), s.d) * mult[j] : 0.0f;
            simd::axpy(s.attrs.scale * p[j] * (dp - delta[r]), op.k_row(b, k0 + j, g), dq.data(),
                       s.d);
          }
        }
        store_row(dQ.data, dQ.dtype, s.dq.at(b, t, h), s.d, dq.data());
      }
    }
  });
}

LOOM_CPU_FAST_END

bool attention_fwd_fast_supports(const OpCall* call) {
  return cpu_has_avx2() && attention_fwd_supports(call);
}
bool attention_bwd_fast_supports(const OpCall* call) {
  return cpu_has_avx2() && attention_bwd_supports(call);
}

// attention_merge in f32, rows in parallel (the reference works in f64).
Status attention_merge_fast(const OpCall* call) {
  return guard([&] {
    auto s = op_checks::check_attention_merge(call, false, DeviceType::kCpu);
    const TensorView& part = call->inputs[0];
    const float* lse_part = f32(call->inputs[1]);
    const TensorView& O = call->outputs[0];
    float* lse = f32_mut(call->outputs[1]);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < s.b * s.t * s.h; ++row) {
      // row indexes (B, T, H); lse is (B, H, T).
      const int64_t h = row % s.h, t = (row / s.h) % s.t, b = row / (s.h * s.t);
      const int64_t r = (b * s.h + h) * s.t + t;
      const float lp = lse_part[r], lo = lse[r];
      if (lp == -INFINITY) continue;  // nothing visible in this block
      const auto [merged, wo, wp] = merge_weights(lo, lp);
      std::vector<float> o(static_cast<size_t>(s.d)), p(o.size());
      load_row(O.data, O.dtype, row * s.d, s.d, o.data());
      load_row(part.data, part.dtype, row * s.d, s.d, p.data());
      for (int64_t i = 0; i < s.d; ++i) o[i] = (wo == 0.0f ? 0.0f : wo * o[i]) + wp * p[i];
      store_row(O.data, O.dtype, row * s.d, s.d, o.data());
      lse[r] = merged;
    }
  });
}
bool attention_merge_fast_supports(const OpCall* call) {
  return passes([&] { op_checks::check_attention_merge(call, true, DeviceType::kCpu); });
}
Status attention_merge_fast_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    auto s = op_checks::check_attention_merge(call, true, DeviceType::kCpu);
    *out = io_cost(call, 4.0 * static_cast<double>(s.b * s.t * s.h * s.d));
  });
}

}  // namespace

void add_flash_attention_kernels(std::vector<KernelDesc>& out) {
  add_kernels(out, ops::kAttentionMerge, kFastName, kFastPriority, attention_merge_fast,
              attention_merge_fast_supports, attention_merge_fast_cost);
  add_kernels(out, ops::kAttentionFwd, kFastName, kFastPriority, attention_fwd_fast,
              attention_fwd_fast_supports, attention_fwd_cost);
  add_kernels(out, ops::kAttentionBwd, kFastName, kFastPriority, attention_bwd_fast,
              attention_bwd_fast_supports, attention_bwd_cost);
}

}  // namespace loom::kernels::cpu
