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

// Rows (b, t, h) of `buf` (B, T, H, W) from column `col` on, D wide: a strided (B, T, H, D)
// view, as fused_qkv_views makes of a fused QKV projection (W = 3 D there; here W also has
// spare columns that no kernel may touch).
TensorView part_view(Tensor& buf, int64_t col, int64_t d) {
  TensorView v = buf.view();
  v.data = static_cast<char*>(v.data) + col * dtype_size(v.dtype);
  v.shape[3] = d;
  return v;  // the strides stay buf's: (T H W, H W, W, 1)
}

// Runs kernel k on views (strided ones included); returns the status's code. A device
// kernel's workspace comes from `be` (freed by the caller through `owned`); a kernel that
// declines the call is a test failure.
Code run_views(const KernelDesc& k, std::vector<TensorView> in, std::vector<TensorView> out,
               const ops::AttentionAttrs& at, const std::string& what,
               ::loom::kernels::testing::DeviceBackend* be = nullptr,
               std::vector<void*>* owned = nullptr) {
  OpCall call{};
  call.struct_size = sizeof(OpCall);
  call.inputs = in.data(), call.num_inputs = static_cast<int32_t>(in.size());
  call.outputs = out.data(), call.num_outputs = static_cast<int32_t>(out.size());
  call.attrs = &at, call.attrs_size = sizeof(at);
  if (be != nullptr && k.workspace != nullptr) {
    call.workspace_bytes = k.workspace(&call);
    call.workspace = be->scratch(static_cast<size_t>(call.workspace_bytes));
    owned->push_back(call.workspace);
  }
  if (k.supports != nullptr && !k.supports(&call)) {
    ADD_FAILURE() << what << ": kernel " << k.name << " declines strided views";
    return Code::kUnimplemented;
  }
  Status st = k.fn(&call);
  const Code code = st.code;
  EXPECT_EQ(code, Code::kOk) << what << ": kernel " << k.name << ": " << take_message(&st);
  status_release(&st);
  return code;
}

// Q, K, V read in place from strided views of wider buffers (a fused QKV tensor for MHA,
// two buffers for GQA) and dQ, dK, dV written into such views: the results equal those of
// the same kernel on packed copies exactly (the same values in the same order), and the
// buffers' spare columns are never written. Every dtype, both CPU kernels.
TEST_P(AttentionTest, StridedViewsEqualPackedCalls) {
  std::mt19937 rng(21);
  const DType dt = GetParam();
  for (const char* name : {"cpu.ref", "cpu.fast"})
    for (const AttnCase& c :
         {AttnCase{2, 9, 9, 3, 3, 5, true, false}, AttnCase{1, 70, 70, 4, 2, 8, true, true},
          AttnCase{2, 6, 11, 2, 1, 4, false, false}}) {
      const bool mha = c.h == c.g && c.t == c.s;
      const int64_t wq = mha ? 3 * c.d + 2 : c.d + 3, wkv = 2 * c.d + 1;  // spare columns
      Tensor xq = Tensor::random(dt, {c.b, c.t, c.h, wq}, rng, -2, 2);
      Tensor xkv = Tensor::random(dt, {c.b, c.s, c.g, wkv}, rng, -2, 2);
      Tensor& kv_buf = mha ? xq : xkv;
      TensorView q = part_view(xq, 0, c.d);
      TensorView k = part_view(kv_buf, mha ? c.d : 0, c.d);
      TensorView v = part_view(kv_buf, mha ? 2 * c.d : c.d, c.d);
      // Packed copies of the same values.
      AttnInputs in{Tensor(dt, {c.b, c.t, c.h, c.d}), Tensor(dt, {c.b, c.s, c.g, c.d}),
                    Tensor(dt, {c.b, c.s, c.g, c.d}), Tensor(), Tensor()};
      auto gather = [&](const TensorView& from, const Tensor& buf, Tensor& to) {
        const int64_t col =
            (static_cast<const char*>(from.data) - static_cast<const char*>(buf.raw())) /
            static_cast<int64_t>(dtype_size(dt));
        const int64_t rows = to.numel() / c.d, w = from.strides[2];
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < c.d; ++i) to.set(r * c.d + i, buf.get(r * w + col + i));
      };
      gather(q, xq, in.q), gather(k, kv_buf, in.k), gather(v, kv_buf, in.v);
      if (c.segments) in.seg = make_inputs(c, dt, rng).seg;
      const ops::AttentionAttrs at{0.8f / std::sqrt(static_cast<float>(c.d)), c.causal, 0.2f, 77,
                                   5};
      const std::string what = std::string(name) + " " + describe(c) + " " + dtype_name(dt);

      Tensor o(dt, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
      run(ops::kAttentionFwd, name, dt, {&in.q, &in.k, &in.v, &in.seg}, {&o, &lse}, &at);
      Tensor o2(dt, {c.b, c.t, c.h, c.d}), lse2(DType::kF32, {c.b, c.h, c.t});
      ASSERT_EQ(run_views(kernel(ops::kAttentionFwd, dt, name), {q, k, v, in.seg.view()},
                          {o2.view(), lse2.view()}, at, what),
                Code::kOk);
      EXPECT_EQ(o2.values(), o.values()) << what << ": O from strided views";
      EXPECT_EQ(lse2.values(), lse.values()) << what << ": lse from strided views";

      Tensor dout = Tensor::random(dt, {c.b, c.t, c.h, c.d}, rng);
      Tensor dq(dt, {c.b, c.t, c.h, c.d}), dk(dt, {c.b, c.s, c.g, c.d}),
          dv(dt, {c.b, c.s, c.g, c.d});
      run(ops::kAttentionBwd, name, dt, {&dout, &in.q, &in.k, &in.v, &o, &lse, &in.seg},
          {&dq, &dk, &dv}, &at);
      // The gradients into views of buffers filled with a sentinel (1024: exact in every dtype).
      Tensor gq = Tensor::filled(dt, {c.b, c.t, c.h, wq}, 1024.0);
      Tensor gkv = Tensor::filled(dt, {c.b, c.s, c.g, wkv}, 1024.0);
      Tensor& gkv_buf = mha ? gq : gkv;
      TensorView vdq = part_view(gq, 0, c.d);
      TensorView vdk = part_view(gkv_buf, mha ? c.d : 0, c.d);
      TensorView vdv = part_view(gkv_buf, mha ? 2 * c.d : c.d, c.d);
      ASSERT_EQ(run_views(kernel(ops::kAttentionBwd, dt, name),
                          {dout.view(), q, k, v, o.view(), lse.view(), in.seg.view()},
                          {vdq, vdk, vdv}, at, what),
                Code::kOk);
      Tensor got_q(dt, {c.b, c.t, c.h, c.d}), got_k(dt, {c.b, c.s, c.g, c.d}),
          got_v(dt, {c.b, c.s, c.g, c.d});
      gather(vdq, gq, got_q), gather(vdk, gkv_buf, got_k), gather(vdv, gkv_buf, got_v);
      EXPECT_EQ(got_q.values(), dq.values()) << what << ": dQ into a strided view";
      EXPECT_EQ(got_k.values(), dk.values()) << what << ": dK into a strided view";
      EXPECT_EQ(got_v.values(), dv.values()) << what << ": dV into a strided view";
      // The spare columns keep the sentinel.
      int64_t touched = 0;
      for (Tensor* buf : {&gq, &gkv}) {
        const int64_t w = buf->shape().back(),
                      used = buf == &gq ? (mha ? 3 * c.d : c.d) : (mha ? 0 : 2 * c.d);
        for (int64_t i = 0; i < buf->numel(); ++i)
          if (i % w >= used && buf->get(i) != 1024.0) ++touched;
      }
      EXPECT_EQ(touched, 0) << what << ": elements written outside the views";
    }
}

// A view whose rows are not packed (D stride 2) is refused by name.
TEST(AttentionErrors, RowsMustBePacked) {
  std::mt19937 rng(22);
  Tensor x = Tensor::random(DType::kF32, {1, 4, 2, 8}, rng);
  TensorView q = x.view();
  q.shape[3] = 4, q.strides[3] = 2;  // every other element
  Tensor k = Tensor::random(DType::kF32, {1, 4, 2, 4}, rng), v = k;
  Tensor o(DType::kF32, {1, 4, 2, 4}), lse(DType::kF32, {1, 2, 4}), none;
  std::vector<TensorView> in{q, k.view(), v.view(), none.view()}, out{o.view(), lse.view()};
  const ops::AttentionAttrs at{0.5f, 1, 0.0f, 0, 0};
  OpCall call{};
  call.struct_size = sizeof(OpCall);
  call.inputs = in.data(), call.num_inputs = 4, call.outputs = out.data(), call.num_outputs = 2;
  call.attrs = &at, call.attrs_size = sizeof(at);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    const KernelDesc& kd = kernel(ops::kAttentionFwd, DType::kF32, name);
    EXPECT_FALSE(kd.supports(&call)) << name;
    Status st = kd.fn(&call);
    EXPECT_EQ(st.code, Code::kInvalidArgument) << name;
    const std::string msg = take_message(&st);
    EXPECT_NE(msg.find("attention_fwd: input 0 (Q) of shape (1, 4, 2, 4) has stride 2 along its "
                       "last dimension: its rows must be packed (stride 1)"),
              std::string::npos)
        << msg;
  }
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

// True on device 0 of compute capability 9.0 (Hopper: where cuDNN's attention must run);
// its major and minor into the pointers when given.
bool device_is_sm90(int* major = nullptr, int* minor = nullptr) {
  int cc_major = 0, cc_minor = 0;
  cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != nullptr) *major = cc_major;
  if (minor != nullptr) *minor = cc_minor;
  return cc_major == 9 && cc_minor == 0;
}

TEST(AttentionCuda, EveryKernelMatchesReferenceOnTensorCoreShapes) {
  std::string why;
  ::loom::kernels::testing::DeviceBackend* be = cuda_device(&why);
  if (be == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  int cc_major = 0, cc_minor = 0;
  const bool hopper = device_is_sm90(&cc_major, &cc_minor);
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

// Device memory holding a copy of `t` (freed by the caller through `owned`).
void* upload_tensor(::loom::kernels::testing::DeviceBackend& be, const Tensor& t,
                    std::vector<void*>& owned) {
  void* p = be.upload(t.raw(), static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
  owned.push_back(p);
  return p;
}

// A device view of rows (b, t, h) of the device copy `dev` of `buf` (B, T, H, W), from column
// `col` on, D wide (part_view on the device): strides (T H W, H W, W, 1).
TensorView device_part_view(Tensor& buf, void* dev, int64_t col, int64_t d) {
  TensorView v = part_view(buf, col, d);
  v.data = static_cast<char*>(dev) + col * dtype_size(v.dtype);
  v.device = Device{DeviceType::kCuda, 0};
  return v;
}

// StridedViewsEqualPackedCalls on the device, for every CUDA kernel (loom's "cuda" and
// cuDNN's "cuda.cudnn"): Q, K, V read from strided views of wider device buffers (one fused
// QKV buffer for MHA, two for GQA) and dQ, dK, dV written into such views give what the same
// kernel gives on packed copies, and never write the buffers' spare columns (a sentinel).
// Spare columns of 8 keep every row 16-byte aligned (loom's tensor-core kernels and cuDNN
// take the views); spare columns of 3 do not (both hand the call to loom's generic kernels,
// cuDNN with the decline "row stride that is not a multiple of 8 elements"). Bit for bit
// where the arithmetic is the same in both calls: loom's kernels on the same path, except the
// tensor-core backward's dQ, which f32 atomics sum in a varying order; the rest (cuDNN, which
// may pick another engine for other strides, and unaligned views that loom's generic kernels
// serve where the packed call took the tensor cores) at the dtype's tolerance.
TEST(AttentionCuda, StridedViewsEqualPackedCalls) {
  std::string why;
  ::loom::kernels::testing::DeviceBackend* be = cuda_device(&why);
  if (be == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  const bool hopper = device_is_sm90();
  std::mt19937 rng(23);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
    for (const AttnCase& c : {AttnCase{2, 128, 128, 4, 4, 64, true, false},
                              AttnCase{1, 96, 96, 2, 2, 128, false, false},
                              AttnCase{1, 128, 160, 4, 2, 64, false, false},
                              AttnCase{2, 70, 70, 3, 3, 40, true, false}})
      for (int64_t spare : {8, 3}) {
        const bool mha = c.h == c.g && c.t == c.s;
        const int64_t wq = mha ? 3 * c.d + spare : c.d + spare, wkv = 2 * c.d + spare;
        Tensor xq = Tensor::random(dt, {c.b, c.t, c.h, wq}, rng, -2, 2);
        Tensor xkv = Tensor::random(dt, {c.b, c.s, c.g, wkv}, rng, -2, 2);
        Tensor& kv_buf = mha ? xq : xkv;
        const int64_t k_col = mha ? c.d : 0, v_col = mha ? 2 * c.d : c.d;
        AttnInputs in{Tensor(dt, {c.b, c.t, c.h, c.d}), Tensor(dt, {c.b, c.s, c.g, c.d}),
                      Tensor(dt, {c.b, c.s, c.g, c.d}), Tensor(), Tensor()};
        // Rows of `buf` from column col on into the packed `to`.
        auto gather = [&](const Tensor& buf, int64_t col, Tensor& to) {
          const int64_t rows = to.numel() / c.d, w = buf.shape().back();
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < c.d; ++i) to.set(r * c.d + i, buf.get(r * w + col + i));
        };
        gather(xq, 0, in.q), gather(kv_buf, k_col, in.k), gather(kv_buf, v_col, in.v);
        const ops::AttentionAttrs at{1.0f / std::sqrt(static_cast<float>(c.d)), c.causal, 0.0f, 77,
                                     5};
        Tensor dout = Tensor::random(dt, {c.b, c.t, c.h, c.d}, rng);
        // loom's packed call takes the tensor cores (bf16, f16; D 64, 128), and so does the call
        // on views whose rows are 16-byte aligned; on the others, the generic kernels.
        const bool aligned = spare % 8 == 0;
        const bool tc_shapes = dt != DType::kF32 && (c.d == 64 || c.d == 128);
        const bool tensor_cores = tc_shapes && aligned, same_path = !tc_shapes || aligned;
        for (const char* op : {ops::kAttentionFwd, ops::kAttentionBwd})
          for (const KernelDesc& k : cuda_kernels_of(op, dt)) {
            const bool cudnn = std::string(k.name) == ::loom::kernels::cuda::kCudnnAttentionName;
            const std::string what = std::string(op) + " " + k.name + " " + describe(c) + " " +
                                     dtype_name(dt) + " spare " + std::to_string(spare);
            // The packed call: the forward's O and lse also feed both backward calls.
            Tensor o(dt, {c.b, c.t, c.h, c.d}), lse(DType::kF32, {c.b, c.h, c.t});
            run_ref(ops::kAttentionFwd, dt, {&in.q, &in.k, &in.v, &in.seg}, {&o, &lse}, &at);
            const bool fwd = std::string(op) == ops::kAttentionFwd;
            std::vector<Tensor> packed_in =
                fwd ? std::vector<Tensor>{in.q, in.k, in.v, in.seg}
                    : std::vector<Tensor>{dout, in.q, in.k, in.v, o, lse, in.seg};
            std::vector<Tensor> packed_out =
                fwd ? std::vector<Tensor>{Tensor(dt, {c.b, c.t, c.h, c.d}),
                                          Tensor(DType::kF32, {c.b, c.h, c.t})}
                    : std::vector<Tensor>{Tensor(dt, {c.b, c.t, c.h, c.d}),
                                          Tensor(dt, {c.b, c.s, c.g, c.d}),
                                          Tensor(dt, {c.b, c.s, c.g, c.d})};
            std::vector<Tensor> want = run_on_device(*be, k, packed_in, packed_out, &at, what);
            ASSERT_FALSE(want.empty()) << what;

            // The same call on views of device copies of the buffers.
            std::vector<void*> owned;
            void* dxq = upload_tensor(*be, xq, owned);
            void* dxkv = mha ? dxq : upload_tensor(*be, xkv, owned);
            TensorView q = device_part_view(xq, dxq, 0, c.d);
            TensorView kv = device_part_view(kv_buf, dxkv, k_col, c.d);
            TensorView vv = device_part_view(kv_buf, dxkv, v_col, c.d);
            auto packed_view = [&](Tensor& t) {
              TensorView v = t.view();
              v.device = Device{DeviceType::kCuda, 0};
              if (v.data != nullptr) v.data = upload_tensor(*be, t, owned);
              return v;
            };
            const auto before = ::loom::kernels::cuda::cudnn_attention_counters();
            std::vector<Tensor> got;
            int64_t touched = 0;
            if (fwd) {
              Tensor o2(dt, {c.b, c.t, c.h, c.d}), lse2(DType::kF32, {c.b, c.h, c.t});
              TensorView vo = packed_view(o2), vlse = packed_view(lse2);
              ASSERT_EQ(
                  run_views(k, {q, kv, vv, packed_view(in.seg)}, {vo, vlse}, at, what, be, &owned),
                  Code::kOk);
              be->download(o2.raw(), vo.data, o2.numel() * dtype_size(dt));
              be->download(lse2.raw(), vlse.data, lse2.numel() * 4);
              got = {o2, lse2};
            } else {
              // Gradient buffers of the inputs' shapes, filled with a sentinel (1024: exact in
              // every dtype).
              Tensor gq = Tensor::filled(dt, xq.shape(), 1024.0);
              Tensor gkv = Tensor::filled(dt, xkv.shape(), 1024.0);
              Tensor& gkv_buf = mha ? gq : gkv;
              void* dgq = upload_tensor(*be, gq, owned);
              void* dgkv = mha ? dgq : upload_tensor(*be, gkv, owned);
              ASSERT_EQ(run_views(k,
                                  {packed_view(dout), q, kv, vv, packed_view(o), packed_view(lse),
                                   packed_view(in.seg)},
                                  {device_part_view(gq, dgq, 0, c.d),
                                   device_part_view(gkv_buf, dgkv, k_col, c.d),
                                   device_part_view(gkv_buf, dgkv, v_col, c.d)},
                                  at, what, be, &owned),
                        Code::kOk);
              be->download(gq.raw(), dgq, gq.numel() * dtype_size(dt));
              if (!mha) be->download(gkv.raw(), dgkv, gkv.numel() * dtype_size(dt));
              Tensor dq(dt, {c.b, c.t, c.h, c.d}), dk(dt, {c.b, c.s, c.g, c.d}),
                  dv(dt, {c.b, c.s, c.g, c.d});
              gather(gq, 0, dq), gather(gkv_buf, k_col, dk), gather(gkv_buf, v_col, dv);
              got = {dq, dk, dv};
              for (Tensor* buf : {&gq, &gkv}) {
                const int64_t w = buf->shape().back(),
                              used = buf == &gq ? (mha ? 3 * c.d : c.d) : (mha ? 0 : 2 * c.d);
                for (int64_t i = 0; i < buf->numel(); ++i)
                  if (i % w >= used && buf->get(i) != 1024.0) ++touched;
              }
            }
            for (void* p : owned) be->release(p);
            EXPECT_EQ(touched, 0) << what << ": elements written outside the views";
            if (cudnn) {
              const auto after = ::loom::kernels::cuda::cudnn_attention_counters();
              const bool ran = after.cudnn_calls > before.cudnn_calls;
              std::printf("[cudnn] %s: %s\n", what.c_str(),
                          ran ? "ran on cuDNN" : ("fell back: " + after.last_decline).c_str());
              if (!aligned) {
                EXPECT_FALSE(ran) << what << ": cuDNN must decline unaligned rows";
              }
              if (aligned && hopper && dt != DType::kF32 && c.d % 8 == 0) {
                EXPECT_TRUE(ran) << what << ": " << after.last_decline;
              }
            }
            for (size_t i = 0; i < got.size(); ++i) {
              const std::string o_what = what + " output " + std::to_string(i);
              report_error(got[i].values(), want[i].values(), o_what + " (views vs packed)");
              const bool exact =  // i 0 of the backward: dQ
                  !cudnn && same_path && !(tensor_cores && !fwd && i == 0);
              if (exact)
                EXPECT_EQ(got[i].values(), want[i].values()) << o_what;
              else
                expect_close(got[i], want[i].values(), dt, o_what);
            }
          }
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
