// Runs the CUDA attention kernels (kernels/cuda/attention/*_kernel.cuh) on the
// CPU under emulation and compares them with an f64 reference written here (the
// semantics of loom/ops.h: causal offset, segment ids, GQA, Philox dropout of
// loom/cpp/philox.h, lse, fully masked rows), with the per-dtype tolerances
// of tests/kernels/cpu/op_test_util.h.
//
// Emulation (emu_prelude.h): one fiber per CUDA thread, a block at a time,
// fibers switched only at barriers and warp collectives, in a shuffled order;
// ldmatrix and mma.sync come from the PTX ISA's fragment layouts
// (kernels/cuda/attention/attention_mma.cuh here replaces the inline-PTX one
// through the include path). It checks the index arithmetic, masks, fragment
// layouts, barriers and numerics of the kernels on a machine without a GPU; it
// says nothing about speed, and cp.async either lands at once or only at its
// wait
// ("deferred"), the two extremes of the hardware's timing. The launch geometry
// is repeated from the launchers (attention_fwd.cu, attention_bwd.cu,
// attention_generic.cu), which cannot be compiled without nvcc. Usage: run.sh
// (from the repository root).
//
// Q, K, V, dQ, dK and dV may be strided views (op_checks::RowStrides): the cases with a
// Layout other than kPacked run each kernel family again on such views of wider buffers
// and require the packed run's outputs bit for bit, untouched input buffers and untouched
// spare elements around the gradients' rows.
#include <loom/cpp/philox.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>

#include "kernels/cuda/attention/attention_bwd_kernel.cuh"
#include "kernels/cuda/attention/attention_fwd_kernel.cuh"
#include "kernels/cuda/attention/attention_generic_kernel.cuh"
#include "kernels/cuda/attention/attention_tiled_kernel.cuh"

#ifndef LOOM_ATTENTION_MMA_EMULATED
#error \
    "the inline-PTX attention_mma.cuh was included instead of the emulated one: put this directory first on the include path (run.sh), or keep the real header out of the Bazel test's inputs"
#endif

namespace loom::kernels::cuda::attn {
alignas(16) unsigned char smem[256 * 1024];
alignas(16) float shared[64 * 1024];
}  // namespace loom::kernels::cuda::attn

using namespace loom;
using namespace loom::kernels::cuda;
using namespace loom::kernels::cuda::attn;

#include "tests/kernels/cuda/emulation/emu_runner.h"

// ---- host tensors
// --------------------------------------------------------------------------
struct Buf {
  DType dt = DType::kF32;
  std::vector<unsigned char> bytes;
  int64_t n = 0;
  Buf() = default;
  Buf(DType d, int64_t count) : dt(d), bytes(count * (d == DType::kF32 ? 4 : 2) + 16), n(count) {}
  void* data() { return bytes.data(); }
  float get(int64_t i) const {
    if (dt == DType::kF32) {
      float f;
      memcpy(&f, &bytes[i * 4], 4);
      return f;
    }
    uint16_t b;
    memcpy(&b, &bytes[i * 2], 2);
    if (dt == DType::kBF16) return bits_to_f32<__nv_bfloat16>(b);
    return bits_to_f32<__half>(b);
  }
  void set(int64_t i, float x) {
    if (dt == DType::kF32) {
      memcpy(&bytes[i * 4], &x, 4);
      return;
    }
    uint16_t b;
    if (dt == DType::kBF16) {
      __nv_bfloat16 v = __float2bfloat16_rn(x);
      memcpy(&b, &v, 2);
    } else {
      __half v = __float2half_rn(x);
      memcpy(&b, &v, 2);
    }
    memcpy(&bytes[i * 2], &b, 2);
  }
};

int64_t g_sm_count = 1;  // multiprocessors of the GPU the launch geometry is for

// Where Q, K, V, dQ, dK, dV live (op_checks::RowStrides: they may be strided views):
//   kPacked: packed tensors only;
//   kFused (MHA, T == S, one dtype): also as views of one (B, T, H, 3 D + pad) buffer at
//     columns 0, D, 2 D (loom/cpp/nn/qkv_views.h's layout, rows padded), and the gradients
//     of another;
//   kPadded: also as views of a buffer each, rows padded, in assorted dimension orders (heads
//     before tokens, gaps between batch entries).
// The views' pads are multiples of 8 elements for the tensor-core kernels (what attention.cu
// requires of them), odd for the generic ones.
enum class Layout { kPacked, kFused, kPadded };

struct Case {
  std::string name;
  DType dt;
  int64_t B, T, S, H, G, D;
  int causal;
  bool seg;
  float p;
  bool generic;
  DType dt_other = DType::kInvalid;  // generic: K, V, dO, dK in this dtype (mixed)
  // A block of a larger attention (AttentionBlockAttrs): its first query and key in the
  // whole; the whole has `more` queries and keys beyond the block's end.
  int64_t q_offset = 0, k_offset = 0, more = 0;
  Layout layout = Layout::kPacked;
};

struct Tol {
  double rtol, atol;
};
Tol tol(DType t) {
  if (t == DType::kBF16) return {1.6e-2, 1e-2};
  if (t == DType::kF16) return {2e-3, 1e-3};
  return {1e-4, 1e-5};
}

int g_fail = 0;
void compare(const std::string& what, const Buf& got, const std::vector<double>& want, DType dt) {
  Tol t = tol(dt);
  double worst = 0;
  int64_t wi = -1;
  int64_t bad = 0;
  for (int64_t i = 0; i < (int64_t)want.size(); ++i) {
    double g = got.get(i), e = want[i];
    double r;
    if (std::isinf(e) || std::isinf(g))
      r = (g == e) ? 0 : 1e9;
    else
      r = std::fabs(g - e) / (t.atol + t.rtol * std::fabs(e));
    if (std::isnan(g)) r = 1e9;
    if (r > 1) ++bad;
    if (r > worst) {
      worst = r;
      wi = i;
    }
  }
  printf("  %-6s worst err/tol = %.3f%s", what.c_str(), worst, bad ? "  FAIL" : "");
  if (wi >= 0) printf(" (at %ld: got %.6g want %.6g)", wi, got.get(wi), want[wi]);
  printf("  bad=%ld/%zu\n", bad, want.size());
  if (bad) ++g_fail;
}

// ---- strided views ------------------------------------------------------------------------

// A (B, rows, heads, D) view into `buf`: element (b, t, h, i) at off + rows_.at(b, t, h) + i.
struct View {
  Buf* buf;
  int64_t off;
  RowStrides rows_;
  int64_t n, heads;  // extents of dimensions 1 and 2
  int64_t at(int64_t b, int64_t t, int64_t h) const { return off + rows_.at(b, t, h); }
};

// Calls f(index in the packed tensor, index in the view's buffer) for every element.
template <class F>
void for_each_element(const View& v, int64_t B, int64_t D, F f) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < v.n; ++t)
      for (int64_t h = 0; h < v.heads; ++h)
        for (int64_t i = 0; i < D; ++i) f(((b * v.n + t) * v.heads + h) * D + i, v.at(b, t, h) + i);
}

size_t elem_size(DType dt) { return dt == DType::kF32 ? 4 : 2; }

// Element i of a and element j of b have the same bits (same dtype).
bool same_bits(const Buf& a, int64_t i, const Buf& b, int64_t j) {
  const size_t e = elem_size(a.dt);
  return memcmp(&a.bytes[i * e], &b.bytes[j * e], e) == 0;
}

// Q, K, V and dQ, dK, dV of a case as views (Layout), their buffers, and what the checks
// need: the buffers' contents before the kernels and which gradient elements the views
// cover. Not copyable: the views point at the buffers.
struct Views {
  static constexpr int64_t kLead = 8, kTail = 16;  // spare elements before and after
  Buf in[3], out[3];                               // kFused: in[0] and out[0] only
  View q, k, v, dq, dk, dv;
  Buf in_before[3], out_before[3];
  std::vector<char> covered[3];  // per gradient buffer
  Views() = default;
  Views(const Views&) = delete;
};

// Builds the views of case c (T, S, H, G, D; dt: Q's dtype, dto: K's and dK's) and copies
// the packed q, k, v into them. Spare input elements are NaN (a kernel that reads one
// poisons its output), spare gradient elements a sentinel that must survive.
void make_views(const Case& c, DType dto, const Buf& q, const Buf& k, const Buf& v, Views& w) {
  const int64_t B = c.B, T = c.T, S = c.S, H = c.H, G = c.G, D = c.D;
  const int64_t lead = Views::kLead;
  auto sized = [&](Buf& buf, DType dt, int64_t n) { buf = Buf(dt, lead + n + Views::kTail); };
  if (c.layout == Layout::kFused) {
    const int64_t W = 3 * D + (c.generic ? 3 : 8);  // a padded row of X: q, k, v, spare
    const RowStrides rows{T * H * W, H * W, W};
    sized(w.in[0], c.dt, B * T * H * W);
    sized(w.out[0], c.dt, B * T * H * W);
    w.q = {&w.in[0], lead, rows, T, H};
    w.k = {&w.in[0], lead + D, rows, S, G};
    w.v = {&w.in[0], lead + 2 * D, rows, S, G};
    w.dq = {&w.out[0], lead, rows, T, H};
    w.dk = {&w.out[0], lead + D, rows, S, G};
    w.dv = {&w.out[0], lead + 2 * D, rows, S, G};
  } else {
    // Row widths and the gap between V's batch entries: odd for the generic kernels.
    const int64_t wq = D + (c.generic ? 3 : 8), wk = D + (c.generic ? 1 : 16),
                  wv = D + (c.generic ? 5 : 8), gap = c.generic ? 7 : 40;
    sized(w.in[0], c.dt, B * T * H * wq);          // Q (B, T, H, wq)
    sized(w.in[1], dto, B * G * S * wk);           // K (B, G, S, wk): heads first
    sized(w.in[2], c.dt, B * (S * G * wv + gap));  // V (B, S, G, wv), gaps between entries
    sized(w.out[0], c.dt, B * H * T * wq);         // dQ (B, H, T, wq): heads first
    sized(w.out[1], dto, B * S * G * wk);          // dK (B, S, G, wk)
    sized(w.out[2], c.dt, B * G * S * wv);         // dV (B, G, S, wv): heads first
    w.q = {&w.in[0], lead, {T * H * wq, H * wq, wq}, T, H};
    w.k = {&w.in[1], lead, {G * S * wk, wk, S * wk}, S, G};
    w.v = {&w.in[2], lead, {S * G * wv + gap, G * wv, wv}, S, G};
    w.dq = {&w.out[0], lead, {H * T * wq, wq, T * wq}, T, H};
    w.dk = {&w.out[1], lead, {S * G * wk, G * wk, wk}, S, G};
    w.dv = {&w.out[2], lead, {G * S * wv, wv, S * wv}, S, G};
  }
  for (Buf& b : w.in)
    for (int64_t i = 0; i < b.n; ++i) b.set(i, NAN);
  for (Buf& b : w.out)
    for (int64_t i = 0; i < b.n; ++i) b.set(i, 7777.f);
  for (auto [src, view] : {std::pair{&q, &w.q}, {&k, &w.k}, {&v, &w.v}})
    for_each_element(*view, B, D, [&](int64_t i, int64_t j) {
      memcpy(&view->buf->bytes[j * elem_size(src->dt)], &src->bytes[i * elem_size(src->dt)],
             elem_size(src->dt));
    });
  for (int i = 0; i < 3; ++i) {
    w.in_before[i] = w.in[i];
    w.out_before[i] = w.out[i];
    w.covered[i].assign(w.out[i].n, 0);
  }
  for (const View* view : {&w.dq, &w.dk, &w.dv}) {
    const int which = view->buf == &w.out[0] ? 0 : view->buf == &w.out[1] ? 1 : 2;
    for_each_element(*view, B, D, [&](int64_t, int64_t j) { w.covered[which][j] = 1; });
  }
}

// The packed tensor of view v (dtype of its buffer).
Buf gather(const View& v, int64_t B, int64_t D) {
  Buf out(v.buf->dt, B * v.n * v.heads * D);
  const size_t e = elem_size(v.buf->dt);
  for_each_element(
      v, B, D, [&](int64_t i, int64_t j) { memcpy(&out.bytes[i * e], &v.buf->bytes[j * e], e); });
  return out;
}

// Elements of got that differ in their bits from want (same dtype and size); prints them.
int64_t count_differing(const char* what, const Buf& got, const Buf& want) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < want.n; ++i)
    if (!same_bits(got, i, want, i)) {
      if (first < 0) first = i;
      ++bad;
    }
  if (bad)
    printf(
        "    %s: %ld/%ld elements differ from the packed run  FAIL (first at %ld: %.6g vs %.6g)\n",
        what, bad, want.n, first, got.get(first), want.get(first));
  return bad;
}

void run_case(const Case& c, std::mt19937& rng) {
  const int64_t B = c.B, T = c.T, S = c.S, H = c.H, G = c.G, D = c.D, grp = H / G;
  const float scale = 1.0f / std::sqrt((float)D);
  DType dto = c.dt_other == DType::kInvalid ? c.dt : c.dt_other;
  Buf q(c.dt, B * T * H * D), k(dto, B * S * G * D), v(c.dt, B * S * G * D);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < q.n; ++i) q.set(i, 2.f * u(rng));
  for (int64_t i = 0; i < k.n; ++i) k.set(i, 2.f * u(rng));
  for (int64_t i = 0; i < v.n; ++i) v.set(i, u(rng));
  // Documents of about 23 tokens; with T != S the keys have their own ids (the op's key
  // segment ids), drawn the same way, so that queries and keys share some documents.
  auto documents = [&](int64_t n) {
    std::vector<int32_t> ids(B * n);
    for (int64_t b = 0; b < B; ++b) {
      int32_t id = 0;
      for (int64_t t = 0; t < n; ++t) {
        if (t > 0 && rng() % 23 == 0) ++id;
        ids[b * n + t] = id;
      }
    }
    return ids;
  };
  std::vector<int32_t> seg = documents(T);
  std::vector<int32_t> kseg = T == S ? seg : documents(S);
  uint64_t key = 0x1234567890abcdefull, counter = 77;
  uint32_t thr = loom::keep_threshold(c.p);
  auto hidden = [&](int64_t b, int64_t t, int64_t s) {
    if (c.causal && s > t + (S - T)) return true;
    return c.seg && seg[b * T + t] != kseg[b * S + s];
  };
  auto zmult = [&](int64_t b, int64_t h, int64_t t, int64_t s) -> double {
    if (c.p == 0.f) return 1.0;
    const int64_t qt = c.q_offset + T + c.more, kt = c.k_offset + S + c.more;
    uint64_t idx = (uint64_t)(((b * H + h) * qt + c.q_offset + t) * kt + c.k_offset + s);
    return loom::philox_keep(key, counter, idx, thr) ? 1.0 / (1.0 - (double)c.p) : 0.0;
  };
  // ---- reference forward (f64)
  std::vector<double> O(B * T * H * D), lse(B * H * T), P(T * S);
  std::vector<double> dQ(B * T * H * D), dK(B * S * G * D), dV(B * S * G * D);
  Buf dO(dto, B * T * H * D), Ob(c.dt, B * T * H * D);
  for (int64_t i = 0; i < dO.n; ++i) dO.set(i, u(rng));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      int64_t g = h / grp;
      for (int64_t t = 0; t < T; ++t) {
        double m = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          double x = -INFINITY;
          if (!hidden(b, t, s)) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d)
              dot += (double)q.get(((b * T + t) * H + h) * D + d) *
                     k.get(((b * S + s) * G + g) * D + d);
            x = scale * dot;
          }
          P[t * S + s] = x;
          m = std::max(m, x);
        }
        double l = 0;
        if (m != -INFINITY)
          for (int64_t s = 0; s < S; ++s) l += std::exp(P[t * S + s] - m);
        double L = m == -INFINITY ? -INFINITY : m + std::log(l);
        lse[(b * H + h) * T + t] = L;
        for (int64_t s = 0; s < S; ++s)
          P[t * S + s] =
              (L == -INFINITY || P[t * S + s] == -INFINITY) ? 0 : std::exp(P[t * S + s] - L);
        for (int64_t d = 0; d < D; ++d) {
          double a = 0;
          for (int64_t s = 0; s < S; ++s)
            if (P[t * S + s] != 0)
              a += P[t * S + s] * zmult(b, h, t, s) * v.get(((b * S + s) * G + g) * D + d);
          O[((b * T + t) * H + h) * D + d] = a;
        }
      }
      // backward
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> ds(S);
        double rowdot = 0;
        for (int64_t s = 0; s < S; ++s) {
          double dp = 0;
          for (int64_t d = 0; d < D; ++d)
            dp += (double)dO.get(((b * T + t) * H + h) * D + d) *
                  v.get(((b * S + s) * G + g) * D + d);
          ds[s] = dp * zmult(b, h, t, s);
          rowdot += P[t * S + s] * ds[s];
        }
        for (int64_t s = 0; s < S; ++s) {
          double dss = scale * P[t * S + s] * (ds[s] - rowdot),
                 pz = P[t * S + s] * zmult(b, h, t, s);
          for (int64_t d = 0; d < D; ++d) {
            dQ[((b * T + t) * H + h) * D + d] += dss * k.get(((b * S + s) * G + g) * D + d);
            dK[((b * S + s) * G + g) * D + d] += dss * q.get(((b * T + t) * H + h) * D + d);
            dV[((b * S + s) * G + g) * D + d] += pz * dO.get(((b * T + t) * H + h) * D + d);
          }
        }
      }
    }
  for (int64_t i = 0; i < Ob.n; ++i) Ob.set(i, (float)O[i]);
  Buf lse_in(DType::kF32, B * H * T);
  for (int64_t i = 0; i < lse_in.n; ++i) lse_in.set(i, (float)lse[i]);

  // ---- params
  AttentionParams p{};
  p.b = B, p.t = T, p.s = S, p.h = H, p.g = G, p.d = D, p.group = grp;
  p.scale = scale;
  p.causal = c.causal;
  p.q_offset = c.q_offset, p.k_offset = c.k_offset;
  p.q_total = c.q_offset + T + c.more, p.k_total = c.k_offset + S + c.more;
  p.dropout = c.p > 0;
  p.threshold = keep_threshold(c.p);
  p.keep_scale = 1.0f / (1.0f - c.p);
  p.key = key;
  p.counter = counter;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.q_rows = p.dq_rows = RowStrides::packed(T, H, D);
  p.k_rows = p.v_rows = p.dk_rows = p.dv_rows = RowStrides::packed(S, G, D);
  p.seg = c.seg ? seg.data() : nullptr;
  p.kseg = c.seg ? kseg.data() : nullptr;
  Buf o(c.dt, B * T * H * D), lse_out(DType::kF32, B * H * T);
  p.o = o.data();
  p.lse = (float*)lse_out.data();
  p.dt_q = c.dt;
  p.dt_k = dto;
  p.dt_v = c.dt;
  p.dt_o = c.dt;
  p.dt_do = dto;
  p.dt_dq = c.dt;
  p.dt_dk = dto;
  p.dt_dv = c.dt;
  Buf dq(c.dt, B * T * H * D), dk(dto, B * S * G * D), dv(c.dt, B * S * G * D);
  // Poisons the outputs (before each family of kernels, so that an unwritten element shows).
  auto poison = [&] {
    for (int64_t i = 0; i < o.n; ++i) o.set(i, 12345.f);
    for (int64_t i = 0; i < dk.n; ++i) {
      dk.set(i, 12345.f);
      dv.set(i, 12345.f);
    }
    for (int64_t i = 0; i < dq.n; ++i) dq.set(i, 12345.f);
    for (int64_t i = 0; i < lse_out.n; ++i) lse_out.set(i, 12345.f);
  };
  poison();
  p.dout = dO.data();
  p.out = Ob.data();
  p.lse_in = (const float*)lse_in.data();
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  std::vector<float> dq_acc(B * T * H * D + 4, 999.f), delta(B * H * T + 4, 999.f);
  p.delta = delta.data();

  printf("%s\n", c.name.c_str());
  const bool same = c.dt_other == DType::kInvalid;
  // tag: "" for the packed tensors, "v." for the views' (gathered).
  auto compare_all = [&](const char* tag, const Buf& o_got, const Buf& lse_got, const Buf& dq_got,
                         const Buf& dk_got, const Buf& dv_got) {
    const std::string t = tag;
    compare(t + "O", o_got, O, c.dt);
    compare(t + "lse", lse_got, lse, DType::kF32);
    // bwd with the reference's O rounded (as the op would get it): compare grads
    // Gradients go through delta = dO . O with O rounded to Q's dtype: the
    // loosest tolerance.
    compare(t + "dQ", dq_got, dQ, c.dt);
    compare(t + "dK", dk_got, dK, same ? dto : c.dt);
    compare(t + "dV", dv_got, dV, c.dt);
  };
  // The kernel families a launcher picks between for this case.
  enum class Family { kTensorCore, kRows, kTiled };
  auto with = [&](auto fn) {
    if (!same)
      fn(AnyIo{});
    else if (c.dt == DType::kF32)
      fn(TypedIo<float>{});
    else if (c.dt == DType::kBF16)
      fn(TypedIo<__nv_bfloat16>{});
    else
      fn(TypedIo<__half>{});
  };
  // Runs one family's kernels on p (forward, then backward).
  auto run_family = [&](Family f) {
    if (f == Family::kTensorCore) {
      // forward
      const int64_t fwd_blocks = (T + 63) / 64 * B * H;
      auto fwd_body = [&]() {
        if (c.dt == DType::kBF16) {
          if (D == 64)
            attention_fwd_tc_kernel<__nv_bfloat16, 64, 4, 64>(p);
          else
            attention_fwd_tc_kernel<__nv_bfloat16, 128, 4, 64>(p);
        } else {
          if (D == 64)
            attention_fwd_tc_kernel<__half, 64, 4, 64>(p);
          else
            attention_fwd_tc_kernel<__half, 128, 4, 64>(p);
        }
      };
      if (fwd_blocks) emu::run_grid(fwd_blocks, 128, fwd_body);
      // backward
      p.dq_acc = dq_acc.data();
      const int64_t rows = B * T * H;
      if (rows)
        emu::run_grid((rows + 7) / 8, 256, [&] {
          if (c.dt == DType::kBF16)
            attention_bwd_delta_kernel<TypedIo<__nv_bfloat16>>(p);
          else
            attention_bwd_delta_kernel<TypedIo<__half>>(p);
        });
      // Split heads as the launcher would on a GPU of g_sm_count multiprocessors.
      p.head_splits = attention_bwd_head_splits(p, g_sm_count);
      std::vector<float> dkv_acc(p.head_splits > 1 ? p.head_splits * 2 * B * S * G * D : 0, 999.f);
      p.dkv_acc = p.head_splits > 1 ? dkv_acc.data() : nullptr;
      printf("  tensor-core backward: %lld head split(s) per (key tile, b, g)\n",
             (long long)p.head_splits);
      const int64_t bwd_blocks = (S + 63) / 64 * B * G * p.head_splits;
      if (bwd_blocks)
        emu::run_grid(bwd_blocks, 128, [&] {
          if (c.dt == DType::kBF16) {
            if (D == 64)
              attention_bwd_tc_kernel<__nv_bfloat16, 64, 4, 64>(p);
            else
              attention_bwd_tc_kernel<__nv_bfloat16, 128, 4, 32>(p);
          } else {
            if (D == 64)
              attention_bwd_tc_kernel<__half, 64, 4, 64>(p);
            else
              attention_bwd_tc_kernel<__half, 128, 4, 32>(p);
          }
        });
      // The reduce and convert kernels: a warp per row, 8 warps per block (attention_bwd.cu).
      auto rows_grid = [](int64_t n) { return std::min<int64_t>((n + 7) / 8, 65536); };
      const int64_t kv_rows = B * S * G;
      if (p.head_splits > 1 && kv_rows)
        emu::run_grid(rows_grid(kv_rows), 256, [&] {
          if (c.dt == DType::kBF16) {
            if (D == 64)
              attention_dkv_reduce_kernel<__nv_bfloat16, 64>(p);
            else
              attention_dkv_reduce_kernel<__nv_bfloat16, 128>(p);
          } else {
            if (D == 64)
              attention_dkv_reduce_kernel<__half, 64>(p);
            else
              attention_dkv_reduce_kernel<__half, 128>(p);
          }
        });
      if (rows)
        emu::run_grid(rows_grid(rows), 256, [&] {
          if (c.dt == DType::kBF16) {
            if (D == 64)
              attention_dq_convert_kernel<__nv_bfloat16, 64>(p);
            else
              attention_dq_convert_kernel<__nv_bfloat16, 128>(p);
          } else {
            if (D == 64)
              attention_dq_convert_kernel<__half, 64>(p);
            else
              attention_dq_convert_kernel<__half, 128>(p);
          }
        });
      p.dkv_acc = nullptr;
    } else if (f == Family::kRows) {
      with([&](auto io) {
        using Io = decltype(io);
        printf("  warp-per-row kernels\n");
        int64_t rows = B * H * T;
        if (rows) emu::run_grid((rows + 3) / 4, 128, [&] { attention_fwd_generic_kernel<Io>(p); });
        p.dq_acc = nullptr;
        rows = B * T * H;
        if (rows) emu::run_grid((rows + 7) / 8, 256, [&] { attention_bwd_delta_kernel<Io>(p); });
        rows = B * S * G;
        if (rows)
          emu::run_grid((rows + 3) / 4, 128, [&] { attention_bwd_dkv_generic_kernel<Io>(p); });
        rows = B * T * H;
        if (rows)
          emu::run_grid((rows + 3) / 4, 128, [&] { attention_bwd_dq_generic_kernel<Io>(p); });
      });
    } else {
      printf("  tiled kernels\n");
      with([&](auto io) {
        using Io = decltype(io);
        const int64_t t_blocks = (T + kTiledRows - 1) / kTiledRows * B * H;
        const int64_t s_blocks = (S + kTiledRows - 1) / kTiledRows * B * G;
        auto tiled = [&](auto dv_groups) {
          constexpr int kDv = decltype(dv_groups)::value;
          if (t_blocks)
            emu::run_grid(t_blocks, kTiledThreads, [&] { attention_fwd_tiled_kernel<Io, kDv>(p); });
          if (B * T * H > 0)
            emu::run_grid((B * T * H + 7) / 8, 256, [&] { attention_bwd_delta_kernel<Io>(p); });
          if (s_blocks)
            emu::run_grid(s_blocks, kTiledThreads,
                          [&] { attention_bwd_dkv_tiled_kernel<Io, kDv>(p); });
          if (t_blocks)
            emu::run_grid(t_blocks, kTiledThreads,
                          [&] { attention_bwd_dq_tiled_kernel<Io, kDv>(p); });
        };
        if (tiled_dv(D) == 1)
          tiled(std::integral_constant<int, 1>{});
        else
          tiled(std::integral_constant<int, 2>{});
      });
    }
  };
  // Runs family f again with Q, K, V, dQ, dK, dV as views (c.layout) and checks that the
  // outputs equal the packed run's bit for bit (the same arithmetic in the same order: only
  // the addresses differ), that the inputs' buffers are untouched and that the gradients'
  // writes stayed within their views' rows (the spare elements keep their sentinel).
  auto run_views = [&](Family f) {
    const Buf o_ref = o, lse_ref = lse_out, dq_ref = dq, dk_ref = dk, dv_ref = dv;
    Views w;
    make_views(c, dto, q, k, v, w);
    const AttentionParams packed = p;
    p.q = w.q.buf->bytes.data() + w.q.off * elem_size(c.dt);
    p.k = w.k.buf->bytes.data() + w.k.off * elem_size(dto);
    p.v = w.v.buf->bytes.data() + w.v.off * elem_size(c.dt);
    p.dq = w.dq.buf->bytes.data() + w.dq.off * elem_size(c.dt);
    p.dk = w.dk.buf->bytes.data() + w.dk.off * elem_size(dto);
    p.dv = w.dv.buf->bytes.data() + w.dv.off * elem_size(c.dt);
    p.q_rows = w.q.rows_, p.k_rows = w.k.rows_, p.v_rows = w.v.rows_;
    p.dq_rows = w.dq.rows_, p.dk_rows = w.dk.rows_, p.dv_rows = w.dv.rows_;
    poison();
    printf("  as views (%s): row strides Q (%ld, %ld, %ld) K (%ld, %ld, %ld) dQ (%ld, %ld, %ld)\n",
           c.layout == Layout::kFused ? "one fused QKV buffer" : "padded buffers", p.q_rows.b_,
           p.q_rows.t_, p.q_rows.h_, p.k_rows.b_, p.k_rows.t_, p.k_rows.h_, p.dq_rows.b_,
           p.dq_rows.t_, p.dq_rows.h_);
    run_family(f);
    p = packed;
    const Buf gdq = gather(w.dq, B, D), gdk = gather(w.dk, B, D), gdv = gather(w.dv, B, D);
    compare_all("v.", o, lse_out, gdq, gdk, gdv);
    int64_t bad = count_differing("O", o, o_ref) + count_differing("lse", lse_out, lse_ref) +
                  count_differing("dQ", gdq, dq_ref) + count_differing("dK", gdk, dk_ref) +
                  count_differing("dV", gdv, dv_ref);
    int64_t inputs_changed = 0, spare_written = 0;
    for (int i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < w.in[i].n; ++j)
        inputs_changed += !same_bits(w.in[i], j, w.in_before[i], j);
      for (int64_t j = 0; j < w.out[i].n; ++j)
        spare_written += !w.covered[i][j] && !same_bits(w.out[i], j, w.out_before[i], j);
    }
    printf(
        "    views vs packed run: %ld elements differ; input buffers: %ld elements changed; "
        "gradient buffers: %ld spare elements written%s\n",
        bad, inputs_changed, spare_written, bad || inputs_changed || spare_written ? "  FAIL" : "");
    if (bad || inputs_changed || spare_written) ++g_fail;
  };

  std::vector<Family> families;
  if (!c.generic) {
    families = {Family::kTensorCore};
  } else {
    // The warp-per-row kernels first; the tiled ones (attention_generic.cu takes them for one
    // storage dtype and D <= kAttentionTiledMaxD) in a second round, compared in turn.
    families = {Family::kRows};
    if (same && D <= kAttentionTiledMaxD) families.push_back(Family::kTiled);
  }
  for (Family f : families) {
    poison();
    run_family(f);
    compare_all("", o, lse_out, dq, dk, dv);
    if (c.layout != Layout::kPacked) run_views(f);
  }
}

int main(int argc, char** argv) {
  std::mt19937 rng(42);
  // argv[1]: "immediate" (cp.async lands at once) or "deferred" (at its wait);
  // without it, both in turn. argv[2]: the index of the only case to run.
  std::vector<bool> modes = {false, true};
  if (argc > 1) modes = {std::string(argv[1]) == "deferred"};
  // Warps stalled behind the others (emu_runner.h) in the full run; not in a one-timing run
  // (the sanitizer pass's, where the test is slowest and looks for memory errors).
  emu::g_stall_warps = argc < 2;
  std::vector<Case> cases = {
      {"bf16 D64 B1 T80 S80 H2 G1 plain", DType::kBF16, 1, 80, 80, 2, 1, 64, 0, false, 0.f, false},
      {"f16 D64 B1 T80 S80 H2 G1 plain", DType::kF16, 1, 80, 80, 2, 1, 64, 0, false, 0.f, false},
      {"bf16 D128 B1 T70 S100 H4 G2 causal", DType::kBF16, 1, 70, 100, 4, 2, 128, 1, false, 0.f,
       false},
      {"f16 D128 B2 T100 S40 H2 G2 causal (T>S)", DType::kF16, 2, 100, 40, 2, 2, 128, 1, false, 0.f,
       false},
      {"bf16 D64 B1 T96 S96 H2 G1 seg causal", DType::kBF16, 1, 96, 96, 2, 1, 64, 1, true, 0.f,
       false},
      {"f16 D64 B1 T72 S72 H2 G1 dropout", DType::kF16, 1, 72, 72, 2, 1, 64, 0, false, 0.2f, false},
      {"bf16 D128 B1 T33 S65 H3 G1 causal dropout", DType::kBF16, 1, 33, 65, 3, 1, 128, 1, false,
       0.1f, false},
      {"f32 D40 generic B1 T37 S50 H4 G2 causal dropout", DType::kF32, 1, 37, 50, 4, 2, 40, 1,
       false, 0.15f, true},
      {"f32 D64 generic seg", DType::kF32, 2, 45, 45, 2, 1, 64, 0, true, 0.f, true},
      // Blocks of a larger attention: the dropout index of their place in the whole.
      {"bf16 D64 B2 T64 S64 block dropout", DType::kBF16, 2, 64, 64, 2, 1, 64, 0, false, 0.2f,
       false, DType::kInvalid, 128, 64, 17},
      {"f32 D24 generic block dropout causal", DType::kF32, 1, 20, 20, 2, 1, 24, 1, false, 0.2f,
       true, DType::kInvalid, 40, 0, 5},
      // Key segment ids (T != S): a block of a packed sequence's keys (context parallelism).
      {"bf16 D64 B2 T64 S96 H2 G1 key seg", DType::kBF16, 2, 64, 96, 2, 1, 64, 0, true, 0.f, false},
      {"f16 D128 B1 T80 S48 H2 G2 key seg causal", DType::kF16, 1, 80, 48, 2, 2, 128, 1, true, 0.f,
       false},
      {"f32 D40 generic B2 T30 S50 key seg dropout", DType::kF32, 2, 30, 50, 2, 1, 40, 0, true,
       0.1f, true},
      {"bf16 D96 generic causal T>S", DType::kBF16, 1, 40, 20, 2, 1, 96, 1, false, 0.f, true},
      {"bf16 D64 B2 T256 S256 H2 G1 causal", DType::kBF16, 2, 256, 256, 2, 1, 64, 1, false, 0.f,
       false},
      {"f16 D128 B1 T160 S160 H2 G1 seg dropout", DType::kF16, 1, 160, 160, 2, 1, 128, 0, true,
       0.1f, false},
      {"bf16 D64 T1 S1", DType::kBF16, 1, 1, 1, 1, 1, 64, 1, false, 0.f, false},
      {"f16 D128 T5 S0", DType::kF16, 1, 5, 0, 2, 1, 128, 0, false, 0.f, false},
      {"bf16 D64 T0 S7", DType::kBF16, 1, 0, 7, 2, 1, 64, 0, false, 0.f, false},
      {"f32 D5 generic T5 S0", DType::kF32, 1, 5, 0, 2, 1, 5, 1, false, 0.f, true},
      {"f32 D300 generic T0 S3", DType::kF32, 1, 0, 3, 2, 1, 300, 1, false, 0.f, true},
      {"f16 D200 generic causal dropout GQA", DType::kF16, 2, 20, 33, 4, 2, 200, 1, false, 0.3f,
       true},
      {"mixed bf16/f32 D64 generic", DType::kBF16, 1, 30, 30, 2, 2, 64, 1, false, 0.1f, true,
       DType::kF32},
      {"bf16 D64 B1 T130 S70 H8 G1 MQA", DType::kBF16, 1, 130, 70, 8, 1, 64, 0, false, 0.f, false},
      {"f16 D128 B2 T17 S200 H4 G1 causal", DType::kF16, 2, 17, 200, 4, 1, 128, 1, false, 0.f,
       false},
      {"bf16 D128 B1 T200 S17 H2 G1 causal (T>>S)", DType::kBF16, 1, 200, 17, 2, 1, 128, 1, false,
       0.f, false},
      {"f16 D64 B3 T129 S129 H6 G3 causal seg dropout", DType::kF16, 3, 129, 129, 6, 3, 64, 1, true,
       0.3f, false},
      {"bf16 D128 B1 T1 S300 H2 G2 causal dropout", DType::kBF16, 1, 1, 300, 2, 2, 128, 1, false,
       0.5f, false},
      {"bf16 D64 B1 T64 S128 H2 G1 causal", DType::kBF16, 1, 64, 128, 2, 1, 64, 1, false, 0.f,
       false},
      {"f16 D128 B1 T95 S33 H4 G2 dropout", DType::kF16, 1, 95, 33, 4, 2, 128, 0, false, 0.1f,
       false},
      // The tiled generic kernels over several 64-row tiles: query and key tiles that end
      // inside the tensor, the causal offset either way, GQA, segments, dropout, both
      // column-group counts (D <= 64, D <= 128) with partial groups.
      {"f32 D64 generic B2 T150 S150 H4 G2 causal seg dropout", DType::kF32, 2, 150, 150, 4, 2, 64,
       1, true, 0.2f, true},
      {"f32 D128 generic B1 T100 S170 H2 G1 causal", DType::kF32, 1, 100, 170, 2, 1, 128, 1, false,
       0.f, true},
      {"f32 D80 generic B1 T130 S70 H4 G1 causal (T>S) dropout", DType::kF32, 1, 130, 70, 4, 1, 80,
       1, false, 0.1f, true},
      {"f16 D36 generic B1 T70 S129 H2 G2 key seg", DType::kF16, 1, 70, 129, 2, 2, 36, 0, true, 0.f,
       true},
      // On 3 multiprocessors (i % 3 == 2): 3 head splits of 2, 2 and 1 heads.
      {"bf16 D64 B1 T80 S80 H5 G1 causal (uneven head splits)", DType::kBF16, 1, 80, 80, 5, 1, 64,
       1, false, 0.f, false},
      // Q, K, V, dQ, dK, dV as strided views (Layout), every family: the outputs must equal the
      // packed run's bit for bit and stay within their rows. Generic: fused MHA in f32 (rows
      // and tiled) and bf16 (two tiles), GQA in padded buffers (tiled with two column groups,
      // per row for D > 128 and for mixed dtypes). Tensor cores: fused MHA (direct dK, dV
      // stores, D = 64 and 128), GQA and MQA in padded buffers with split heads (the reduce
      // kernel, D = 128 and 64), MHA and GQA in padded buffers without (direct stores, D = 64
      // and 128), each at an index whose multiprocessor count splits it or not.
      {"f32 D40 generic B2 T37 H3 causal dropout, fused QKV views", DType::kF32, 2, 37, 37, 3, 3,
       40, 1, false, 0.15f, true, DType::kInvalid, 0, 0, 0, Layout::kFused},
      {"bf16 D64 generic B1 T70 H2 seg, fused QKV views", DType::kBF16, 1, 70, 70, 2, 2, 64, 0,
       true, 0.f, true, DType::kInvalid, 0, 0, 0, Layout::kFused},
      {"f32 D72 generic B2 T50 S70 H4 G2 causal, padded views", DType::kF32, 2, 50, 70, 4, 2, 72, 1,
       false, 0.f, true, DType::kInvalid, 0, 0, 0, Layout::kPadded},
      {"f16 D200 generic B1 T20 S33 H4 G2 dropout, padded views", DType::kF16, 1, 20, 33, 4, 2, 200,
       0, false, 0.2f, true, DType::kInvalid, 0, 0, 0, Layout::kPadded},
      {"mixed bf16/f32 D64 generic B2 T30 S41 H4 G2 causal dropout, padded views", DType::kBF16, 2,
       30, 41, 4, 2, 64, 1, false, 0.1f, true, DType::kF32, 0, 0, 0, Layout::kPadded},
      {"bf16 D64 B2 T80 H3 causal, fused QKV views", DType::kBF16, 2, 80, 80, 3, 3, 64, 1, false,
       0.f, false, DType::kInvalid, 0, 0, 0, Layout::kFused},
      {"f16 D128 B1 T70 S100 H4 G2 dropout, padded views (head splits)", DType::kF16, 1, 70, 100, 4,
       2, 128, 0, false, 0.1f, false, DType::kInvalid, 0, 0, 0, Layout::kPadded},
      {"f16 D128 B1 T40 H2 seg, fused QKV views", DType::kF16, 1, 40, 40, 2, 2, 128, 0, true, 0.f,
       false, DType::kInvalid, 0, 0, 0, Layout::kFused},
      {"bf16 D64 B1 T65 S90 H4 G1 causal MQA, padded views (head splits)", DType::kBF16, 1, 65, 90,
       4, 1, 64, 1, false, 0.f, false, DType::kInvalid, 0, 0, 0, Layout::kPadded},
      {"bf16 D64 B2 T50 S70 H2 G2 causal, padded views", DType::kBF16, 2, 50, 70, 2, 2, 64, 1,
       false, 0.f, false, DType::kInvalid, 0, 0, 0, Layout::kPadded},
      {"f16 D128 B1 T40 S72 H4 G2 seg, padded views", DType::kF16, 1, 40, 72, 4, 2, 128, 0, true,
       0.f, false, DType::kInvalid, 0, 0, 0, Layout::kPadded},
  };
  int only = argc > 2 ? atoi(argv[2]) : -1;
  for (bool deferred : modes) {
    emu::g_deferred_cp = deferred;
    printf("== cp.async %s\n", deferred ? "deferred (lands at its wait)" : "immediate");
    for (size_t i = 0; i < cases.size(); ++i) {
      // The tensor-core backward's launch geometry for a GPU of 132 multiprocessors (an H100:
      // these small problems split the heads whenever the group has several), of one (never
      // split) or of three (a few splits, some uneven), in turn.
      g_sm_count = i % 3 == 0 ? 132 : i % 3 == 1 ? 1 : 3;
      if (only < 0 || (int)i == only) run_case(cases[i], rng);
    }
  }
  printf("%s (%d failures)\n", g_fail ? "FAILED" : "ALL OK", g_fail);
  return g_fail ? 1 : 0;
}
