// gemm_epilogue: the reference against an oracle written here (a long double GEMM and the
// epilogues' formulas in double), the fast kernel (and, where a GPU is present, the CUDA
// kernel's cuBLASLt epilogues and fallbacks) against the reference, the CPU kernels bit for
// bit against the unfused ops the contract names, and the argument checks.
#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

using ops::GemmEpilogueAttrs;

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

// N a multiple of 8 (cuBLASLt's aux matrices) and not, K odd and even, a tile-sized one.
std::vector<Case> cases(bool ta) {
  std::vector<Case> c;
  for (bool tb : {false, true}) {
    c.push_back({1, 1, 1, ta, tb});
    c.push_back({7, 33, 5, ta, tb});
    c.push_back({33, 8, 65, ta, tb});
    c.push_back({17, 16, 127, ta, tb});
    c.push_back({64, 128, 96, ta, tb});
  }
  return c;
}

std::string describe(const Case& c, int32_t epilogue, int32_t approximate) {
  return "epilogue " + std::to_string(epilogue) + " approximate " + std::to_string(approximate) +
         " M " + std::to_string(c.m) + " N " + std::to_string(c.n) + " K " + std::to_string(c.k) +
         " ta " + std::to_string(c.ta) + " tb " + std::to_string(c.tb);
}

constexpr double kPi = 3.14159265358979323846;

// gelu and its derivative in double, from their definitions.
double gelu(double x, bool tanh_form) {
  if (!tanh_form) return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
  const double u = std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_grad(double x, bool tanh_form) {
  if (!tanh_form)
    return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * kPi);
  const double u = std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) +
         0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / kPi) * (1.0 + 3.0 * 0.044715 * x * x);
}

struct Operands {
  Tensor a, b, bias, p_in, y, aux, dbias;
};

// The tensors of one call; absent optionals stay empty.
Operands make(const Case& c, int32_t epilogue, DType dt, DType y_dt, bool with_bias, bool with_aux,
              bool with_dbias, std::mt19937& rng) {
  Operands o;
  o.a = Tensor::random(dt, c.ta ? std::vector<int64_t>{c.k, c.m} : std::vector<int64_t>{c.m, c.k},
                       rng);
  o.b = Tensor::random(dt, c.tb ? std::vector<int64_t>{c.n, c.k} : std::vector<int64_t>{c.k, c.n},
                       rng);
  if (with_bias) o.bias = Tensor::random(dt, {c.n}, rng);
  if (epilogue == ops::kEpilogueDGelu) o.p_in = Tensor::random(dt, {c.m, c.n}, rng, -3.0, 3.0);
  o.y = Tensor::random(y_dt, {c.m, c.n}, rng);  // beta = 1 reads it
  if (with_aux) o.aux = Tensor::random(dt, {c.m, c.n}, rng);
  if (with_dbias)  // += : starts from values that must stay in the sum
    o.dbias = Tensor::random(DType::kF32, {epilogue == ops::kEpilogueDGelu ? c.n : c.m}, rng);
  return o;
}

struct Expected {
  std::vector<double> y, aux, dbias;
  std::vector<double> z;  // op(A) @ op(B), before the bias (M, N)
};

Expected oracle(const Case& c, const GemmEpilogueAttrs& at, const Operands& o) {
  Expected e;
  e.y.resize(static_cast<size_t>(c.m * c.n));
  e.aux.resize(e.y.size());
  e.z.resize(e.y.size());
  const bool tanh_form = at.approximate != 0;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      long double z = 0;
      for (int64_t p = 0; p < c.k; ++p)
        z += static_cast<long double>(o.a.get(c.ta ? p * c.m + i : i * c.k + p)) *
             o.b.get(c.tb ? j * c.k + p : p * c.n + j);
      const size_t ij = static_cast<size_t>(i * c.n + j);
      double zd = static_cast<double>(z), pre = zd + (o.bias.empty() ? 0.0 : o.bias.get(j));
      e.z[ij] = zd;
      switch (at.epilogue) {
        case ops::kEpilogueBias:
          e.y[ij] = pre;
          break;
        case ops::kEpilogueGelu:
          e.aux[ij] = pre;
          e.y[ij] = gelu(pre, tanh_form);
          break;
        case ops::kEpilogueDGelu:
          e.y[ij] = gelu_grad(o.p_in.get(static_cast<int64_t>(ij)), tanh_form) * zd;
          break;
        case ops::kEpilogueBiasGradA:
          e.y[ij] = zd + at.beta * o.y.get(static_cast<int64_t>(ij));
          break;
      }
    }
  if (!o.dbias.empty()) {
    e.dbias = o.dbias.values();
    if (at.epilogue == ops::kEpilogueDGelu) {
      for (int64_t j = 0; j < c.n; ++j)
        for (int64_t i = 0; i < c.m; ++i) e.dbias[j] += e.y[i * c.n + j];
    } else {  // the row sums of op(A)
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t p = 0; p < c.k; ++p) e.dbias[i] += o.a.get(c.ta ? p * c.m + i : i * c.k + p);
    }
  }
  return e;
}

// Every epilogue with each optional tensor present and absent where the contract allows it.
struct Variant {
  int32_t epilogue, approximate;
  bool bias, aux, dbias, ta;
  float beta;
  bool f32_y;
};
std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({ops::kEpilogueBias, 0, true, false, false, false, 0.f, false});
  v.push_back({ops::kEpilogueBias, 0, true, false, false, true, 0.f, false});
  for (int32_t approx : {0, 1}) {
    v.push_back({ops::kEpilogueGelu, approx, true, true, false, false, 0.f, false});
    v.push_back({ops::kEpilogueGelu, approx, false, true, false, false, 0.f, false});
    v.push_back({ops::kEpilogueGelu, approx, true, false, false, false, 0.f, false});
    v.push_back({ops::kEpilogueDGelu, approx, false, false, true, false, 0.f, false});
    v.push_back({ops::kEpilogueDGelu, approx, false, false, false, false, 0.f, false});
  }
  for (float beta : {0.f, 1.f})
    for (bool f32_y : {false, true})
      v.push_back({ops::kEpilogueBiasGradA, 0, false, false, true, true, beta, f32_y});
  v.push_back({ops::kEpilogueBiasGradA, 0, false, false, false, true, 1.f, true});
  return v;
}

std::vector<Tensor*> inputs_of(Operands& o) { return {&o.a, &o.b, &o.bias, &o.p_in}; }
std::vector<Tensor*> outputs_of(Operands& o) { return {&o.y, &o.aux, &o.dbias}; }

// Unit roundoff of a dtype's storage (half its ulp at 1).
double unit_roundoff(DType t) {
  return t == DType::kBF16  ? std::ldexp(1.0, -9)
         : t == DType::kF16 ? std::ldexp(1.0, -12)
                            : std::ldexp(1.0, -24);
}

// expect_close with a per-element allowance added to the tolerance; prints the worst ratio
// of difference to what is allowed.
void expect_close_allowing(const Tensor& got, const std::vector<double>& expected,
                           const std::vector<double>& extra, DType dt, const std::string& what) {
  const std::vector<double> g = got.values();
  ASSERT_EQ(g.size(), expected.size()) << what;
  const Tolerance tol = tolerance(dt);
  double worst = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double allowed = tol.atol + tol.rtol * std::fabs(expected[i]) + extra[i];
    const double diff = std::fabs(g[i] - expected[i]);
    worst = std::max(worst, diff / allowed);
    if (!(diff <= allowed) && ++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", expected " << expected[i]
                    << " (|diff| " << diff << ", allowed " << allowed << ", of which " << extra[i]
                    << " beyond the dtype's tolerance)";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " elements differ";
  std::printf("[error] %s: worst |diff| / allowed %.3g\n", what.c_str(), worst);
}

// dbias against `expected`. It is a sum over M values of Y, which a kernel may round to Y's
// dtype before or after summing (the contract): the two differ by up to one unit roundoff of
// each term, so the bound adds 2 u sum_i |Y_i| (`y`: the expected Y, (M, N)) to the dtype's
// tolerance; the worst ratio of error to what is allowed is printed.
void expect_dbias_close(const Tensor& got, const std::vector<double>& expected,
                        const std::vector<double>& y, int64_t n, int32_t epilogue, DType dt,
                        const std::string& what) {
  std::vector<double> bound(expected.size(), 0.0);
  if (epilogue == ops::kEpilogueDGelu)
    for (size_t i = 0; i < y.size(); ++i) bound[i % n] += 2 * unit_roundoff(dt) * std::fabs(y[i]);
  expect_close_allowing(got, expected, bound, dt, "dbias " + what);
}

// What the contract lets a fused kernel differ from the unfused ops by, per element, beyond
// the dtype's tolerance (loom/ops/gemm.h, "Rounding"), from the oracle's exact values:
//   - Z may skip its rounding before the bias: up to 2 u |Z| in P = Z + bias, which matters
//     where the bias cancels Z (P small, Z not); through GELU, times |gelu'(P)|; in the
//     derivative epilogue Y = gelu'(P) Z, times |gelu'(P)|;
//   - the tanh form may use a hardware tanh with relative error up to kTanhError (cuBLASLt's
//     GELU epilogues): Y = 0.5 x (1 + t) moves by 0.5 |x| e |t|, and gelu'(x) by
//     |0.5 - x t c (1 + 3 a x^2)| e |t| (times |Z| in the derivative epilogue).
// Both zero for a kernel that runs the unfused sequence (cpu.fast: allowance not used).
constexpr double kTanhError = 1.0 / 1024;  // PTX tanh.approx.f32: 2^-10.987 at most
struct Allowance {
  std::vector<double> y, aux;
};
Allowance fused_allowance(const Variant& v, const Expected& e, const Operands& o, DType dt) {
  const double u = unit_roundoff(dt), c = std::sqrt(2.0 / kPi);
  const bool tanh_form = v.approximate != 0;
  Allowance al{std::vector<double>(e.y.size(), 0.0), std::vector<double>(e.y.size(), 0.0)};
  for (size_t ij = 0; ij < e.y.size(); ++ij) {
    const double skip = v.bias ? 2 * u * std::fabs(e.z[ij]) : 0.0;  // Z rounded or not
    switch (v.epilogue) {
      case ops::kEpilogueBias:
        al.y[ij] = skip;
        break;
      case ops::kEpilogueGelu: {
        const double x = e.aux[ij];
        al.aux[ij] = skip;
        al.y[ij] = std::fabs(gelu_grad(x, tanh_form)) * skip;
        if (tanh_form) {
          const double t = std::tanh(c * (x + 0.044715 * x * x * x));
          al.y[ij] += 0.5 * std::fabs(x) * kTanhError * std::fabs(t);
        }
        break;
      }
      case ops::kEpilogueDGelu: {
        const double x = o.p_in.get(static_cast<int64_t>(ij)), z = std::fabs(e.z[ij]);
        al.y[ij] = std::fabs(gelu_grad(x, tanh_form)) * 2 * u * z;  // Z rounded or not
        if (tanh_form) {
          const double t = std::tanh(c * (x + 0.044715 * x * x * x));
          const double dt_dgelu = 0.5 - x * t * c * (1.0 + 3.0 * 0.044715 * x * x);
          al.y[ij] += z * std::fabs(dt_dgelu) * kTanhError * std::fabs(t);
        }
        break;
      }
      default:
        break;
    }
  }
  return al;
}

// Compares the outputs of another kernel (`got`) with cpu.ref's (`ref`) at the dtype's
// tolerance plus, for a fused kernel, the contract's allowance `al` (dbias:
// expect_dbias_close).
void expect_outputs_match(const std::vector<Tensor>& got, const std::vector<Tensor>& ref,
                          const Variant& v, DType dt, const std::string& what,
                          const Allowance* al = nullptr) {
  ASSERT_EQ(got.size(), 3u) << what;
  if (al != nullptr) {
    expect_close_allowing(got[0], ref[0].values(), al->y, dt, "Y " + what);
    if (v.aux) expect_close_allowing(got[1], ref[1].values(), al->aux, dt, "aux " + what);
  } else {
    expect_close(got[0], ref[0].values(), dt, "Y " + what);
    if (v.aux) expect_close(got[1], ref[1].values(), dt, "aux " + what);
  }
  if (v.dbias)
    expect_dbias_close(got[2], ref[2].values(), ref[0].values(), ref[0].shape()[1], v.epilogue, dt,
                       what);
}

class GemmEpilogueTest : public ::testing::TestWithParam<DType> {};

TEST_P(GemmEpilogueTest, ReferenceMatchesOracle) {
  const DType dt = GetParam();
  std::mt19937 rng(11);
  for (const Variant& v : variants())
    for (const Case& c : cases(v.ta)) {
      Operands o = make(c, v.epilogue, dt, v.f32_y ? DType::kF32 : dt, v.bias, v.aux, v.dbias, rng);
      GemmEpilogueAttrs at{v.ta, c.tb, v.epilogue, v.approximate, v.beta};
      Expected e = oracle(c, at, o);
      run_ref(ops::kGemmEpilogue, dt, inputs_of(o), outputs_of(o), &at);
      const std::string what = describe(c, v.epilogue, v.approximate);
      report_error(o.y.values(), e.y, std::string(dtype_name(dt)) + " Y " + what);
      expect_close(o.y, e.y, dt, "Y " + what);
      if (v.aux) expect_close(o.aux, e.aux, dt, "aux " + what);
      if (v.dbias) expect_dbias_close(o.dbias, e.dbias, e.y, c.n, v.epilogue, dt, what);
    }
}

TEST_P(GemmEpilogueTest, FastAndDevicesMatchReference) {
  const DType dt = GetParam();
  const bool fast = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!fast) std::printf("[ SKIPPED part ] cpu.fast: this CPU lacks AVX2/FMA\n");
  std::mt19937 rng(12);
  for (const Variant& v : variants())
    for (const Case& c : cases(v.ta)) {
      Operands o = make(c, v.epilogue, dt, v.f32_y ? DType::kF32 : dt, v.bias, v.aux, v.dbias, rng);
      GemmEpilogueAttrs at{v.ta, c.tb, v.epilogue, v.approximate, v.beta};
      const std::string what = describe(c, v.epilogue, v.approximate);
      std::vector<Tensor> inputs = {o.a, o.b, o.bias, o.p_in}, initial = {o.y, o.aux, o.dbias};
      Operands r = o;
      run_ref(ops::kGemmEpilogue, dt, inputs_of(r), outputs_of(r), &at);
      const std::vector<Tensor> ref = {r.y, r.aux, r.dbias};
      const Allowance al = fused_allowance(v, oracle(c, at, o), o, dt);
      if (fast) {
        Operands f = o;
        run(ops::kGemmEpilogue, "cpu.fast", dt, inputs_of(f), outputs_of(f), &at);
        expect_outputs_match({f.y, f.aux, f.dbias}, ref, v, dt, "cpu.fast " + what);
      }
      // Every device linked into this binary (the CUDA kernel where a GPU is present).
      for (::loom::kernels::testing::DeviceBackend* b :
           ::loom::kernels::testing::device_backends()) {
        std::string why;
        if (!b->available(&why)) continue;  // said once, at the start of the binary
        const KernelDesc* k = b->kernel(ops::kGemmEpilogue, dt);
        ASSERT_NE(k, nullptr) << b->name() << " has no gemm_epilogue kernel";
        std::vector<Tensor> got =
            run_on_device(*b, *k, inputs, initial, &at, std::string(b->name()) + " " + what);
        if (!got.empty())
          expect_outputs_match(got, ref, v, dt, std::string(b->name()) + " " + what, &al);
      }
    }
}

// The CPU kernels are the unfused sequence, so a model that switches to gemm_epilogue on
// the CPU computes exactly what it did before: every output equal bit for bit.
TEST_P(GemmEpilogueTest, CpuKernelsEqualTheUnfusedOps) {
  const DType dt = GetParam();
  std::mt19937 rng(13);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
    for (const Variant& v : variants()) {
      const Case c{17, 16, 33, v.ta, true};
      Operands o = make(c, v.epilogue, dt, v.f32_y ? DType::kF32 : dt, v.bias, v.aux, v.dbias, rng);
      Operands u = o;  // the unfused sequence's copies
      GemmEpilogueAttrs at{v.ta, c.tb, v.epilogue, v.approximate, v.beta};
      run(ops::kGemmEpilogue, name, dt, inputs_of(o), outputs_of(o), &at);
      ops::GemmAttrs g{v.ta, c.tb, 1.f, v.beta};
      ops::GeluAttrs gelu{v.approximate};
      Tensor pre = v.aux ? u.aux : Tensor(dt, {c.m, c.n});
      switch (v.epilogue) {
        case ops::kEpilogueBias:
          run(ops::kGemm, name, dt, {&u.a, &u.b}, {&u.y}, &g);
          run(ops::kBiasAdd, name, dt, {&u.bias}, {&u.y});
          break;
        case ops::kEpilogueGelu:
          run(ops::kGemm, name, dt, {&u.a, &u.b}, {&pre}, &g);
          if (v.bias) run(ops::kBiasAdd, name, dt, {&u.bias}, {&pre});
          run(ops::kGeluFwd, name, dt, {&pre}, {&u.y}, &gelu);
          if (v.aux) u.aux = pre;
          break;
        case ops::kEpilogueDGelu: {
          Tensor z = u.y;
          run(ops::kGemm, name, dt, {&u.a, &u.b}, {&z}, &g);
          run(ops::kGeluBwd, name, dt, {&z, &u.p_in}, {&u.y}, &gelu);
          if (v.dbias) run(ops::kBiasGrad, name, dt, {&u.y}, {&u.dbias});
          break;
        }
        case ops::kEpilogueBiasGradA:
          run(ops::kGemm, name, u.a.dtype(), {&u.a, &u.b}, {&u.y}, &g);
          if (v.dbias) run(ops::kBiasGrad, name, dt, {&u.a}, {&u.dbias});
          break;
      }
      const std::string what = std::string(name) + " " + describe(c, v.epilogue, v.approximate);
      EXPECT_EQ(o.y.values(), u.y.values()) << "Y " << what;
      if (v.aux) {
        EXPECT_EQ(o.aux.values(), u.aux.values()) << "aux " << what;
      }
      if (v.dbias) {
        EXPECT_EQ(o.dbias.values(), u.dbias.values()) << "dbias " << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemmEpilogueTest, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

// kEpilogueBiasGradA with A stored (M, K): the row sums, which only the CPU kernels serve.
TEST(GemmEpilogue, BiasGradOfAnUntransposedA) {
  std::mt19937 rng(14);
  const Case c{9, 12, 21, false, false};
  Operands o = make(c, ops::kEpilogueBiasGradA, DType::kF32, DType::kF32, false, false, true, rng);
  GemmEpilogueAttrs at{0, 0, ops::kEpilogueBiasGradA, 0, 0.f};
  Expected e = oracle(c, at, o);
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    Operands r = o;
    run(ops::kGemmEpilogue, name, DType::kF32, inputs_of(r), outputs_of(r), &at);
    expect_close(r.dbias, e.dbias, DType::kF32, std::string("dbias ") + name);
  }
}

// A bad call fails with one message that names the op, the tensor or attribute, and the rule.
TEST(GemmEpilogue, BadCallsAreRefusedWithAMessage) {
  std::mt19937 rng(15);
  const Case c{4, 8, 6, false, true};
  struct Bad {
    GemmEpilogueAttrs at;
    bool bias, p_in, aux, dbias;
    const char* says;
  };
  const Bad bad[] = {
      {{0, 1, 9, 0, 0.f}, false, false, false, false, "attrs.epilogue is 9"},
      {{0, 1, ops::kEpilogueBias, 0, 0.f},
       false,
       false,
       false,
       false,
       "input 2 (bias) is required with kEpilogueBias"},
      {{0, 1, ops::kEpilogueDGelu, 0, 0.f},
       false,
       false,
       false,
       false,
       "input 3 (P) is required with kEpilogueDGelu"},
      {{0, 1, ops::kEpilogueBias, 0, 0.f},
       true,
       false,
       true,
       false,
       "output 1 (aux) must be empty with kEpilogueBias"},
      {{0, 1, ops::kEpilogueGelu, 0, 1.f}, false, false, false, false, "attrs.beta is 1"},
      {{0, 1, ops::kEpilogueGelu, 2, 0.f}, false, false, false, false, "attrs.approximate is 2"},
      {{0, 1, ops::kEpilogueBiasGradA, 0, 0.f},
       true,
       false,
       false,
       false,
       "input 2 (bias) must be empty with kEpilogueBiasGradA"},
  };
  for (const Bad& b : bad) {
    Operands o;
    o.a = Tensor::random(DType::kF32, {c.m, c.k}, rng);
    o.b = Tensor::random(DType::kF32, {c.n, c.k}, rng);
    o.y = Tensor(DType::kF32, {c.m, c.n});
    if (b.bias) o.bias = Tensor::random(DType::kF32, {c.n}, rng);
    if (b.aux) o.aux = Tensor(DType::kF32, {c.m, c.n});
    for (const char* name : {"cpu.ref", "cpu.fast"}) {
      const KernelDesc& k = kernel(ops::kGemmEpilogue, DType::kF32, name);
      CallHolder h(inputs_of(o), outputs_of(o), &b.at);
      EXPECT_FALSE(k.supports(&h.call)) << name << ": " << b.says;
      Status s = k.fn(&h.call);
      EXPECT_EQ(s.code, Code::kInvalidArgument) << b.says;
      std::string msg = take_message(&s);
      EXPECT_EQ(msg.rfind("gemm_epilogue: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(b.says), std::string::npos) << msg;
    }
  }
  // A dbias of the wrong length: the expected one named.
  Operands o = make(c, ops::kEpilogueDGelu, DType::kF32, DType::kF32, false, false, false, rng);
  o.dbias = Tensor(DType::kF32, {c.m});
  GemmEpilogueAttrs at{0, 1, ops::kEpilogueDGelu, 1, 0.f};
  CallHolder h(inputs_of(o), outputs_of(o), &at);
  Status s = kernel(ops::kGemmEpilogue, DType::kF32, "cpu.ref").fn(&h.call);
  std::string msg = take_message(&s);
  EXPECT_NE(msg.find("output 2 (dbias) has shape (4), expected (N) = (8)"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
