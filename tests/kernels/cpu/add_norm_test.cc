// add_layernorm_* and add_rmsnorm_* (the residual add fused into the norm): both kernels
// against f64 formulas of loom/ops.h (Z exactly round(X + R), Y and the statistics of that
// rounded Z, dX = the norm's gradient + dZ, the weight gradients), against finite
// differences of the forward (the gradient of X and of R), the unfused ops bit for bit (what
// the CPU kernels run), Z in place of X or R, and the words of bad calls.
#include <cmath>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},    {7, 33},  {5, 127},
                                                          {3, 1000}, {9, 768}, {2, 2048}};

// f64 statistics and outputs of one norm over the rows of z (N, C).
struct NormF64 {
  std::vector<double> y, mean, rstd, dx, dw, db;
};

// The f64 oracle: forward of z, and backward of dy plus dz (dz may be empty: no add).
NormF64 norm_f64(bool rms, const std::vector<double>& z, const std::vector<double>& w,
                 const std::vector<double>& b, const std::vector<double>& dy,
                 const std::vector<double>& dz, int64_t n, int64_t c, double eps, double shift) {
  NormF64 o;
  o.y.resize(n * c), o.mean.resize(n), o.rstd.resize(n), o.dx.resize(n * c);
  o.dw.assign(c, 0.0), o.db.assign(c, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double* zr = &z[i * c];
    double mu = 0.0, var = 0.0;
    if (!rms)
      for (int64_t j = 0; j < c; ++j) mu += zr[j] / c;
    for (int64_t j = 0; j < c; ++j) var += (zr[j] - mu) * (zr[j] - mu) / c;
    const double rstd = 1.0 / std::sqrt(var + eps);
    o.mean[i] = mu, o.rstd[i] = rstd;
    double mg = 0.0, mgx = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (zr[j] - mu) * rstd, g = dy[i * c + j] * (w[j] + shift);
      o.y[i * c + j] = xhat * (w[j] + shift) + (b.empty() ? 0.0 : b[j]);
      mg += g / c;
      mgx += g * xhat / c;
      o.dw[j] += dy[i * c + j] * xhat;
      o.db[j] += dy[i * c + j];
    }
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (zr[j] - mu) * rstd, g = dy[i * c + j] * (w[j] + shift);
      // rmsnorm: d/dz of z * rstd has no mean term.
      o.dx[i * c + j] = rstd * (g - (rms ? 0.0 : mg) - xhat * mgx) + dz[i * c + j];
    }
  }
  return o;
}

struct AddNormCase {
  bool rms;
  DType dtype;
};

class AddNormTest : public ::testing::TestWithParam<AddNormCase> {
 protected:
  bool rms() const { return GetParam().rms; }
  DType dt() const { return GetParam().dtype; }
  const char* fwd_op() const { return rms() ? ops::kAddRmsNormFwd : ops::kAddLayerNormFwd; }
  const char* bwd_op() const { return rms() ? ops::kAddRmsNormBwd : ops::kAddLayerNormBwd; }

  // Forward through kernel `name`: Y, Z, mean (layernorm), rstd. Z may be X or R (in place).
  void forward(const char* name, Tensor& x, Tensor& r, Tensor& w, Tensor& b, Tensor& y, Tensor& z,
               Tensor& mean, Tensor& rstd, const ops::NormAttrs& at) {
    if (rms())
      run(fwd_op(), name, dt(), {&x, &r, &w}, {&y, &z, &rstd}, &at);
    else
      run(fwd_op(), name, dt(), {&x, &r, &w, &b}, {&y, &z, &mean, &rstd}, &at);
  }
  void backward(const char* name, Tensor& dy, Tensor& z, Tensor& w, Tensor& mean, Tensor& rstd,
                Tensor& dz, Tensor& dx, Tensor& dw, Tensor& db, const ops::NormAttrs& at) {
    if (rms())
      run(bwd_op(), name, dt(), {&dy, &z, &w, &rstd, &dz}, {&dx, &dw}, &at);
    else
      run(bwd_op(), name, dt(), {&dy, &z, &w, &mean, &rstd, &dz}, {&dx, &dw, &db}, &at);
  }
};

TEST_P(AddNormTest, BothKernelsMatchF64) {
  std::mt19937 rng(11);
  for (auto [n, c] : kShapes)
    for (int zc : {0, 1})
      for (const char* name : {"cpu.ref", "cpu.fast"}) {
        if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
        const ops::NormAttrs at{1e-5f, zc};
        const double shift = zc ? 1.0 : 0.0;
        Tensor x = Tensor::random(dt(), {n, c}, rng, -2.0, 3.0);
        Tensor r = Tensor::random(dt(), {n, c}, rng, -1.0, 1.0);
        Tensor w = Tensor::random(dt(), {c}, rng), b = Tensor::random(dt(), {c}, rng);
        Tensor y(dt(), {n, c}), z(dt(), {n, c}), mean(DType::kF32, {n}), rstd(DType::kF32, {n});
        forward(name, x, r, w, b, y, z, mean, rstd, at);
        // Z is X + R rounded once to the dtype, exactly.
        Tensor z_exact(dt(), {n, c});
        for (int64_t i = 0; i < n * c; ++i) z_exact.set(i, x.get(i) + r.get(i));
        ASSERT_EQ(z.values(), z_exact.values()) << name << " Z";
        Tensor dy = Tensor::random(dt(), {n, c}, rng), dz = Tensor::random(dt(), {n, c}, rng);
        Tensor dx(dt(), {n, c});
        Tensor dw = Tensor::filled(DType::kF32, {c}, 0.5),
               db = Tensor::filled(DType::kF32, {c}, -1);
        backward(name, dy, z, w, mean, rstd, dz, dx, dw, db, at);
        NormF64 e =
            norm_f64(rms(), z.values(), w.values(), rms() ? std::vector<double>{} : b.values(),
                     dy.values(), dz.values(), n, c, 1e-5, shift);
        const std::string what = std::string(name) + " " + std::to_string(n) + "x" +
                                 std::to_string(c) + " zc " + std::to_string(zc);
        expect_close(y, e.y, dt(), what + " Y");
        if (!rms()) expect_close(mean, e.mean, DType::kF32, what + " mean");
        expect_close(rstd, e.rstd, DType::kF32, what + " rstd");
        // dX: the norm's gradient rounded to the dtype, then dZ added and rounded again.
        Tolerance two = tolerance(dt());
        two.rtol *= 2, two.atol *= 2;
        expect_close(dx.values(), e.dx, two, what + " dX");
        // "+=": from 0.5 and -1; sums of N products in f32 (f64 on the reference).
        std::vector<double> ew(c), eb(c);
        for (int64_t j = 0; j < c; ++j) ew[j] = 0.5 + e.dw[j], eb[j] = -1 + e.db[j];
        expect_close(dw, ew, DType::kF32, what + " dweight");
        if (!rms()) expect_close(db, eb, DType::kF32, what + " dbias");
      }
}

// The CPU kernels run the unfused sequence (add, then the norm; the norm's backward, then
// add): their results are those ops' bit for bit, on both kernels.
TEST_P(AddNormTest, EqualsTheUnfusedOpsBitForBit) {
  std::mt19937 rng(12);
  const int64_t n = 6, c = 40;
  const ops::NormAttrs at{1e-5f, 0};
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" && !__builtin_cpu_supports("avx2")) continue;
    Tensor x = Tensor::random(dt(), {n, c}, rng, -2.0, 3.0), r = Tensor::random(dt(), {n, c}, rng);
    Tensor w = Tensor::random(dt(), {c}, rng), b = Tensor::random(dt(), {c}, rng);
    Tensor y(dt(), {n, c}), z(dt(), {n, c}), mean(DType::kF32, {n}), rstd(DType::kF32, {n});
    forward(name, x, r, w, b, y, z, mean, rstd, at);
    Tensor uz(dt(), {n, c}), uy(dt(), {n, c}), umean(DType::kF32, {n}), urstd(DType::kF32, {n});
    run(ops::kAdd, name, dt(), {&x, &r}, {&uz});
    if (rms())
      run(ops::kRmsNormFwd, name, dt(), {&uz, &w}, {&uy, &urstd}, &at);
    else
      run(ops::kLayerNormFwd, name, dt(), {&uz, &w, &b}, {&uy, &umean, &urstd}, &at);
    EXPECT_EQ(z.values(), uz.values()) << name;
    EXPECT_EQ(y.values(), uy.values()) << name;
    EXPECT_EQ(rstd.values(), urstd.values()) << name;
    Tensor dy = Tensor::random(dt(), {n, c}, rng), dz = Tensor::random(dt(), {n, c}, rng);
    Tensor dx(dt(), {n, c}), dw = Tensor::filled(DType::kF32, {c}, 0),
                             db = Tensor::filled(DType::kF32, {c}, 0);
    backward(name, dy, z, w, mean, rstd, dz, dx, dw, db, at);
    Tensor udx(dt(), {n, c}), udw = Tensor::filled(DType::kF32, {c}, 0),
                              udb = Tensor::filled(DType::kF32, {c}, 0);
    if (rms())
      run(ops::kRmsNormBwd, name, dt(), {&dy, &z, &w, &rstd}, {&udx, &udw}, &at);
    else
      run(ops::kLayerNormBwd, name, dt(), {&dy, &z, &w, &mean, &rstd}, {&udx, &udw, &udb}, &at);
    run(ops::kAdd, name, dt(), {&udx, &dz}, {&udx});
    EXPECT_EQ(dx.values(), udx.values()) << name;
    EXPECT_EQ(dw.values(), udw.values()) << name;
    EXPECT_EQ(db.values(), udb.values()) << name;
  }
}

// Z written over X, or over R: the same Y and Z as into a buffer of its own.
TEST_P(AddNormTest, ZMayReplaceXOrR) {
  std::mt19937 rng(13);
  const int64_t n = 5, c = 24;
  const ops::NormAttrs at{1e-5f, 1};
  Tensor x = Tensor::random(dt(), {n, c}, rng, -2.0, 3.0), r = Tensor::random(dt(), {n, c}, rng);
  Tensor w = Tensor::random(dt(), {c}, rng), b = Tensor::random(dt(), {c}, rng);
  Tensor y(dt(), {n, c}), z(dt(), {n, c}), mean(DType::kF32, {n}), rstd(DType::kF32, {n});
  forward("cpu.ref", x, r, w, b, y, z, mean, rstd, at);
  for (int into_x : {1, 0}) {
    Tensor x2 = x, r2 = r, y2(dt(), {n, c}), mean2(DType::kF32, {n}), rstd2(DType::kF32, {n});
    forward("cpu.ref", x2, r2, w, b, y2, into_x ? x2 : r2, mean2, rstd2, at);
    EXPECT_EQ((into_x ? x2 : r2).values(), z.values()) << "into X " << into_x;
    EXPECT_EQ(y2.values(), y.values()) << "into X " << into_x;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Norms, AddNormTest,
    ::testing::Values(AddNormCase{false, DType::kF32}, AddNormCase{false, DType::kBF16},
                      AddNormCase{false, DType::kF16}, AddNormCase{true, DType::kF32},
                      AddNormCase{true, DType::kBF16}, AddNormCase{true, DType::kF16}),
    [](const auto& info) {
      return std::string(info.param.rms ? "rmsnorm_" : "layernorm_") + dtype_name(info.param.dtype);
    });

// The reference's backward against central differences of its forward, in f32: the gradient
// of L = sum w1 * Y + sum w2 * Z by X and by R is one dX (dZ = w2), and the weight gradients.
TEST(AddNormGradients, LayerNormAndRmsNormMatchFiniteDifferences) {
  for (bool rms : {false, true}) {
    std::mt19937 rng(14);
    const int64_t n = 3, c = 6;
    const ops::NormAttrs at{1e-5f, 1};
    const DType f = DType::kF32;
    Tensor x = Tensor::random(f, {n, c}, rng, -2, 2), r = Tensor::random(f, {n, c}, rng, -1, 1);
    Tensor w = Tensor::random(f, {c}, rng), b = Tensor::random(f, {c}, rng);
    std::vector<double> wy = random_weights(n * c, rng), wz = random_weights(n * c, rng);
    std::vector<double> weights = wy;
    weights.insert(weights.end(), wz.begin(), wz.end());
    Tensor y(f, {n, c}), z(f, {n, c}), mean(f, {n}), rstd(f, {n});
    auto forward = [&] {
      if (rms)
        run_ref(ops::kAddRmsNormFwd, f, {&x, &r, &w}, {&y, &z, &rstd}, &at);
      else
        run_ref(ops::kAddLayerNormFwd, f, {&x, &r, &w, &b}, {&y, &z, &mean, &rstd}, &at);
      std::vector<double> out = y.values(), zv = z.values();
      out.insert(out.end(), zv.begin(), zv.end());
      return out;
    };
    forward();
    Tensor dy(f, {n, c}), dz(f, {n, c}), dx(f, {n, c});
    for (int64_t i = 0; i < n * c; ++i) dy.set(i, wy[i]), dz.set(i, wz[i]);
    Tensor dw = Tensor::filled(f, {c}, 0), db = Tensor::filled(f, {c}, 0);
    if (rms)
      run_ref(ops::kAddRmsNormBwd, f, {&dy, &z, &w, &rstd, &dz}, {&dx, &dw}, &at);
    else
      run_ref(ops::kAddLayerNormBwd, f, {&dy, &z, &w, &mean, &rstd, &dz}, {&dx, &dw, &db}, &at);
    const std::string what = rms ? "add_rmsnorm" : "add_layernorm";
    expect_close(dx.values(), numeric_grad(x, weights, forward), fd_tolerance(), what + " dX");
    expect_close(dx.values(), numeric_grad(r, weights, forward), fd_tolerance(), what + " dR");
    expect_close(dw.values(), numeric_grad(w, weights, forward), fd_tolerance(), what + " dweight");
    if (!rms)
      expect_close(db.values(), numeric_grad(b, weights, forward), fd_tolerance(), what + " dbias");
  }
}

TEST(AddNormErrors, BadCallsNameTheOpAndTheFix) {
  const DType f = DType::kF32;
  const ops::NormAttrs at{1e-5f, 0};
  Tensor x(f, {4, 8}), r(DType::kBF16, {4, 8}), w(f, {8}), y(f, {4, 8}), z(f, {4, 8}), rstd(f, {4});
  Status s = call_kernel(ops::kAddRmsNormFwd, "cpu.ref", f, {&x, &r, &w}, {&y, &z, &rstd}, &at);
  EXPECT_EQ(s.code, Code::kUnimplemented);  // supports() declines the call
  status_release(&s);
  CallHolder h({&x, &r, &w}, {&y, &z, &rstd}, &at);
  s = kernel(ops::kAddRmsNormFwd, f, "cpu.ref").fn(&h.call);
  EXPECT_EQ(take_message(&s),
            "add_rmsnorm_fwd: input 1 (R) has dtype bf16, expected X's f32: the residual, its "
            "sum and their gradients share one dtype");
  // dX over an input: the kernels read dY, Z and dZ again after writing dX (the CUDA weight
  // gradients, dZ's add), so every backward refuses it, the plain norms' too.
  Tensor dy(f, {4, 8}), dz(f, {4, 8}), dw(f, {8});
  const std::vector<std::pair<Tensor*, std::string>> aliases = {
      {&dy, "input 0 (dY)"}, {&z, "input 1 (Z)"}, {&dz, "input 4 (dZ)"}};
  for (const auto& [over, label] : aliases) {
    CallHolder alias({&dy, &z, &w, &rstd, &dz}, {over, &dw}, &at);
    s = kernel(ops::kAddRmsNormBwd, f, "cpu.fast").fn(&alias.call);
    EXPECT_EQ(take_message(&s),
              "add_rmsnorm_bwd: dX aliases " + label + ": give dX a buffer of its own");
  }
  CallHolder plain({&dy, &z, &w, &rstd}, {&dy, &dw}, &at);
  s = kernel(ops::kRmsNormBwd, f, "cpu.ref").fn(&plain.call);
  EXPECT_EQ(take_message(&s), "rmsnorm_bwd: dX aliases input 0 (dY): give dX a buffer of its own");
  Tensor mean(f, {4}), db(f, {8});
  CallHolder layer({&dy, &z, &w, &mean, &rstd}, {&z, &dw, &db}, &at);
  s = kernel(ops::kLayerNormBwd, f, "cpu.ref").fn(&layer.call);
  EXPECT_EQ(take_message(&s), "layernorm_bwd: dX aliases input 1 (X): give dX a buffer of its own");
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
