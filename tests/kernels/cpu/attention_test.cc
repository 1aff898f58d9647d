// masked_softmax and attention: the references against f64 computations written here
// (causal with S != T, GQA, segment ids, fully masked rows), the fused attention against
// the reference over dtypes and odd shapes, backward of the references against finite
// differences, and fused attention with dropout against the composition of reference ops
// (gemm, masked_softmax_fwd, dropout_fwd, gemm); on a GPU, every CUDA kernel (loom's and
// cuDNN's) by name on tensor-core shapes and on calls cuDNN must decline.
#include <cuda_runtime.h>
#include <loom/cpp/op_checks/attention.h>

#include <cmath>

#include "kernels/cuda/attention/cudnn_attention.h"
#include "kernels/cuda/kernel_families.h"
#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

struct AttnCase {
  int64_t b, t, s, h, g, d;
  bool causal, segments;
};

std::string describe(const AttnCase& c) {
  return "B" + std::to_string(c.b) + " T" + std::to_string(c.t) + " S" + std::to_string(c.s) +
         " H" + std::to_string(c.h) + " G" + std::to_string(c.g) + " D" + std::to_string(c.d) +
         (c.causal ? " causal" : "") + (c.segments ? " segments" : "");
}

struct AttnInputs {
  Tensor q, k, v, seg;
  Tensor kseg;  // the keys' own segment ids (B, S), or empty
};

AttnInputs make_inputs(const AttnCase& c, DType dt, std::mt19937& rng) {
  AttnInputs in{Tensor::random(dt, {c.b, c.t, c.h, c.d}, rng, -2, 2),
                Tensor::random(dt, {c.b, c.s, c.g, c.d}, rng, -2, 2),
                Tensor::random(dt, {c.b, c.s, c.g, c.d}, rng), Tensor(), Tensor()};
  if (c.segments) {  // two or three documents per row
    std::vector<int32_t> ids(c.b * c.t);
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t t = 0; t < c.t; ++t)
        ids[b * c.t + t] = static_cast<int32_t>((t * (2 + b)) / c.t);
    in.seg = Tensor::i32({c.b, c.t}, ids);
  }
  return in;
}

bool masked(const AttnCase& c, const Tensor& seg, int64_t b, int64_t t, int64_t s,
            const Tensor* kseg = nullptr) {
  if (c.causal && s > t + (c.s - c.t)) return true;
  if (seg.empty()) return false;
  return seg.get(b * c.t + t) != (kseg != nullptr ? kseg->get(b * c.s + s) : seg.get(b * c.t + s));
}

// O (B, T, H, D) and lse (B, H, T) in f64, straight from the definition.
void naive_attention(const AttnCase& c, const AttnInputs& in, float scale, std::vector<double>& o,
                     std::vector<double>& lse) {
  o.assign(c.b * c.t * c.h * c.d, 0.0);
  lse.assign(c.b * c.h * c.t, 0.0);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t t = 0; t < c.t; ++t) {
        int64_t g = h / (c.h / c.g);
        std::vector<double> sc(c.s, -INFINITY);
        double m = -INFINITY;
        for (int64_t s = 0; s < c.s; ++s) {
          if (masked(c, in.seg, b, t, s, in.kseg.empty() ? nullptr : &in.kseg)) continue;
          double dot = 0;
          for (int64_t i = 0; i < c.d; ++i)
            dot += in.q.get(((b * c.t + t) * c.h + h) * c.d + i) *
                   in.k.get(((b * c.s + s) * c.g + g) * c.d + i);
          sc[s] = scale * dot;
          m = std::max(m, sc[s]);
        }
        double sum = 0;
        for (int64_t s = 0; s < c.s; ++s) sum += m == -INFINITY ? 0 : std::exp(sc[s] - m);
        lse[(b * c.h + h) * c.t + t] = sum > 0 ? m + std::log(sum) : -INFINITY;
        for (int64_t s = 0; s < c.s; ++s) {
          double p = sum > 0 ? std::exp(sc[s] - m) / sum : 0.0;
          for (int64_t i = 0; i < c.d; ++i)
            o[((b * c.t + t) * c.h + h) * c.d + i] +=
                p * in.v.get(((b * c.s + s) * c.g + g) * c.d + i);
        }
      }
}

const std::vector<AttnCase> kOracleCases = {
    {2, 5, 5, 4, 2, 3, false, false}, {2, 5, 5, 4, 2, 3, true, false},
    {1, 3, 7, 2, 1, 4, true, false},  // more keys than queries (KV cache)
    {1, 7, 3, 2, 2, 4, true, false},  // fewer keys: the first rows are fully masked
    {2, 9, 9, 3, 1, 5, true, true},   {2, 9, 9, 2, 2, 5, false, true},
};

class AttentionTest : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionTest, ReferenceMatchesF64) {
  std::mt19937 rng(1);
  DType dt = GetParam();
  for (const AttnCase& c : kOracleCases) {
    AttnInputs in = make_inputs(c, dt, rng);
    float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    ops::AttentionAttrs at{scale, c.causal, 0.0f, 0, 0};
    Tensor o(dt, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
    run_ref(ops::kAttentionFwd, dt, {&in.q, &in.k, &in.v, &in.seg}, {&o, &lse}, &at);
    std::vector<double> eo, expected_lse;
    naive_attention(c, in, scale, eo, expected_lse);
    expect_close(o, eo, dt, "attention O " + describe(c));
    expect_close(lse, expected_lse, DType::kF32, "attention lse " + describe(c));
  }
}

TEST_P(AttentionTest, FusedMatchesReference) {
  std::mt19937 rng(2);
  DType dt = GetParam();
  std::vector<AttnCase> cases = kOracleCases;
  cases.push_back({1, 1, 1, 1, 1, 1, false, false});
  cases.push_back({1, 65, 65, 4, 2, 16, true, false});  // key blocks of 64 plus a tail
  cases.push_back({2, 33, 127, 2, 1, 7, true, false});
  cases.push_back({1, 130, 130, 2, 2, 8, false, true});
  for (const AttnCase& c : cases)
    for (float p : {0.0f, 0.25f}) {
      AttnInputs in = make_inputs(c, dt, rng);
      ops::AttentionAttrs at{0.7f / std::sqrt(static_cast<float>(c.d)), c.causal, p, 1234, 99};
      std::string what = describe(c) + " dropout " + std::to_string(p);
      expect_fast_matches_ref(
          ops::kAttentionFwd, dt, {in.q, in.k, in.v, in.seg},
          {Tensor(dt, {c.b, c.t, c.h, c.d}), Tensor(DType::kF32, {c.b, c.h, c.t})}, &at, what);
      Tensor o(dt, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
      run_ref(ops::kAttentionFwd, dt, {&in.q, &in.k, &in.v, &in.seg}, {&o, &lse}, &at);
      Tensor dout = Tensor::random(dt, {c.b, c.t, c.h, c.d}, rng);
      expect_fast_matches_ref(ops::kAttentionBwd, dt, {dout, in.q, in.k, in.v, o, lse, in.seg},
                              {Tensor(dt, {c.b, c.t, c.h, c.d}), Tensor(dt, {c.b, c.s, c.g, c.d}),
                               Tensor(dt, {c.b, c.s, c.g, c.d})},
                              &at, what);
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// Keys [s0, s1) of a (1, S, G, D) tensor, as their own tensor.
Tensor key_block(const Tensor& k, int64_t s0, int64_t s1, int64_t g, int64_t d) {
  Tensor out(k.dtype(), {1, s1 - s0, g, d});
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, k.get(s0 * g * d + i));
  return out;
}

// Context parallelism's blocks (loom/cpp/nn/context_parallel.h): the c queries of a causal
// sequence's second chunk over keys [0, c) (a full block) and [c, 2c) (a causal square),
// merged by attention_merge, equal attention over all 2c keys (the f64 oracle); and
// attention_bwd per block with the merged O and lse gives shares that add up to the whole
// row's gradients. For the reference and the fast kernels, in f32.
TEST(AttentionBlocks, MergedBlocksEqualTheWholeRowAndBackwardSharesAddUp) {
  const int64_t c = 37, h = 4, g = 2, d = 8;
  const AttnCase whole{1, c, 2 * c, h, g, d, true, false};
  const DType dt = DType::kF32;
  for (const char* name : {"cpu.ref", "cpu.fast"})
    for (float p : {0.0f, 0.2f}) {
      std::mt19937 rng(7);
      AttnInputs in = make_inputs(whole, dt, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      // With dropout the blocks say where they sit in the whole (AttentionBlockAttrs), and
      // draw the whole call's mask.
      const ops::AttentionAttrs causal{scale, 1, p, 0x5eedull, 40},
          full{scale, 0, p, 0x5eedull, 40};
      const ops::AttentionBlockAttrs first{full, 0, 0, c, 2 * c}, second{causal, 0, c, c, 2 * c};
      Tensor k0 = key_block(in.k, 0, c, g, d), k1 = key_block(in.k, c, 2 * c, g, d);
      Tensor v0 = key_block(in.v, 0, c, g, d), v1 = key_block(in.v, c, 2 * c, g, d);
      Tensor none;
      Tensor o(dt, {1, c, h, d}), lse(DType::kF32, {1, h, c});
      Tensor o1(dt, {1, c, h, d}), lse1(DType::kF32, {1, h, c});
      run(ops::kAttentionFwd, name, dt, {&in.q, &k0, &v0, &none}, {&o, &lse}, &first);
      run(ops::kAttentionFwd, name, dt, {&in.q, &k1, &v1, &none}, {&o1, &lse1}, &second);
      run_ref(ops::kAttentionMerge, dt, {&o1, &lse1}, {&o, &lse});
      std::string what = std::string(name) + " merged blocks, dropout " + std::to_string(p);

      // The whole row in one call: forward and gradients, then each block's share.
      Tensor wo(dt, {1, c, h, d}), wlse(DType::kF32, {1, h, c});
      run(ops::kAttentionFwd, name, dt, {&in.q, &in.k, &in.v, &none}, {&wo, &wlse}, &causal);
      if (p == 0.0f) {  // and the f64 oracle
        std::vector<double> eo, ref_lse;
        naive_attention(whole, in, scale, eo, ref_lse);
        expect_close(o, eo, dt, what + " O");
        expect_close(lse, ref_lse, DType::kF32, what + " lse");
      }
      expect_close(o.values(), wo.values(), tolerance(dt), what + " O against one call");
      expect_close(lse.values(), wlse.values(), tolerance(DType::kF32),
                   what + " lse against one call");
      Tensor dout = Tensor::random(dt, {1, c, h, d}, rng);
      Tensor dq(dt, {1, c, h, d}), dk(dt, {1, 2 * c, g, d}), dv(dt, {1, 2 * c, g, d});
      run(ops::kAttentionBwd, name, dt, {&dout, &in.q, &in.k, &in.v, &wo, &wlse, &none},
          {&dq, &dk, &dv}, &causal);
      Tensor dq0(dt, {1, c, h, d}), dk0(dt, {1, c, g, d}), dv0(dt, {1, c, g, d});
      Tensor dq1(dt, {1, c, h, d}), dk1(dt, {1, c, g, d}), dv1(dt, {1, c, g, d});
      run(ops::kAttentionBwd, name, dt, {&dout, &in.q, &k0, &v0, &o, &lse, &none},
          {&dq0, &dk0, &dv0}, &first);
      run(ops::kAttentionBwd, name, dt, {&dout, &in.q, &k1, &v1, &o, &lse, &none},
          {&dq1, &dk1, &dv1}, &second);
      std::vector<double> dq_sum = dq0.values(), dk_all = dk0.values(), dv_all = dv0.values();
      for (size_t i = 0; i < dq_sum.size(); ++i) dq_sum[i] += dq1.get(static_cast<int64_t>(i));
      for (double x : dk1.values()) dk_all.push_back(x);
      for (double x : dv1.values()) dv_all.push_back(x);
      expect_close(dq_sum, dq.values(), tolerance(dt), what + " dQ (sum of the shares)");
      expect_close(dk_all, dk.values(), tolerance(dt), what + " dK");
      expect_close(dv_all, dv.values(), tolerance(dt), what + " dV");
    }
  // A block that does not fit its whole is refused by name.
  std::mt19937 rng(8);
  AttnInputs in = make_inputs(whole, dt, rng);
  Tensor none, o(dt, {1, c, h, d}), lse(DType::kF32, {1, h, c});
  const ops::AttentionBlockAttrs outside{{1.0f, 1, 0.0f, 0, 0}, 1, 0, c, 2 * c};
  CallHolder call({&in.q, &in.k, &in.v, &none}, {&o, &lse}, &outside);
  std::string message;
  try {
    ::loom::op_checks::check_attention_fwd(&call.call, false, DeviceType::kCpu);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("must lie within the whole"), std::string::npos) << message;
}

// attention_merge's edge rows: a block with no visible key (lse_part = -inf) leaves the
// row alone; a row with nothing so far (lse = -inf) takes the block's.
TEST(AttentionMerge, RowsWithoutVisibleKeys) {
  const DType dt = DType::kF32;
  Tensor o(dt, {1, 2, 1, 2});
  Tensor lse(DType::kF32, {1, 1, 2}), part(dt, {1, 2, 1, 2}), lse_part(DType::kF32, {1, 1, 2});
  const double o0[] = {1, 2, 3, 4}, p0[] = {5, 6, 7, 8};
  for (int64_t i = 0; i < 4; ++i) o.set(i, o0[i]), part.set(i, p0[i]);
  lse.set(0, 0.5), lse.set(1, -INFINITY);            // row 0 has a result, row 1 none
  lse_part.set(0, -INFINITY), lse_part.set(1, 1.5);  // the block sees nothing for row 0
  run_ref(ops::kAttentionMerge, dt, {&part, &lse_part}, {&o, &lse});
  expect_close(o, {1, 2, 7, 8}, dt, "merged O");
  expect_close(lse, {0.5, 1.5}, DType::kF32, "merged lse");
}

// Key segment ids (attention_fwd input [4], attention_bwd [7]): queries and keys of
// different lengths, each with their documents; the reference against the f64 oracle and
// the fast kernels against the reference, forward and backward.
TEST_P(AttentionTest, KeySegmentIdsMaskAcrossDifferentLengths) {
  std::mt19937 rng(12);
  DType dt = GetParam();
  for (const AttnCase& c :
       {AttnCase{2, 6, 10, 3, 1, 5, true, true}, AttnCase{1, 9, 4, 2, 2, 4, false, true},
        AttnCase{1, 70, 70, 2, 1, 8, true, true}}) {
    AttnInputs in = make_inputs(c, dt, rng);
    std::vector<int32_t> ids(c.b * c.s);
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t k = 0; k < c.s; ++k)
        ids[b * c.s + k] = static_cast<int32_t>((k * (2 + b)) / c.s);
    in.kseg = Tensor::i32({c.b, c.s}, ids);
    float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    ops::AttentionAttrs at{scale, c.causal, 0.0f, 0, 0};
    Tensor o(dt, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
    run_ref(ops::kAttentionFwd, dt, {&in.q, &in.k, &in.v, &in.seg, &in.kseg}, {&o, &lse}, &at);
    std::vector<double> eo, ref_lse;
    naive_attention(c, in, scale, eo, ref_lse);
    expect_close(o, eo, dt, "key segments O " + describe(c));
    expect_close(lse, ref_lse, DType::kF32, "key segments lse " + describe(c));
    expect_fast_matches_ref(
        ops::kAttentionFwd, dt, {in.q, in.k, in.v, in.seg, in.kseg},
        {Tensor(dt, {c.b, c.t, c.h, c.d}), Tensor(DType::kF32, {c.b, c.h, c.t})}, &at,
        "key segments " + describe(c));
    Tensor dout = Tensor::random(dt, {c.b, c.t, c.h, c.d}, rng);
    expect_fast_matches_ref(ops::kAttentionBwd, dt,
                            {dout, in.q, in.k, in.v, o, lse, in.seg, in.kseg},
                            {Tensor(dt, {c.b, c.t, c.h, c.d}), Tensor(dt, {c.b, c.s, c.g, c.d}),
                             Tensor(dt, {c.b, c.s, c.g, c.d})},
                            &at, "key segments " + describe(c));
  }
  // Key ids without query ids are refused by name.
  const AttnCase c{1, 4, 4, 1, 1, 2, false, false};
  AttnInputs in = make_inputs(c, DType::kF32, rng);
  Tensor kseg = Tensor::i32({1, 4}, {0, 0, 1, 1}), none;
  const ops::AttentionAttrs plain{1.0f, 0, 0.0f, 0, 0};
  Tensor o(DType::kF32, {1, 4, 1, 2}), lse(DType::kF32, {1, 1, 4});
  Status st = call_kernel(ops::kAttentionFwd, "cpu.ref", DType::kF32,
                          {&in.q, &in.k, &in.v, &none, &kseg}, {&o, &lse}, &plain);
  EXPECT_NE(st.code, Code::kOk);
  status_release(&st);
}

// attention_merge's fast kernel against the reference, every dtype, with rows that have no
// result yet and rows whose block sees nothing.
TEST_P(AttentionTest, FastMergeMatchesReference) {
  std::mt19937 rng(11);
  DType dt = GetParam();
  const int64_t b = 2, t = 9, h = 3, d = 5;
  Tensor lse = Tensor::random(DType::kF32, {b, h, t}, rng, -3, 3);
  Tensor lse_part = Tensor::random(DType::kF32, {b, h, t}, rng, -3, 3);
  lse.set(4, -INFINITY);
  lse_part.set(7, -INFINITY);
  expect_fast_matches_ref(ops::kAttentionMerge, dt,
                          {Tensor::random(dt, {b, t, h, d}, rng), lse_part},
                          {Tensor::random(dt, {b, t, h, d}, rng), lse});
}

TEST(AttentionGradients, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  for (AttnCase c :
       {AttnCase{1, 4, 4, 2, 1, 3, true, false}, AttnCase{1, 2, 5, 2, 2, 2, false, false},
        AttnCase{1, 5, 5, 2, 1, 2, true, true}}) {
    AttnInputs in = make_inputs(c, DType::kF32, rng);
    ops::AttentionAttrs at{0.6f, c.causal, 0.0f, 0, 0};
    std::vector<double> w = random_weights(c.b * c.t * c.h * c.d, rng);
    auto forward = [&] {
      Tensor o(DType::kF32, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
      run_ref(ops::kAttentionFwd, DType::kF32, {&in.q, &in.k, &in.v, &in.seg}, {&o, &lse}, &at);
      return o.values();
    };
    Tensor o(DType::kF32, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
    run_ref(ops::kAttentionFwd, DType::kF32, {&in.q, &in.k, &in.v, &in.seg}, {&o, &lse}, &at);
    Tensor dout(DType::kF32, {c.b, c.t, c.h, c.d});
    for (int64_t i = 0; i < dout.numel(); ++i) dout.set(i, w[i]);
    Tensor dq(DType::kF32, {c.b, c.t, c.h, c.d}), dk(DType::kF32, {c.b, c.s, c.g, c.d});
    Tensor dv(DType::kF32, {c.b, c.s, c.g, c.d});
    run_ref(ops::kAttentionBwd, DType::kF32, {&dout, &in.q, &in.k, &in.v, &o, &lse, &in.seg},
            {&dq, &dk, &dv}, &at);
    expect_close(dq.values(), numeric_grad(in.q, w, forward), fd_tolerance(), "dQ " + describe(c));
    expect_close(dk.values(), numeric_grad(in.k, w, forward), fd_tolerance(), "dK " + describe(c));
    expect_close(dv.values(), numeric_grad(in.v, w, forward), fd_tolerance(), "dV " + describe(c));
  }
}

// (B, X, H, D) -> (B, H, X, D) with key/value heads repeated to H (head-major for gemm).
Tensor head_major(const Tensor& x, int64_t b, int64_t n, int64_t heads, int64_t h, int64_t d) {
  Tensor y(DType::kF32, {b, h, n, d});
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < d; ++j)
          y.set(((bi * h + hi) * n + i) * d + j,
                x.get(((bi * n + i) * heads + hi / (h / heads)) * d + j));
  return y;
}

TEST(AttentionDropout, FusedEqualsReferenceOpComposition) {
  std::mt19937 rng(4);
  AttnCase c{2, 37, 37, 4, 2, 8, true, false};
  AttnInputs in = make_inputs(c, DType::kF32, rng);
  ops::AttentionAttrs at{0.35f, 1, 0.3f, 0xfeedbeefcafeull, 12345};
  Tensor o(DType::kF32, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
  run(ops::kAttentionFwd, "cpu.fast", DType::kF32, {&in.q, &in.k, &in.v, &in.seg}, {&o, &lse}, &at);

  // S = Q K^T per (b, h); P = masked_softmax(scale S); Pd = dropout(P); O = Pd V.
  Tensor qh = head_major(in.q, c.b, c.t, c.h, c.h, c.d),
         kh = head_major(in.k, c.b, c.s, c.g, c.h, c.d);
  Tensor vh = head_major(in.v, c.b, c.s, c.g, c.h, c.d);
  Tensor scores(DType::kF32, {c.b, c.h, c.t, c.s}), probs(DType::kF32, {c.b, c.h, c.t, c.s});
  ops::GemmAttrs qk{0, 1, 1.0f, 0.0f}, pv{0, 0, 1.0f, 0.0f};
  run_ref(ops::kGemm, DType::kF32, {&qh, &kh}, {&scores}, &qk);
  ops::SoftmaxAttrs sm{at.scale, 1};
  Tensor no_seg;
  run_ref(ops::kMaskedSoftmaxFwd, DType::kF32, {&scores, &no_seg}, {&probs}, &sm);
  ops::DropoutAttrs dr{at.dropout_p, at.key, at.counter};
  Tensor dropped(DType::kF32, {c.b, c.h, c.t, c.s});
  run_ref(ops::kDropoutFwd, DType::kF32, {&probs}, {&dropped}, &dr);
  Tensor oh(DType::kF32, {c.b, c.h, c.t, c.d});
  run_ref(ops::kGemm, DType::kF32, {&dropped, &vh}, {&oh}, &pv);
  int64_t zeros = 0;
  for (int64_t i = 0; i < dropped.numel(); ++i)
    zeros += dropped.get(i) == 0.0 && probs.get(i) != 0.0;
  EXPECT_GT(zeros, 0) << "dropout dropped nothing";
  std::vector<double> expected(o.numel());
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t t = 0; t < c.t; ++t)
        for (int64_t j = 0; j < c.d; ++j)
          expected[((b * c.t + t) * c.h + h) * c.d + j] =
              oh.get(((b * c.h + h) * c.t + t) * c.d + j);
  expect_close(o, expected, DType::kF32, "fused attention with dropout vs op composition");
}

// ---- masked_softmax --------------------------------------------------------------------

class MaskedSoftmaxTest : public ::testing::TestWithParam<DType> {};

TEST_P(MaskedSoftmaxTest, ReferenceMatchesF64AndFastMatchesReference) {
  std::mt19937 rng(5);
  DType dt = GetParam();
  for (AttnCase c : kOracleCases) {
    for (int64_t sk : {c.s, int64_t{65}}) {
      if (c.segments && sk != c.t) continue;
      c.s = sk;
      Tensor s = Tensor::random(dt, {c.b, c.h, c.t, c.s}, rng, -4, 4);
      AttnInputs in = make_inputs(c, dt, rng);
      ops::SoftmaxAttrs at{0.8f, c.causal};
      Tensor p(dt, {c.b, c.h, c.t, c.s});
      run_ref(ops::kMaskedSoftmaxFwd, dt, {&s, &in.seg}, {&p}, &at);
      std::vector<double> expected(p.numel());
      for (int64_t r = 0; r < c.b * c.h * c.t; ++r) {
        int64_t b = r / (c.h * c.t), t = r % c.t;
        double m = -INFINITY, sum = 0;
        for (int64_t k = 0; k < c.s; ++k)
          if (!masked(c, in.seg, b, t, k)) m = std::max(m, 0.8 * s.get(r * c.s + k));
        for (int64_t k = 0; k < c.s; ++k)
          if (!masked(c, in.seg, b, t, k)) sum += std::exp(0.8 * s.get(r * c.s + k) - m);
        for (int64_t k = 0; k < c.s; ++k)
          expected[r * c.s + k] =
              masked(c, in.seg, b, t, k) ? 0.0 : std::exp(0.8 * s.get(r * c.s + k) - m) / sum;
      }
      expect_close(p, expected, dt, "masked_softmax " + describe(c));
      expect_fast_matches_ref(ops::kMaskedSoftmaxFwd, dt, {s, in.seg},
                              {Tensor(dt, {c.b, c.h, c.t, c.s})}, &at, describe(c));
      Tensor dp = Tensor::random(dt, {c.b, c.h, c.t, c.s}, rng);
      expect_fast_matches_ref(ops::kMaskedSoftmaxBwd, dt, {dp, p},
                              {Tensor(dt, {c.b, c.h, c.t, c.s})}, &at, describe(c));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MaskedSoftmaxTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// A NaN score where it is visible makes its whole row NaN (never a quiet row of zeros, which
// would hide a diverging run); where the mask hides it, it changes nothing. The same on
// every kernel and device.
TEST(MaskedSoftmaxNaN, AVisibleNaNPoisonsItsRowOnly) {
  std::mt19937 rng(7);
  for (DType dt : float_dtypes()) {
    Tensor s = Tensor::random(dt, {1, 1, 3, 3}, rng, -2, 2), no_seg;
    s.set(0 * 3 + 2, NAN);  // row 0 sees key 0 only (causal): hidden
    s.set(1 * 3 + 1, NAN);  // row 1 sees keys 0 and 1: visible
    ops::SoftmaxAttrs at{1.0f, 1};
    Tensor p(dt, {1, 1, 3, 3});
    run_ref(ops::kMaskedSoftmaxFwd, dt, {&s, &no_seg}, {&p}, &at);
    std::string what = std::string("masked_softmax with NaN scores ") + dtype_name(dt);
    EXPECT_EQ(p.get(0), 1.0) << what;
    EXPECT_EQ(p.get(1), 0.0) << what;
    EXPECT_EQ(p.get(2), 0.0) << what;
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(std::isnan(p.get(3 + k))) << what << ", key " << k;
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(std::isfinite(p.get(6 + k))) << what << ", key " << k;
    expect_fast_matches_ref(ops::kMaskedSoftmaxFwd, dt, {s, no_seg}, {Tensor(dt, {1, 1, 3, 3})},
                            &at, what);
  }
}

TEST(MaskedSoftmaxGradient, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(6);
  Tensor s = Tensor::random(DType::kF32, {1, 2, 3, 4}, rng, -2, 2), no_seg;
  ops::SoftmaxAttrs at{0.7f, 1};
  std::vector<double> w = random_weights(24, rng);
  auto forward = [&] {
    Tensor p(DType::kF32, {1, 2, 3, 4});
    run_ref(ops::kMaskedSoftmaxFwd, DType::kF32, {&s, &no_seg}, {&p}, &at);
    return p.values();
  };
  Tensor p(DType::kF32, {1, 2, 3, 4}), dp(DType::kF32, {1, 2, 3, 4}), ds(DType::kF32, {1, 2, 3, 4});
  run_ref(ops::kMaskedSoftmaxFwd, DType::kF32, {&s, &no_seg}, {&p}, &at);
  for (int i = 0; i < 24; ++i) dp.set(i, w[i]);
  run_ref(ops::kMaskedSoftmaxBwd, DType::kF32, {&dp, &p}, {&ds}, &at);
  expect_close(ds.values(), numeric_grad(s, w, forward), fd_tolerance(), "masked_softmax_bwd");
}

TEST(AttentionErrors, HeadsNotMultipleOfGroupsNamesOp) {
  Tensor q(DType::kF32, {1, 4, 3, 8}), k(DType::kF32, {1, 4, 2, 8}), v(DType::kF32, {1, 4, 2, 8});
  Tensor none, o(DType::kF32, {1, 4, 3, 8}), lse(DType::kF32, {1, 3, 4});
  ops::AttentionAttrs at{0.3f, 0, 0.0f, 0, 0};
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    const KernelDesc& kd = kernel(ops::kAttentionFwd, DType::kF32, name);
    CallHolder h({&q, &k, &v, &none}, {&o, &lse}, &at);
    EXPECT_FALSE(kd.supports(&h.call));
    Status s = kd.fn(&h.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument);
    std::string msg = take_message(&s);
    EXPECT_NE(
        msg.find("attention_fwd: query heads H = 3 must be a multiple of key/value heads G = 2"),
        std::string::npos)
        << msg;
  }
}

TEST(AttentionCost, CausalCountsVisiblePairs) {
  Tensor q(DType::kBF16, {2, 4, 2, 8}), k(DType::kBF16, {2, 4, 1, 8}),
      v(DType::kBF16, {2, 4, 1, 8});
  Tensor none, o(DType::kBF16, {2, 4, 2, 8}), lse(DType::kF32, {2, 2, 4});
  ops::AttentionAttrs at{0.3f, 1, 0.0f, 0, 0};
  CallHolder h({&q, &k, &v, &none}, {&o, &lse}, &at);
  OpCost cost{};
  Status s = kernel(ops::kAttentionFwd, DType::kBF16, "cpu.fast").cost(&h.call, &cost);
  ASSERT_EQ(s.code, Code::kOk) << take_message(&s);
  EXPECT_EQ(cost.flops, 4.0 * (1 + 2 + 3 + 4) * 2 * 2 * 8);  // B H pairs D
}

// ---- Every CUDA kernel of attention, each by name ------------------------------------------
// The harness above runs the highest-priority CUDA kernel only (cuDNN's "cuda.cudnn", which
// falls back to loom's "cuda" per call); here each CUDA kernel of attention_fwd and
// attention_bwd runs by itself on shapes that loom's tensor-core kernels and cuDNN both take
// (bf16 and f16, D 64 and 128, T and S above 64, GQA, causal with T != S), and on calls that
// cuda.cudnn must hand back to loom's kernel (dropout, causal with T > S), against cpu.ref at
// the dtype's tolerance, with the achieved errors and what cuDNN did printed. The backward
// takes cpu.ref's O and lse (attention_bwd accepts any forward's). Without a GPU it skips
// before computing anything.

struct CudaAttnCase {
  AttnCase c;
  float dropout_p;
  bool cudnn_expected;  // on sm_90 cuDNN must run it (false: it may decline, or must)
  bool cudnn_declines;  // cuda.cudnn must hand it to loom's kernel
};

::loom::kernels::testing::DeviceBackend* cuda_device(std::string* why) {
  for (auto* b : ::loom::kernels::testing::device_backends())
    if (std::string(b->name()) == "cuda") return b->available(why) ? b : nullptr;
  *why = "no CUDA backend linked";
  return nullptr;
}

std::vector<KernelDesc> cuda_kernels_of(const char* op, DType dt) {
  static const std::vector<KernelDesc> all = [] {
    std::vector<KernelDesc> v;
    ::loom::kernels::cuda::add_all_kernels(v);
    return v;
  }();
  std::vector<KernelDesc> out;
  for (const KernelDesc& k : all)
    if (std::string(k.op) == op && k.dtype == dt) out.push_back(k);
  return out;
}

// Runs every CUDA kernel of `op` on the call, compares each output with `expected` and says
// whether cuDNN ran it (cuda.cudnn only), checking that against the case's expectation.
void every_cuda_kernel(::loom::kernels::testing::DeviceBackend& be, const char* op, DType dt,
                       std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                       const std::vector<Tensor>& expected, const ops::AttentionAttrs& at,
                       const CudaAttnCase& cc, bool hopper, const std::string& what) {
  std::vector<KernelDesc> kernels = cuda_kernels_of(op, dt);
  ASSERT_GE(kernels.size(), 2u) << op << " " << dtype_name(dt)
                                << ": expected loom's and cuDNN's CUDA kernels";
  for (const KernelDesc& k : kernels) {
    const bool cudnn = std::string(k.name) == ::loom::kernels::cuda::kCudnnAttentionName;
    const auto before = ::loom::kernels::cuda::cudnn_attention_counters();
    std::string label = std::string(op) + " " + dtype_name(dt) + " " + k.name + " " + what;
    std::vector<Tensor> got = run_on_device(be, k, inputs, outputs, &at, label);
    if (cudnn) {
      const auto after = ::loom::kernels::cuda::cudnn_attention_counters();
      const bool ran = after.cudnn_calls > before.cudnn_calls;
      std::printf("[cudnn] %s: %s\n", label.c_str(),
                  ran ? "ran on cuDNN" : ("fell back: " + after.last_decline).c_str());
      if (cc.cudnn_declines) {
        EXPECT_FALSE(ran) << label << ": cuDNN must decline this call";
      }
      if (cc.cudnn_expected && hopper) {
        EXPECT_TRUE(ran) << label << ": " << after.last_decline;
      }
    }
    if (got.empty()) continue;
    for (size_t i = 0; i < got.size(); ++i) {
      std::string o = label + " output " + std::to_string(i);
      report_error(got[i].values(), expected[i].values(), o);
      expect_close(got[i], expected[i].values(), dt, o);
    }
  }
}

TEST(AttentionCuda, EveryKernelMatchesReferenceOnTensorCoreShapes) {
  std::string why;
  ::loom::kernels::testing::DeviceBackend* be = cuda_device(&why);
  if (be == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  int cc_major = 0, cc_minor = 0;
  cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, 0);
  const bool hopper = cc_major == 9 && cc_minor == 0;
  std::printf("[cudnn] runtime version %lld, device sm_%d%d\n",
              static_cast<long long>(::loom::kernels::cuda::cudnn_runtime_version()), cc_major,
              cc_minor);
  const std::vector<CudaAttnCase> cases = {
      {{2, 128, 128, 4, 2, 64, false, false}, 0.0f, true, false},
      {{2, 128, 128, 4, 2, 64, true, false}, 0.0f, true, false},
      {{1, 192, 192, 4, 4, 128, false, false}, 0.0f, true, false},
      {{1, 128, 192, 4, 2, 128, true, false}, 0.0f, false, false},  // bottom-right, T < S
      {{1, 128, 192, 4, 2, 64, false, false}, 0.0f, true, false},
      {{1, 128, 128, 4, 2, 64, true, false}, 0.1f, false, true},  // dropout: loom's kernel
      {{1, 192, 128, 4, 2, 64, true, false}, 0.0f, false, true},  // T > S: loom's kernel
  };
  std::mt19937 rng(7);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (const CudaAttnCase& cc : cases) {
      const AttnCase& c = cc.c;
      AttnInputs in = make_inputs(c, dt, rng);
      ops::AttentionAttrs at{1.0f / std::sqrt(static_cast<float>(c.d)), c.causal, cc.dropout_p, 777,
                             5};
      std::string what = describe(c) + (cc.dropout_p > 0 ? " dropout" : "");
      Tensor o(dt, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
      run_ref(ops::kAttentionFwd, dt, {&in.q, &in.k, &in.v, &in.seg}, {&o, &lse}, &at);
      std::vector<Tensor> fwd_in = {in.q, in.k, in.v, in.seg};
      every_cuda_kernel(*be, ops::kAttentionFwd, dt, fwd_in,
                        {Tensor(dt, {c.b, c.t, c.h, c.d}), Tensor(DType::kF32, {c.b, c.h, c.t})},
                        {o, lse}, at, cc, hopper, what);
      Tensor dout = Tensor::random(dt, {c.b, c.t, c.h, c.d}, rng);
      Tensor dq(dt, {c.b, c.t, c.h, c.d}), dk(dt, {c.b, c.s, c.g, c.d}),
          dv(dt, {c.b, c.s, c.g, c.d});
      run_ref(ops::kAttentionBwd, dt, {&dout, &in.q, &in.k, &in.v, &o, &lse, &in.seg},
              {&dq, &dk, &dv}, &at);
      std::vector<Tensor> bwd_in = {dout, in.q, in.k, in.v, o, lse, in.seg};
      every_cuda_kernel(*be, ops::kAttentionBwd, dt, bwd_in,
                        {Tensor(dt, {c.b, c.t, c.h, c.d}), Tensor(dt, {c.b, c.s, c.g, c.d}),
                         Tensor(dt, {c.b, c.s, c.g, c.d})},
                        {dq, dk, dv}, at, cc, hopper, what);
    }
}

// Without a device the cuDNN kernels still register, above loom's, for bf16 and f16 only.
TEST(AttentionCuda, CudnnKernelsRegisterAboveLoomsOwn) {
  for (const char* op : {ops::kAttentionFwd, ops::kAttentionBwd})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      int32_t own = -1, cudnn = -1;
      for (const KernelDesc& k : cuda_kernels_of(op, dt)) {
        if (std::string(k.name) == "cuda") own = k.priority;
        if (std::string(k.name) == ::loom::kernels::cuda::kCudnnAttentionName) cudnn = k.priority;
      }
      EXPECT_GE(own, 0) << op << " " << dtype_name(dt);
      if (dt == DType::kF32)
        EXPECT_EQ(cudnn, -1) << op << ": no cuDNN kernel for f32";
      else
        EXPECT_GT(cudnn, own) << op << " " << dtype_name(dt);
    }
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
