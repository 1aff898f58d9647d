// The multi-latent attention layout ops (loom/ops/mla.h): mla_qkv, mla_qkv_bwd, mla_out,
// mla_out_bwd. Both CPU kernels against oracles written here from the header's index
// formulas (one output element at a time: exact, as the ops only copy), over odd shapes
// (H = 1, 3; dr = 0, 2, 4; dv < dn + dr and dv == dn + dr) in every float dtype; the
// backward ops as the exact transposes of the forward ones (<f(x), r> == <x, f^T(r)> in f64
// for every input / output pair); dkpe as the head sum; and the words of bad calls. The
// fast-vs-reference checks also run every device backend linked in (CUDA on a GPU machine).
#include <gmock/gmock.h>

#include <cmath>
#include <limits>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

using Vec = std::vector<double>;

struct MlaCase {
  int64_t b, t, h;
  int32_t dn, dr, dv;
  int64_t d() const { return dn + dr; }
  ops::MlaAttrs attrs() const { return {dn, dr, dv}; }
  std::string name() const {
    return "B " + std::to_string(b) + " T " + std::to_string(t) + " H " + std::to_string(h) +
           " dn " + std::to_string(dn) + " dr " + std::to_string(dr) + " dv " + std::to_string(dv);
  }
};

const std::vector<MlaCase>& cases() {
  static const std::vector<MlaCase> c = {
      {2, 3, 1, 4, 2, 3},  // H = 1, dv < D
      {1, 5, 3, 3, 4, 7},  // dv == D
      {2, 2, 3, 5, 0, 2},  // no rotary part
      {1, 1, 1, 1, 0, 1},  // the smallest
      {1, 4, 3, 2, 4, 6},  // dv == D, dr > dn
      {3, 2, 2, 6, 2, 8},  // dv == D
      {2, 3, 3, 4, 2, 1},  // dv == 1
  };
  return c;
}

// ---- Oracles: for every output element, the input element it is (or 0) -----------------

// Q, K, V (B, T, H, D) from q (B, T, H, dn + dr), kv (B, T, H, dn + dv), kpe (B, T, dr).
void qkv_oracle(const MlaCase& c, const Vec& q, const Vec& kv, const Vec& kpe, Vec& Q, Vec& K,
                Vec& V) {
  const int64_t D = c.d();
  Q.assign(c.b * c.t * c.h * D, 0.0);
  K = Q;
  V = Q;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t t = 0; t < c.t; ++t)
      for (int64_t h = 0; h < c.h; ++h)
        for (int64_t e = 0; e < D; ++e) {
          const int64_t o = ((b * c.t + t) * c.h + h) * D + e;
          const int64_t qrow = ((b * c.t + t) * c.h + h) * D;
          const int64_t kvrow = ((b * c.t + t) * c.h + h) * (c.dn + c.dv);
          // Q = [q_pe, q_nope]: q's channel dn + e for e < dr, else e - dr.
          Q[o] = e < c.dr ? q[qrow + c.dn + e] : q[qrow + (e - c.dr)];
          K[o] = e < c.dr ? kpe[(b * c.t + t) * c.dr + e] : kv[kvrow + (e - c.dr)];
          V[o] = e < c.dv ? kv[kvrow + c.dn + e] : 0.0;
        }
}

// dq, dkv, dkpe from dQ, dK, dV (the gradient, written as gathers per output element).
void qkv_bwd_oracle(const MlaCase& c, const Vec& dQ, const Vec& dK, const Vec& dV, Vec& dq,
                    Vec& dkv, Vec& dkpe) {
  const int64_t D = c.d(), rows = c.b * c.t * c.h;
  dq.assign(rows * D, 0.0);
  dkv.assign(rows * (c.dn + c.dv), 0.0);
  dkpe.assign(c.b * c.t * c.dr, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t e = 0; e < D; ++e)  // q's channel e sits in Q at e + dr (nope) or e - dn (pe)
      dq[r * D + e] = e < c.dn ? dQ[r * D + e + c.dr] : dQ[r * D + e - c.dn];
    for (int64_t e = 0; e < c.dn + c.dv; ++e)
      dkv[r * (c.dn + c.dv) + e] = e < c.dn ? dK[r * D + c.dr + e] : dV[r * D + e - c.dn];
  }
  for (int64_t bt = 0; bt < c.b * c.t; ++bt)
    for (int64_t j = 0; j < c.dr; ++j)
      for (int64_t h = 0; h < c.h; ++h) dkpe[bt * c.dr + j] += dK[(bt * c.h + h) * D + j];
}

Vec out_oracle(const MlaCase& c, const Vec& O) {
  Vec y;
  for (int64_t r = 0; r < c.b * c.t * c.h; ++r)
    for (int64_t e = 0; e < c.dv; ++e) y.push_back(O[r * c.d() + e]);
  return y;
}
Vec out_bwd_oracle(const MlaCase& c, const Vec& dY) {
  Vec dO;
  for (int64_t r = 0; r < c.b * c.t * c.h; ++r)
    for (int64_t e = 0; e < c.d(); ++e) dO.push_back(e < c.dv ? dY[r * c.dv + e] : 0.0);
  return dO;
}

// ---- Tensors of a case ------------------------------------------------------------------

struct Shapes {
  std::vector<int64_t> q, kv, kpe, full, v;
};
Shapes shapes(const MlaCase& c) {
  return {{c.b, c.t, c.h, c.d()},
          {c.b, c.t, c.h, c.dn + c.dv},
          {c.b, c.t, c.dr},
          {c.b, c.t, c.h, c.d()},
          {c.b, c.t, c.h, c.dv}};
}

// Outputs start as garbage, so that a kernel that skips an element (V's padding) fails.
Tensor garbage(DType dt, std::vector<int64_t> shape) {
  return Tensor::filled(dt, std::move(shape), 7.0);
}

void expect_exact(const Tensor& actual, const Vec& expected, const std::string& what) {
  expect_close(actual.values(), expected, Tolerance{0.0, 0.0}, what);
}

class MlaTest : public ::testing::TestWithParam<DType> {};

TEST_P(MlaTest, QkvMatchesOracleExactly) {
  const DType dt = GetParam();
  std::mt19937 rng(1);
  for (const MlaCase& c : cases()) {
    const Shapes s = shapes(c);
    const ops::MlaAttrs at = c.attrs();
    Tensor q = Tensor::random(dt, s.q, rng), kv = Tensor::random(dt, s.kv, rng),
           kpe = Tensor::random(dt, s.kpe, rng);
    Vec eQ, eK, eV;
    qkv_oracle(c, q.values(), kv.values(), kpe.values(), eQ, eK, eV);
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
      Tensor Q = garbage(dt, s.full), K = garbage(dt, s.full), V = garbage(dt, s.full);
      run(ops::kMlaQkv, name, dt, {&q, &kv, &kpe}, {&Q, &K, &V}, &at);
      const std::string w = std::string(name) + " " + dtype_name(dt) + " " + c.name();
      expect_exact(Q, eQ, "Q " + w);
      expect_exact(K, eK, "K " + w);
      expect_exact(V, eV, "V " + w);
    }
    expect_fast_matches_ref(ops::kMlaQkv, dt, {q, kv, kpe},
                            {garbage(dt, s.full), garbage(dt, s.full), garbage(dt, s.full)}, &at,
                            c.name());
  }
}

TEST_P(MlaTest, QkvBwdMatchesOracle) {
  const DType dt = GetParam();
  std::mt19937 rng(2);
  for (const MlaCase& c : cases()) {
    const Shapes s = shapes(c);
    const ops::MlaAttrs at = c.attrs();
    Tensor dQ = Tensor::random(dt, s.full, rng), dK = Tensor::random(dt, s.full, rng),
           dV = Tensor::random(dt, s.full, rng);
    // dV's padding channels are not read: NaN there must not reach any output.
    for (int64_t r = 0; r < c.b * c.t * c.h; ++r)
      for (int64_t e = c.dv; e < c.d(); ++e)
        dV.set(r * c.d() + e, std::numeric_limits<double>::quiet_NaN());
    Vec edq, edkv, edkpe;
    qkv_bwd_oracle(c, dQ.values(), dK.values(), dV.values(), edq, edkv, edkpe);
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
      Tensor dq = garbage(dt, s.q), dkv = garbage(dt, s.kv), dkpe = garbage(dt, s.kpe);
      run(ops::kMlaQkvBwd, name, dt, {&dQ, &dK, &dV}, {&dq, &dkv, &dkpe}, &at);
      const std::string w = std::string(name) + " " + dtype_name(dt) + " " + c.name();
      expect_exact(dq, edq, "dq " + w);
      expect_exact(dkv, edkv, "dkv " + w);
      // The head sum: f32 accumulation, then rounded to the dtype.
      expect_close(dkpe, edkpe, dt, "dkpe " + w);
    }
    expect_fast_matches_ref(ops::kMlaQkvBwd, dt, {dQ, dK, dV},
                            {garbage(dt, s.q), garbage(dt, s.kv), garbage(dt, s.kpe)}, &at,
                            c.name());
  }
}

TEST_P(MlaTest, OutAndOutBwdMatchOracleExactly) {
  const DType dt = GetParam();
  std::mt19937 rng(3);
  for (const MlaCase& c : cases()) {
    const Shapes s = shapes(c);
    const ops::MlaAttrs at = c.attrs();
    Tensor O = Tensor::random(dt, s.full, rng), dY = Tensor::random(dt, s.v, rng);
    const Vec eY = out_oracle(c, O.values()), edO = out_bwd_oracle(c, dY.values());
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
      const std::string w = std::string(name) + " " + dtype_name(dt) + " " + c.name();
      Tensor Y = garbage(dt, s.v), dO = garbage(dt, s.full);
      run(ops::kMlaOut, name, dt, {&O}, {&Y}, &at);
      run(ops::kMlaOutBwd, name, dt, {&dY}, {&dO}, &at);
      expect_exact(Y, eY, "Y " + w);
      expect_exact(dO, edO, "dO " + w);
    }
    expect_fast_matches_ref(ops::kMlaOut, dt, {O}, {garbage(dt, s.v)}, &at, c.name());
    expect_fast_matches_ref(ops::kMlaOutBwd, dt, {dY}, {garbage(dt, s.full)}, &at, c.name());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MlaTest, ::testing::ValuesIn(float_dtypes()), dtype_param_name);

// ---- The backward ops are the transposes ------------------------------------------------

double dot(const Tensor& a, const Tensor& b) {
  const Vec x = a.values(), y = b.values();
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}
Tensor zeros_like(const Tensor& t) { return Tensor(t.dtype(), t.shape()); }

// For every pair (input j of mla_qkv, output k): with only x_j nonzero and only r_k nonzero,
// <mla_qkv(x)_k, r_k> == <x_j, mla_qkv_bwd(r)_j>. In f32 the copies are exact and the f64
// products of f32 values are exact, so only the dkpe head sum rounds. dV's padding channels
// are not read, and V's are zero: r_V's padding is random and must not matter.
TEST(MlaTranspose, QkvBwdIsTheTransposeOfQkv) {
  const DType dt = DType::kF32;
  std::mt19937 rng(4);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
    for (const MlaCase& c : cases()) {
      const Shapes s = shapes(c);
      const ops::MlaAttrs at = c.attrs();
      const Tensor x[3] = {Tensor::random(dt, s.q, rng), Tensor::random(dt, s.kv, rng),
                           Tensor::random(dt, s.kpe, rng)};
      const Tensor r[3] = {Tensor::random(dt, s.full, rng), Tensor::random(dt, s.full, rng),
                           Tensor::random(dt, s.full, rng)};
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 3; ++k) {
          Tensor in[3] = {zeros_like(x[0]), zeros_like(x[1]), zeros_like(x[2])};
          in[j] = x[j];
          Tensor y[3] = {garbage(dt, s.full), garbage(dt, s.full), garbage(dt, s.full)};
          run(ops::kMlaQkv, name, dt, {&in[0], &in[1], &in[2]}, {&y[0], &y[1], &y[2]}, &at);
          Tensor g[3] = {zeros_like(r[0]), zeros_like(r[1]), zeros_like(r[2])};
          g[k] = r[k];
          Tensor dx[3] = {garbage(dt, s.q), garbage(dt, s.kv), garbage(dt, s.kpe)};
          run(ops::kMlaQkvBwd, name, dt, {&g[0], &g[1], &g[2]}, {&dx[0], &dx[1], &dx[2]}, &at);
          const double lhs = dot(y[k], r[k]), rhs = dot(x[j], dx[j]);
          EXPECT_NEAR(lhs, rhs, 1e-5 * (1.0 + std::fabs(lhs)))
              << name << " " << c.name() << ": input " << j << ", output " << k;
        }
    }
  }
}

TEST(MlaTranspose, OutBwdIsTheTransposeOfOut) {
  const DType dt = DType::kF32;
  std::mt19937 rng(5);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
    for (const MlaCase& c : cases()) {
      const Shapes s = shapes(c);
      const ops::MlaAttrs at = c.attrs();
      Tensor O = Tensor::random(dt, s.full, rng), r = Tensor::random(dt, s.v, rng);
      Tensor Y = garbage(dt, s.v), dO = garbage(dt, s.full);
      run(ops::kMlaOut, name, dt, {&O}, {&Y}, &at);
      run(ops::kMlaOutBwd, name, dt, {&r}, {&dO}, &at);
      EXPECT_EQ(dot(Y, r), dot(O, dO)) << name << " " << c.name();
    }
  }
}

// ---- Bad calls --------------------------------------------------------------------------

template <class A>
std::string refusal(const char* op, DType key, const std::vector<Tensor*>& in,
                    const std::vector<Tensor*>& out, const A* attrs) {
  const KernelDesc& k = kernel(op, key, "cpu.ref");
  CallHolder h(in, out, attrs);
  EXPECT_FALSE(k.supports(&h.call)) << op;
  Status s = k.fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << op;
  return s.code == Code::kOk ? std::string() : take_message(&s);
}

// Aliasing is a property of the data, not of the shapes `supports` sees: only fn refuses it.
template <class A>
std::string fn_refusal(const char* op, DType key, const std::vector<Tensor*>& in,
                       const std::vector<Tensor*>& out, const A* attrs) {
  Status s = call_kernel(op, "cpu.ref", key, in, out, attrs);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << op;
  return s.code == Code::kOk ? std::string() : take_message(&s);
}

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(MlaErrors, QkvBadCallsAreRefused) {
  const DType f = DType::kF32;
  const ops::MlaAttrs at{4, 2, 3};  // D = 6
  Tensor q(f, {2, 3, 2, 6}), kv(f, {2, 3, 2, 7}), kpe(f, {2, 3, 2});
  Tensor Q(f, {2, 3, 2, 6}), K(f, {2, 3, 2, 6}), V(f, {2, 3, 2, 6});
  const ops::MlaAttrs big_v{4, 2, 7}, no_nope{0, 2, 1}, neg_rope{4, -2, 1};
  EXPECT_THAT(refusal(ops::kMlaQkv, f, {&q, &kv, &kpe}, {&Q, &K, &V}, &big_v),
              AllOf(StartsWith("mla_qkv: "), HasSubstr("v_dim = 7 must be in [1, nope_dim + "
                                                       "rope_dim = 6]")));
  EXPECT_THAT(refusal(ops::kMlaQkv, f, {&q, &kv, &kpe}, {&Q, &K, &V}, &no_nope),
              HasSubstr("mla_qkv: nope_dim = 0 must be >= 1"));
  EXPECT_THAT(refusal(ops::kMlaQkv, f, {&q, &kv, &kpe}, {&Q, &K, &V}, &neg_rope),
              HasSubstr("mla_qkv: rope_dim = -2 must be >= 0"));
  Tensor kv_bad(f, {2, 3, 2, 6});
  EXPECT_THAT(refusal(ops::kMlaQkv, f, {&q, &kv_bad, &kpe}, {&Q, &K, &V}, &at),
              HasSubstr("mla_qkv: input 1 (kv) has shape (2, 3, 2, 6), expected (B, T, H, dn + "
                        "dv) = (2, 3, 2, 7)"));
  Tensor kpe_bf(DType::kBF16, {2, 3, 2});
  EXPECT_THAT(refusal(ops::kMlaQkv, f, {&q, &kv, &kpe_bf}, {&Q, &K, &V}, &at),
              HasSubstr("mla_qkv: input 2 (kpe) has dtype bf16, expected q's dtype f32"));
  Tensor q_bad(f, {2, 3, 2, 5});
  EXPECT_THAT(
      refusal(ops::kMlaQkv, f, {&q_bad, &kv, &kpe}, {&Q, &K, &V}, &at),
      AllOf(StartsWith("mla_qkv: input 0 (q) has shape (2, 3, 2, 5)"), HasSubstr("last extent 6")));
  Tensor V_bad(f, {2, 3, 2, 3});
  EXPECT_THAT(refusal(ops::kMlaQkv, f, {&q, &kv, &kpe}, {&Q, &K, &V_bad}, &at),
              HasSubstr("mla_qkv: output 2 (V) has shape (2, 3, 2, 3)"));
  EXPECT_THAT(fn_refusal(ops::kMlaQkv, f, {&q, &kv, &kpe}, {&Q, &Q, &V}, &at),
              HasSubstr("mla_qkv: output 1 (K) overlaps output 0 (Q)"));
  EXPECT_THAT(fn_refusal(ops::kMlaQkv, f, {&q, &kv, &kpe}, {&q, &K, &V}, &at),
              HasSubstr("mla_qkv: output 0 (Q) overlaps input 0 (q)"));
}

TEST(MlaErrors, QkvBwdOutAndOutBwdBadCallsAreRefused) {
  const DType h = DType::kF16;
  const ops::MlaAttrs at{4, 2, 3};
  Tensor dQ(h, {1, 2, 3, 6}), dK(h, {1, 2, 3, 6}), dV(h, {1, 2, 3, 6});
  Tensor dq(h, {1, 2, 3, 6}), dkv(h, {1, 2, 3, 7}), dkpe(h, {1, 2, 2});
  Tensor dK_bad(h, {1, 2, 2, 6});
  EXPECT_THAT(refusal(ops::kMlaQkvBwd, h, {&dQ, &dK_bad, &dV}, {&dq, &dkv, &dkpe}, &at),
              HasSubstr("mla_qkv_bwd: input 1 (dK) has shape (1, 2, 2, 6)"));
  Tensor dkpe_bad(h, {1, 2, 3});
  EXPECT_THAT(refusal(ops::kMlaQkvBwd, h, {&dQ, &dK, &dV}, {&dq, &dkv, &dkpe_bad}, &at),
              HasSubstr("mla_qkv_bwd: output 2 (dkpe) has shape (1, 2, 3), expected (B, T, dr)"));
  Tensor dq_f32(DType::kF32, {1, 2, 3, 6});
  EXPECT_THAT(refusal(ops::kMlaQkvBwd, h, {&dQ, &dK, &dV}, {&dq_f32, &dkv, &dkpe}, &at),
              HasSubstr("mla_qkv_bwd: output 0 (dq) has dtype f32, expected dQ's dtype f16"));
  const ops::MlaAttrs big_v{4, 2, 9};
  EXPECT_THAT(refusal(ops::kMlaQkvBwd, h, {&dQ, &dK, &dV}, {&dq, &dkv, &dkpe}, &big_v),
              HasSubstr("mla_qkv_bwd: v_dim = 9"));

  Tensor O(h, {1, 2, 3, 6}), Y(h, {1, 2, 3, 3}), Y_bad(h, {1, 2, 3, 4});
  EXPECT_THAT(refusal(ops::kMlaOut, h, {&O}, {&Y_bad}, &at),
              HasSubstr("mla_out: output 0 (Y) has shape (1, 2, 3, 4), expected (B, T, H, dv)"));
  Tensor O_bad(h, {1, 2, 3, 7});
  EXPECT_THAT(refusal(ops::kMlaOut, h, {&O_bad}, {&Y}, &at),
              AllOf(StartsWith("mla_out: input 0 (O)"), HasSubstr("last extent 6")));
  Tensor dY(h, {1, 2, 3, 3}), dO(h, {1, 2, 3, 6}), dO_bf(DType::kBF16, {1, 2, 3, 6});
  EXPECT_THAT(refusal(ops::kMlaOutBwd, h, {&dY}, {&dO_bf}, &at),
              HasSubstr("mla_out_bwd: output 0 (dO) has dtype bf16, expected dY's dtype f16"));
  EXPECT_THAT(refusal(ops::kMlaOutBwd, h, {&dO}, {&dO}, &at),
              AllOf(StartsWith("mla_out_bwd: input 0 (dY)"), HasSubstr("last extent 3")));
  EXPECT_THAT(refusal<NoAttrs>(ops::kMlaOutBwd, h, {&dY}, {&dO}, nullptr),
              HasSubstr("mla_out_bwd: attrs must point"));
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
