// adamw_step and sgd_step: the reference against f64 updates written here over several
// steps, fast against reference over grad dtypes and odd sizes, the param cast.
// adamw_step_multi: bit for bit what one adamw_step call per shard gives, with the same
// kernel (ref and fast), over shards of many lengths, mixed decay and param outputs; and
// its bad calls.
// bf16 moments (Megatron's precision-aware optimizer): each kernel's update of a bf16 moment
// is, bit for bit, its update of an f32 moment holding the same values followed by a cast to
// bf16 (Transformer Engine's FusedAdam: widen, f32 step, copy back as bf16).
#include <cmath>
#include <cstring>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

class OptimTest : public ::testing::TestWithParam<DType> {};

TEST_P(OptimTest, AdamWReferenceMatchesF64OverSteps) {
  std::mt19937 rng(1);
  DType dt = GetParam();
  const int64_t n = 37;
  Tensor w = Tensor::random(DType::kF32, {n}, rng), m = Tensor::filled(DType::kF32, {n}, 0);
  Tensor v = Tensor::filled(DType::kF32, {n}, 0), param(dt, {n});
  std::vector<double> ew = w.values(), em(n, 0.0), ev(n, 0.0);
  for (int64_t step = 1; step <= 5; ++step) {
    Tensor g = Tensor::random(dt, {n}, rng);
    ops::AdamWAttrs at{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step};
    run_ref(ops::kAdamWStep, dt, {&g}, {&w, &m, &v, &param}, &at);
    for (int64_t i = 0; i < n; ++i) {
      double gi = g.get(i) * 0.5;
      em[i] = 0.9 * em[i] + 0.1 * gi;
      ev[i] = 0.95 * ev[i] + 0.05 * gi * gi;
      double mh = em[i] / (1 - std::pow(0.9, step)), vh = ev[i] / (1 - std::pow(0.95, step));
      ew[i] -= 1e-2 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * ew[i]);
    }
  }
  expect_close(w, ew, DType::kF32, "adamw master");
  expect_close(m, em, DType::kF32, "adamw exp_avg");
  expect_close(v, ev, DType::kF32, "adamw exp_avg_sq");
  expect_close(param, ew, dt, "adamw param cast");
}

TEST_P(OptimTest, SgdReferenceMatchesF64OverSteps) {
  std::mt19937 rng(2);
  DType dt = GetParam();
  const int64_t n = 19;
  for (float momentum : {0.0f, 0.9f})
    for (int nesterov : {0, 1}) {
      Tensor w = Tensor::random(DType::kF32, {n}, rng),
             buf = momentum != 0 ? Tensor::filled(DType::kF32, {n}, 7) : Tensor();
      Tensor param;
      std::vector<double> ew = w.values(), eb(n, 0.0);
      for (int64_t step = 1; step <= 4; ++step) {
        Tensor g = Tensor::random(dt, {n}, rng);
        ops::SgdAttrs at{0.05f, momentum, 0.01f, 2.0f, nesterov, step};
        run_ref(ops::kSgdStep, dt, {&g}, {&w, &buf, &param}, &at);
        for (int64_t i = 0; i < n; ++i) {
          double gi = g.get(i) * 2.0 + 0.01 * ew[i];
          eb[i] = step == 1 ? gi : momentum * eb[i] + gi;  // buf = g at step 1
          double update = momentum == 0 ? gi : (nesterov ? gi + momentum * eb[i] : eb[i]);
          ew[i] -= 0.05 * update;
        }
      }
      expect_close(w, ew, DType::kF32, "sgd master");
      if (momentum != 0) expect_close(buf, eb, DType::kF32, "sgd momentum buffer");
    }
}

TEST_P(OptimTest, FastMatchesReference) {
  std::mt19937 rng(3);
  DType dt = GetParam();
  for (int64_t n : {1, 7, 33, 4099}) {
    Tensor g = Tensor::random(dt, {n}, rng), w = Tensor::random(DType::kF32, {n}, rng);
    Tensor m = Tensor::random(DType::kF32, {n}, rng),
           v = Tensor::random(DType::kF32, {n}, rng, 0, 1);
    ops::AdamWAttrs aw{3e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 7};
    expect_fast_matches_ref(ops::kAdamWStep, dt, {g}, {w, m, v, Tensor(dt, {n})}, &aw);
    expect_fast_matches_ref(ops::kAdamWStep, dt, {g}, {w, m, v, Tensor()}, &aw);
    for (int64_t step : {1, 3}) {
      ops::SgdAttrs sg{0.1f, 0.9f, 0.01f, 1.0f, static_cast<int32_t>(step == 3), step};
      expect_fast_matches_ref(ops::kSgdStep, dt, {g}, {w, m, Tensor(dt, {n})}, &sg);
    }
    ops::SgdAttrs plain{0.1f, 0.0f, 0.0f, 1.0f, 0, 1};
    expect_fast_matches_ref(ops::kSgdStep, dt, {g}, {w, Tensor(), Tensor()}, &plain);
  }
}

// K shards for adamw_step_multi: lengths 1, 0, odd ones and more than one fast chunk (2048),
// mixed weight decay, and every kind of param output: the grad's dtype, bf16, f32, none.
struct MultiCase {
  std::vector<Tensor> grads, outs;  // K grads; 4K outputs (master, exp_avg, exp_avg_sq, param)
  std::vector<float> decay;
  ops::AdamWMultiAttrs attrs{};

  // bf16_moments: the shards' moments cycle through (f32, f32), (bf16, bf16), (bf16, f32) and
  // (f32, bf16) (exp_avg, exp_avg_sq); else all f32.
  MultiCase(DType grad_dtype, int64_t step, std::mt19937& rng, bool bf16_moments = false) {
    const int64_t lengths[] = {1, 7, 0, 33, 4099, 2048, 5, 2049};
    const DType params[] = {grad_dtype, DType::kBF16, DType::kF32, DType::kInvalid};
    int k = 0;
    for (int64_t n : lengths) {
      const int mix = bf16_moments ? (k + 1) % 4 : 0;
      const DType m = mix == 1 || mix == 2 ? DType::kBF16 : DType::kF32;
      const DType v = mix == 1 || mix == 3 ? DType::kBF16 : DType::kF32;
      grads.push_back(Tensor::random(grad_dtype, {n}, rng));
      outs.push_back(Tensor::random(DType::kF32, {n}, rng));
      outs.push_back(Tensor::random(m, {n}, rng, -0.1, 0.1));
      outs.push_back(Tensor::random(v, {n}, rng, 0, 0.01));
      DType p = params[k % 4];
      outs.push_back(p == DType::kInvalid ? Tensor() : Tensor(p, {n}));
      decay.push_back(k % 3 == 1 ? 0.0f : 0.1f * static_cast<float>(k + 1));
      ++k;
    }
    attrs = ops::AdamWMultiAttrs{3e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, k, step, decay.data()};
  }
  // Shard i's own adamw_step attributes.
  ops::AdamWAttrs single(int i) const {
    return ops::AdamWAttrs{attrs.lr,  attrs.beta1,           attrs.beta2,
                           attrs.eps, attrs.weight_decay[i], attrs.grad_scale,
                           attrs.step};
  }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.empty() || b.empty()) return a.empty() == b.empty();
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

TEST_P(OptimTest, AdamWMultiIsBitIdenticalToOneAdamWStepPerShard) {
  std::mt19937 rng(4);
  DType dt = GetParam();
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" &&
        (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")))
      continue;  // cpu.fast declines without AVX2: only the reference runs here
    for (int64_t step : {1, 4})
      for (bool bf16_moments : {false, true}) {
        SCOPED_TRACE(std::string(name) + " step " + std::to_string(step) +
                     (bf16_moments ? " bf16 moments" : ""));
        MultiCase c(dt, step, rng, bf16_moments);
        std::vector<Tensor> multi = c.outs, single = c.outs;
        std::vector<Tensor*> in, out;
        for (Tensor& g : c.grads) in.push_back(&g);
        for (Tensor& t : multi) out.push_back(&t);
        run(ops::kAdamWStepMulti, name, dt, in, out, &c.attrs);
        for (int i = 0; i < c.attrs.count; ++i) {
          ops::AdamWAttrs at = c.single(i);
          run(ops::kAdamWStep, name, dt, {&c.grads[i]},
              {&single[4 * i], &single[4 * i + 1], &single[4 * i + 2], &single[4 * i + 3]}, &at);
        }
        for (size_t j = 0; j < multi.size(); ++j)
          EXPECT_TRUE(same_bits(multi[j], single[j]))
              << "shard " << j / 4 << " output " << j % 4 << " (n = " << c.grads[j / 4].numel()
              << ") differs from adamw_step's";
        // The update happened: the masters and the moments moved.
        EXPECT_FALSE(same_bits(multi[4 * 4], c.outs[4 * 4]));
        EXPECT_FALSE(same_bits(multi[4 * 4 + 1], c.outs[4 * 4 + 1]));
        EXPECT_FALSE(same_bits(multi[4 * 4 + 2], c.outs[4 * 4 + 2]));
      }
  }
}

TEST_P(OptimTest, AdamWMultiFastMatchesReference) {
  std::mt19937 rng(5);
  for (bool bf16_moments : {false, true}) {
    MultiCase c(GetParam(), 3, rng, bf16_moments);
    expect_fast_matches_ref(ops::kAdamWStepMulti, GetParam(), c.grads, c.outs, &c.attrs,
                            bf16_moments ? "bf16 moments" : "f32 moments");
  }
}

// `t` in `dtype` (Tensor::set: f32 to bf16 rounds to nearest even, bf16 to f32 is exact).
Tensor cast_to(const Tensor& t, DType dtype) {
  Tensor r(dtype, {t.numel()});
  for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
  return r;
}
Tensor to_bf16(const Tensor& t) { return cast_to(t, DType::kBF16); }
Tensor to_f32(const Tensor& t) { return cast_to(t, DType::kF32); }

// A bf16 moment is an f32 moment rounded after each step: over six steps, each kernel's call
// with bf16 moments (one or both) gives the master, the param cast and the moments that the
// same kernel's call with f32 moments gives when those are rounded to bf16 after every step,
// to the bit. Lengths 1, 7 (the reference's and the fast loop's tails) and 4099 (more than
// one fast chunk). It fails when a kernel truncates instead of rounding to nearest even, or
// rounds the master too.
TEST_P(OptimTest, Bf16MomentsAreTheF32UpdateRoundedToBf16) {
  std::mt19937 rng(8);
  const DType dt = GetParam();
  const bool fast = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" && !fast) continue;  // reported below
    for (int mix : {1, 2, 3})  // which moments are bf16: exp_avg, exp_avg_sq, both
      for (int64_t n : {1, 7, 4099}) {
        SCOPED_TRACE(std::string(name) + " mix " + std::to_string(mix) + " n " + std::to_string(n));
        const bool bf_m = mix & 1, bf_v = mix & 2;
        Tensor w = Tensor::random(DType::kF32, {n}, rng), w_ref = w;
        Tensor m_ref = to_f32(to_bf16(Tensor::random(DType::kF32, {n}, rng, -0.1, 0.1)));
        Tensor v_ref = to_f32(to_bf16(Tensor::random(DType::kF32, {n}, rng, 0, 0.01)));
        Tensor m = bf_m ? to_bf16(m_ref) : m_ref, v = bf_v ? to_bf16(v_ref) : v_ref;
        Tensor p(dt, {n}), p_ref(dt, {n});
        for (int64_t step = 1; step <= 6; ++step) {
          Tensor g = Tensor::random(dt, {n}, rng);
          ops::AdamWAttrs at{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step};
          run(ops::kAdamWStep, name, dt, {&g}, {&w, &m, &v, &p}, &at);
          run(ops::kAdamWStep, name, dt, {&g}, {&w_ref, &m_ref, &v_ref, &p_ref}, &at);
          if (bf_m) m_ref = to_f32(to_bf16(m_ref));  // the oracle's cast
          if (bf_v) v_ref = to_f32(to_bf16(v_ref));
        }
        EXPECT_EQ(m.dtype(), bf_m ? DType::kBF16 : DType::kF32);
        EXPECT_TRUE(same_bits(w, w_ref)) << "master";
        EXPECT_TRUE(same_bits(p, p_ref)) << "param";
        EXPECT_TRUE(same_bits(m, bf_m ? to_bf16(m_ref) : m_ref)) << "exp_avg";
        EXPECT_TRUE(same_bits(v, bf_v ? to_bf16(v_ref) : v_ref)) << "exp_avg_sq";
      }
  }
  if (!fast) GTEST_SKIP() << "this CPU lacks AVX2/FMA: cpu.fast not run (cpu.ref passed)";
}

// Step scalars f64 (kStepScalarCount): lr, step and grad scale, the skip flag.
Tensor step_scalars(double lr, int64_t step, double grad_scale, bool skip) {
  Tensor s = Tensor::filled(DType::kF64, {ops::kStepScalarCount}, 0);
  s.set(ops::kStepLr, lr);
  s.set(ops::kStepIndex, static_cast<double>(step));
  s.set(ops::kStepGradScale, grad_scale);
  s.set(ops::kStepSkip, skip ? 1 : 0);
  return s;
}

// With step scalars, every step op reads lr, step and grad scale there, not in its attrs
// (which hold other values here): the results equal, to the bit, those of a call whose
// attrs hold the scalars' values (lr and grad scale rounded to f32, as a caller rounds
// them). With the skip flag set a call writes nothing. Both kernels, every grad dtype.
TEST_P(OptimTest, StepScalarsReplaceTheAttrsValues) {
  std::mt19937 rng(6);
  const DType dt = GetParam();
  const double lr = 2.5e-3 + 1e-12, gs = 0.37 + 1e-12;  // not f32 values: the rounding counts
  const int64_t step = 5;
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    if (std::string(name) == "cpu.fast" &&
        (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")))
      continue;  // cpu.fast declines without AVX2: only the reference runs here
    SCOPED_TRACE(name);
    for (bool skip : {false, true}) {
      SCOPED_TRACE(skip ? "skip" : "update");
      Tensor scalars = step_scalars(lr, step, gs, skip);
      const int64_t n = 4099;
      Tensor g = Tensor::random(dt, {n}, rng), w = Tensor::random(DType::kF32, {n}, rng);
      Tensor m = Tensor::random(DType::kF32, {n}, rng),
             v = Tensor::random(DType::kF32, {n}, rng, 0, 1), p(dt, {n});
      // adamw_step: attrs with other lr, grad scale and step, against attrs with the scalars'.
      ops::AdamWAttrs stale{9e-1f, 0.9f, 0.95f, 1e-8f, 0.1f, 3.0f, 1};
      ops::AdamWAttrs fresh{static_cast<float>(lr), 0.9f, 0.95f, 1e-8f, 0.1f,
                            static_cast<float>(gs), step};
      std::vector<Tensor> a = {w, m, v, p}, b = a;
      run(ops::kAdamWStep, name, dt, {&g, &scalars}, {&a[0], &a[1], &a[2], &a[3]}, &stale);
      if (!skip) run(ops::kAdamWStep, name, dt, {&g}, {&b[0], &b[1], &b[2], &b[3]}, &fresh);
      for (size_t j = 0; j < a.size(); ++j)
        EXPECT_TRUE(same_bits(a[j], b[j])) << "adamw_step output " << j;
      if (!skip) {
        EXPECT_FALSE(same_bits(a[0], w)) << "adamw_step: the master did not move";
      }
      // adamw_step_multi: every shard reads the one set of scalars.
      MultiCase c(dt, 1, rng);
      std::vector<Tensor> multi = c.outs, single = c.outs;
      std::vector<Tensor*> in, out;
      for (Tensor& t : c.grads) in.push_back(&t);
      in.push_back(&scalars);
      for (Tensor& t : multi) out.push_back(&t);
      run(ops::kAdamWStepMulti, name, dt, in, out, &c.attrs);
      for (int i = 0; i < c.attrs.count && !skip; ++i) {
        ops::AdamWAttrs at = c.single(i);
        at.lr = static_cast<float>(lr);
        at.grad_scale = static_cast<float>(gs);
        at.step = step;
        run(ops::kAdamWStep, name, dt, {&c.grads[i]},
            {&single[4 * i], &single[4 * i + 1], &single[4 * i + 2], &single[4 * i + 3]}, &at);
      }
      for (size_t j = 0; j < multi.size(); ++j)
        EXPECT_TRUE(same_bits(multi[j], single[j]))
            << "adamw_step_multi shard " << j / 4 << " output " << j % 4;
      // sgd_step with momentum: step 1 starts the buffer, so the step must come from the
      // scalars too (the stale attrs say step 1).
      ops::SgdAttrs sgd_stale{0.5f, 0.9f, 0.01f, 3.0f, 1, 1};
      ops::SgdAttrs sgd_fresh{static_cast<float>(lr), 0.9f, 0.01f, static_cast<float>(gs), 1, step};
      std::vector<Tensor> sa = {w, m, p}, sb = sa;
      run(ops::kSgdStep, name, dt, {&g, &scalars}, {&sa[0], &sa[1], &sa[2]}, &sgd_stale);
      if (!skip) run(ops::kSgdStep, name, dt, {&g}, {&sb[0], &sb[1], &sb[2]}, &sgd_fresh);
      for (size_t j = 0; j < sa.size(); ++j)
        EXPECT_TRUE(same_bits(sa[j], sb[j])) << "sgd_step output " << j;
    }
  }
}

// The same calls with step scalars, fast against reference and (with a GPU) the CUDA kernels
// against the reference: with the skip flag, and without.
TEST_P(OptimTest, StepScalarsFastAndDeviceMatchReference) {
  std::mt19937 rng(7);
  const DType dt = GetParam();
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "skip" : "update");
    Tensor scalars = step_scalars(2.5e-3, 5, 0.37, skip);
    const int64_t n = 4099;
    Tensor g = Tensor::random(dt, {n}, rng), w = Tensor::random(DType::kF32, {n}, rng);
    Tensor m = Tensor::random(DType::kF32, {n}, rng),
           v = Tensor::random(DType::kF32, {n}, rng, 0, 1);
    ops::AdamWAttrs aw{9e-1f, 0.9f, 0.95f, 1e-8f, 0.1f, 3.0f, 1};
    expect_fast_matches_ref(ops::kAdamWStep, dt, {g, scalars}, {w, m, v, Tensor(dt, {n})}, &aw,
                            "with step scalars");
    ops::SgdAttrs sg{0.5f, 0.9f, 0.01f, 3.0f, 1, 1};
    expect_fast_matches_ref(ops::kSgdStep, dt, {g, scalars}, {w, m, Tensor(dt, {n})}, &sg,
                            "with step scalars");
    MultiCase c(dt, 1, rng);
    std::vector<Tensor> in = c.grads;
    in.push_back(scalars);
    expect_fast_matches_ref(ops::kAdamWStepMulti, dt, in, c.outs, &c.attrs, "with step scalars");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OptimTest, ::testing::ValuesIn(float_dtypes()), dtype_param_name);

// grad_norm_clip against the formula written out here: norm = sqrt(sumsq) / divisor; the
// gradient scale times max_norm / (norm + 1e-6) when that is below 1; the skip flag for a
// non-finite norm or when already set (then the scale is left alone).
TEST(GradNormClip, NormClippingAndSkipFollowTheFormula) {
  struct Case {
    double sumsq, divisor, max_norm, scale;
    bool skip_in;
  };
  const Case cases[] = {
      {16.0, 2.0, 1.0, 0.5, false},           // norm 2 > 1: clipped
      {16.0, 2.0, 3.0, 0.5, false},           // norm 2 < 3: unclipped
      {16.0, 2.0, 0.0, 0.5, false},           // no clipping
      {0.0, 1.0, 1.0, 1.0, false},            // zero gradients
      {1e300 * 1e300, 1.0, 1.0, 1.0, false},  // inf: skip
      {NAN, 4.0, 1.0, 1.0, false},            // NaN: skip
      {16.0, 2.0, 1.0, 0.5, true},            // the loss was not finite: skip, scale kept
  };
  for (const Case& c : cases) {
    Tensor sumsq = Tensor::filled(DType::kF64, {1}, c.sumsq);
    Tensor s = step_scalars(1e-3, 7, c.scale, c.skip_in);
    s.set(ops::kStepNormDivisor, c.divisor);
    ops::GradNormClipAttrs at{c.max_norm};
    run_ref(ops::kGradNormClip, DType::kF64, {&sumsq}, {&s}, &at);
    const double norm = std::sqrt(c.sumsq) / c.divisor;
    const bool skip = c.skip_in || !std::isfinite(norm);
    double scale = c.scale;
    if (!skip && c.max_norm > 0 && c.max_norm / (norm + 1e-6) < 1)
      scale *= c.max_norm / (norm + 1e-6);
    std::printf("sumsq %g divisor %g max_norm %g: norm %g skip %g scale %.17g (expected %.17g)\n",
                c.sumsq, c.divisor, c.max_norm, s.get(ops::kStepGradNorm), s.get(ops::kStepSkip),
                s.get(ops::kStepGradScale), scale);
    if (std::isnan(norm))
      EXPECT_TRUE(std::isnan(s.get(ops::kStepGradNorm)));
    else
      EXPECT_EQ(s.get(ops::kStepGradNorm), norm);
    EXPECT_EQ(s.get(ops::kStepSkip), skip ? 1.0 : 0.0);
    EXPECT_EQ(s.get(ops::kStepGradScale), scale);
    EXPECT_EQ(s.get(ops::kStepLr), 1e-3);  // the rest untouched
    EXPECT_EQ(s.get(ops::kStepIndex), 7.0);
  }
  // The fast kernel and (with a GPU) the CUDA kernel on the clipped case.
  Tensor clip_sumsq = Tensor::filled(DType::kF64, {1}, 16.0);
  Tensor clip_s = step_scalars(1e-3, 7, 0.5, false);
  clip_s.set(ops::kStepNormDivisor, 2.0);
  ops::GradNormClipAttrs clip_at{1.0};
  expect_fast_matches_ref(ops::kGradNormClip, DType::kF64, {clip_sumsq}, {clip_s}, &clip_at);
  // A bad call is declined by supports and names the fix when run.
  Tensor sumsq = Tensor::filled(DType::kF64, {1}, 1), small = Tensor::filled(DType::kF64, {5}, 0);
  ops::GradNormClipAttrs at{1.0};
  CallHolder h({&sumsq}, {&small}, &at);
  const KernelDesc& kd = kernel(ops::kGradNormClip, DType::kF64, "cpu.ref");
  EXPECT_FALSE(kd.supports(&h.call));
  Status st = kd.fn(&h.call);
  EXPECT_EQ(st.code, Code::kInvalidArgument);
  std::string msg = take_message(&st);
  std::printf("%s\n", msg.c_str());
  EXPECT_NE(msg.find("grad_norm_clip: output 0 (step_scalars) has shape (5), expected "
                     "(kStepScalarCount) = (6)"),
            std::string::npos)
      << msg;
}

// The steps' costs count the bytes they move: each input read, each state (master, moments,
// momentum buffer) read and written, the param copy written (bf16 moments and param here).
TEST(OptimCost, StatesAreReadAndWritten) {
  const double n = 10;
  Tensor g(DType::kF32, {10}), w(DType::kF32, {10}), m(DType::kBF16, {10}), v(DType::kBF16, {10}),
      p(DType::kBF16, {10});
  ops::AdamWAttrs at{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1};
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    CallHolder h({&g}, {&w, &m, &v, &p}, &at);
    OpCost c{};
    ASSERT_EQ(kernel(ops::kAdamWStep, DType::kF32, name).cost(&h.call, &c).code, Code::kOk);
    EXPECT_EQ(c.bytes_read, n * (4 + 4 + 2 + 2)) << name;     // grad, master, exp_avg, exp_avg_sq
    EXPECT_EQ(c.bytes_written, n * (4 + 2 + 2 + 2)) << name;  // master, moments, param
    EXPECT_EQ(c.flops, 12 * n) << name;
    // Two shards in one call: the sum of two single calls.
    const float decay[2] = {0.0f, 0.1f};
    ops::AdamWMultiAttrs mat{1e-3f, 0.9f, 0.999f, 1e-8f, 1.0f, 2, 1, decay};
    CallHolder hm({&g, &g}, {&w, &m, &v, &p, &w, &m, &v, &p}, &mat);
    OpCost cm{};
    ASSERT_EQ(kernel(ops::kAdamWStepMulti, DType::kF32, name).cost(&hm.call, &cm).code, Code::kOk);
    EXPECT_EQ(cm.bytes_read, 2 * c.bytes_read) << name;
    EXPECT_EQ(cm.bytes_written, 2 * c.bytes_written) << name;
    // SGD with momentum: master and buffer read and written, the param written.
    Tensor buf(DType::kF32, {10});
    ops::SgdAttrs sat{};
    sat.lr = 0.1f;
    sat.momentum = 0.9f;
    sat.grad_scale = 1.0f;
    sat.step = 1;
    CallHolder hs({&g}, {&w, &buf, &p}, &sat);
    OpCost cs{};
    ASSERT_EQ(kernel(ops::kSgdStep, DType::kF32, name).cost(&hs.call, &cs).code, Code::kOk);
    EXPECT_EQ(cs.bytes_read, n * (4 + 4 + 4)) << name;
    EXPECT_EQ(cs.bytes_written, n * (4 + 4 + 2)) << name;
  }
}

TEST(OptimErrors, ZeroStepAndWrongStateShape) {
  Tensor g(DType::kF32, {4}), w(DType::kF32, {4}), m(DType::kF32, {4}), v(DType::kF32, {3}), none;
  ops::AdamWAttrs at{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1};
  Status s = call_kernel(ops::kAdamWStep, "cpu.ref", DType::kF32, {&g}, {&w, &m, &v, &none}, &at);
  EXPECT_NE(s.code, Code::kOk);
  status_release(&s);
  const KernelDesc& k = kernel(ops::kAdamWStep, DType::kF32, "cpu.ref");
  CallHolder h({&g}, {&w, &m, &v, &none}, &at);
  s = k.fn(&h.call);
  EXPECT_NE(take_message(&s).find("adamw_step: output 2 (exp_avg_sq) has shape (3)"),
            std::string::npos);
  Tensor v4(DType::kF32, {4});
  at.step = 0;
  CallHolder h2({&g}, {&w, &m, &v4, &none}, &at);
  s = k.fn(&h2.call);
  EXPECT_EQ(take_message(&s), "adamw_step: step = 0 must be >= 1 (1-based)");
  // A moment in f16 (Megatron's f16 moments need a scale per tensor): refused by name.
  Tensor m16(DType::kF16, {4});
  at.step = 1;
  CallHolder h3({&g}, {&w, &m16, &v4, &none}, &at);
  EXPECT_FALSE(k.supports(&h3.call));
  s = k.fn(&h3.call);
  EXPECT_EQ(take_message(&s),
            "adamw_step: output 1 (exp_avg) has dtype f16, expected f32 or bf16 (a moment is "
            "kept in f32, or in bf16 as Megatron's precision-aware optimizer keeps it)");
}

}  // namespace
}  // namespace loom::kernels::cpu::testing

namespace loom::kernels::cpu::testing {
namespace {

// The message of a bad adamw_step_multi call (cpu.ref and cpu.fast give the same one).
std::string multi_error(std::vector<Tensor*> in, std::vector<Tensor*> out,
                        const ops::AdamWMultiAttrs& at) {
  std::string messages[2];
  int k = 0;
  for (const char* name : {"cpu.ref", "cpu.fast"}) {
    CallHolder h(in, out, &at);
    const KernelDesc& kd = kernel(ops::kAdamWStepMulti, DType::kF32, name);
    EXPECT_FALSE(kd.supports(&h.call)) << name;
    Status s = kd.fn(&h.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument) << name;
    messages[k++] = take_message(&s);
  }
  EXPECT_EQ(messages[0], messages[1]);
  return messages[0];
}

TEST(OptimErrors, AdamWMultiBadCallsNameTheShardAndTheFix) {
  Tensor g0(DType::kF32, {4}), g1(DType::kF32, {6}), bf(DType::kBF16, {6}), none;
  std::vector<Tensor> s0, s1;
  for (int i = 0; i < 3; ++i) s0.emplace_back(DType::kF32, std::vector<int64_t>{4});
  for (int i = 0; i < 3; ++i) s1.emplace_back(DType::kF32, std::vector<int64_t>{6});
  Tensor short_v(DType::kF32, {5});
  float decay[2] = {0.1f, 0.0f};
  ops::AdamWMultiAttrs at{1e-3f, 0.9f, 0.999f, 1e-8f, 1.0f, 2, 1, decay};
  std::vector<Tensor*> good_out = {&s0[0], &s0[1], &s0[2], &none, &s1[0], &s1[1], &s1[2], &none};

  std::vector<Tensor*> bad_len = good_out;
  bad_len[5] = &short_v;  // shard 1's exp_avg
  EXPECT_EQ(multi_error({&g0, &g1}, bad_len, at),
            "adamw_step_multi: output 5 (exp_avg[1]) has shape (5) (5 elements), expected "
            "grad[1]'s shape with 6 elements");

  std::vector<Tensor*> seven(good_out.begin(), good_out.end() - 1);
  EXPECT_EQ(multi_error({&g0, &g1}, seven, at),
            "adamw_step_multi: 2 grads (inputs) need 4 * 2 = 8 outputs (master, exp_avg, "
            "exp_avg_sq and param or an empty view, per shard), got 7");

  ops::AdamWMultiAttrs no_decay = at;
  no_decay.weight_decay = nullptr;
  EXPECT_EQ(multi_error({&g0, &g1}, good_out, no_decay),
            "adamw_step_multi: attrs weight_decay is null: point it to count floats in host "
            "memory, one per shard (0 for a shard without weight decay)");

  ops::AdamWMultiAttrs three = at;
  three.count = 3;
  EXPECT_EQ(multi_error({&g0, &g1}, good_out, three),
            "adamw_step_multi: attrs count = 3 but the call has 2 grads (inputs): set count to "
            "the number of shards");

  EXPECT_EQ(multi_error({&g0, &bf}, good_out, at),
            "adamw_step_multi: input 1 (grad[1]) has dtype bf16 but grad[0] has f32: the op is "
            "keyed on one gradient dtype, call it once per dtype");

  ops::AdamWMultiAttrs zero = at;
  zero.count = 0;
  EXPECT_EQ(multi_error({}, {}, zero),
            "adamw_step_multi: needs at least one shard (got 0 grads): skip the call when there "
            "is nothing to update");

  ops::AdamWMultiAttrs step0 = at;
  step0.step = 0;
  EXPECT_EQ(multi_error({&g0, &g1}, good_out, step0),
            "adamw_step_multi: step = 0 must be >= 1 (1-based)");

  // A good call passes the same checks.
  CallHolder h({&g0, &g1}, good_out, &at);
  EXPECT_TRUE(kernel(ops::kAdamWStepMulti, DType::kF32, "cpu.ref").supports(&h.call));
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
