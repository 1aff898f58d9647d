// The op-test harness of the CPU kernels (TransformerEngine / ggml test-backend-ops style):
// host tensors of any dtype, one per-dtype tolerance table, calls through the KernelDesc
// function pointers exactly as modules make them, fast-vs-reference comparison, and a
// finite-difference gradient for checking backward ops.
#pragma once

#include <gtest/gtest.h>
#include <loom/cpp/error.h>
#include <loom/cpp/fp8.h>
#include <loom/cpp/half.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "tests/kernels/device_backend.h"

namespace loom::kernels::cpu::testing {

// ---- The one tolerance table: |actual - expected| <= atol + rtol * |expected| ------------

struct Tolerance {
  double rtol, atol;
};

inline Tolerance tolerance(DType t) {
  switch (t) {
    case DType::kF32:
      return {1e-4, 1e-5};
    case DType::kBF16:  // 8 mantissa bits: one rounding of the output is 2^-8 = 0.4%
      return {1.6e-2, 1e-2};
    case DType::kF16:  // 11 bits: 2^-11 = 0.05%
      return {2e-3, 1e-3};
    // f64, 53 bits (2^-53 = 1.1e-16): sums of ~100 terms in another order (BLAS, a device, a
    // long double oracle) differ by a few ulps of the terms' magnitude.
    case DType::kF64:
      return {1e-12, 1e-13};
    case DType::kF8E4M3:  // fp8 ops: quantised values must match exactly (one FP8 step is
    case DType::kF8E5M2:  // 6-25%), f32 GEMM sums to f32 rounding of their order
      return {1e-4, 1e-5};
    default:
      return {0.0, 0.0};
  }
}

inline const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> t = {DType::kF32, DType::kBF16, DType::kF16};
  return t;
}

inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return dtype_name(info.param);
}

// ---- Host tensors ----------------------------------------------------------------------

class Tensor {
 public:
  Tensor() = default;  // empty: an absent optional
  Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    size_t bytes = static_cast<size_t>(numel()) * dtype_size(dtype_);
    storage_.assign((bytes + 7) / 8 + 1, 0);
  }
  static Tensor random(DType dtype, std::vector<int64_t> shape, std::mt19937& rng, double lo = -1.0,
                       double hi = 1.0) {
    Tensor t(dtype, std::move(shape));
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
    return t;
  }
  static Tensor filled(DType dtype, std::vector<int64_t> shape, double value) {
    Tensor t(dtype, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
    return t;
  }
  static Tensor i32(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
    Tensor t(DType::kI32, std::move(shape));
    EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
    std::memcpy(t.raw(), values.data(), values.size() * 4);
    return t;
  }

  bool empty() const { return dtype_ == DType::kInvalid; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  void* raw() { return storage_.data(); }
  const void* raw() const { return storage_.data(); }

  // Value of element i as a double (rounded to the dtype on set).
  double get(int64_t i) const {
    const void* p = storage_.data();
    switch (dtype_) {
      case DType::kF32:
        return static_cast<const float*>(p)[i];
      case DType::kBF16:
        return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
      case DType::kF16:
        return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
      case DType::kF64:
        return static_cast<const double*>(p)[i];
      case DType::kI32:
        return static_cast<const int32_t*>(p)[i];
      case DType::kF8E4M3:
      case DType::kF8E5M2:
        return fp8_to_f32(static_cast<const uint8_t*>(p)[i], dtype_);
      default:
        return NAN;
    }
  }
  void set(int64_t i, double v) {
    void* p = storage_.data();
    switch (dtype_) {
      case DType::kF32:
        static_cast<float*>(p)[i] = static_cast<float>(v);
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
        break;
      case DType::kF16:
        static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
        break;
      case DType::kF64:
        static_cast<double*>(p)[i] = v;
        break;
      case DType::kI32:
        static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
        break;
      case DType::kF8E4M3:
      case DType::kF8E5M2:
        static_cast<uint8_t*>(p)[i] = f32_to_fp8(static_cast<float>(v), dtype_);
        break;
      default:
        break;
    }
  }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) v[i] = get(i);
    return v;
  }

  TensorView view() {
    TensorView v{};
    v.device = Device{DeviceType::kCpu, 0};
    if (empty()) return v;  // data null, ndim 0: an absent optional
    v.data = storage_.data();
    v.dtype = dtype_;
    v.ndim = static_cast<int32_t>(shape_.size());
    int64_t stride = 1;
    for (int32_t d = v.ndim - 1; d >= 0; --d) {
      v.shape[d] = shape_[d];
      v.strides[d] = stride;
      stride *= shape_[d];
    }
    return v;
  }

 private:
  DType dtype_ = DType::kInvalid;
  std::vector<int64_t> shape_;
  std::vector<uint64_t> storage_;  // 8-byte aligned; one spare word
};

// ---- Calling kernels -------------------------------------------------------------------

struct NoAttrs {};

// Builds the OpCall (the views live in `holder`).
struct CallHolder {
  std::vector<TensorView> in, out;
  OpCall call{};
  template <class A>
  CallHolder(const std::vector<Tensor*>& inputs, const std::vector<Tensor*>& outputs,
             const A* attrs) {
    for (Tensor* t : inputs) in.push_back(t->view());
    for (Tensor* t : outputs) out.push_back(t->view());
    call.struct_size = sizeof(OpCall);
    call.inputs = in.data();
    call.num_inputs = static_cast<int32_t>(in.size());
    call.outputs = out.data();
    call.num_outputs = static_cast<int32_t>(out.size());
    call.attrs = std::is_same_v<A, NoAttrs> ? nullptr : attrs;
    call.attrs_size = std::is_same_v<A, NoAttrs> ? 0 : sizeof(A);
  }
};

inline const KernelDesc& kernel(const char* op, DType key, const char* name) {
  const KernelDesc* k = find_kernel(op, key, name);
  if (k == nullptr) {
    ADD_FAILURE() << "no kernel " << name << " for " << op << " (" << dtype_name(key) << ")";
    static const KernelDesc none{};
    return none;
  }
  return *k;
}

// Runs kernel `name` of `op` keyed on `key`; returns its status (caller releases).
template <class A = NoAttrs>
Status call_kernel(const char* op, const char* name, DType key, const std::vector<Tensor*>& in,
                   const std::vector<Tensor*>& out, const A* attrs = nullptr) {
  const KernelDesc& k = kernel(op, key, name);
  if (k.fn == nullptr) return make_status(Code::kNotFound, "kernel missing");
  CallHolder h(in, out, attrs);
  if (k.supports != nullptr && !k.supports(&h.call))
    return make_status(Code::kUnimplemented,
                       (std::string(name) + " does not support this call").c_str());
  return k.fn(&h.call);
}

// Same, expecting success.
template <class A = NoAttrs>
void run(const char* op, const char* name, DType key, const std::vector<Tensor*>& in,
         const std::vector<Tensor*>& out, const A* attrs = nullptr) {
  Status s = call_kernel(op, name, key, in, out, attrs);
  EXPECT_EQ(s.code, Code::kOk) << op << " " << name << ": " << take_message(&s);
  status_release(&s);
}
template <class A = NoAttrs>
void run_ref(const char* op, DType key, const std::vector<Tensor*>& in,
             const std::vector<Tensor*>& out, const A* attrs = nullptr) {
  run(op, "cpu.ref", key, in, out, attrs);
}

// ---- Comparing -------------------------------------------------------------------------

inline void expect_close(const std::vector<double>& actual, const std::vector<double>& expected,
                         Tolerance tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    bool ok = (a == e) || (std::isnan(a) && std::isnan(e)) ||
              std::fabs(a - e) <= tol.atol + tol.rtol * std::fabs(e);
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected " << e << " (|diff| "
                    << std::fabs(a - e) << ", rtol " << tol.rtol << ", atol " << tol.atol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << actual.size() << " elements differ";
}

// The largest absolute and relative (to max(|expected|, 1e-300)) differences, printed as
// "[error] what: max abs A, max rel R" so that a test's log shows the precision achieved.
struct MaxError {
  double abs = 0, rel = 0;
};
inline MaxError report_error(const std::vector<double>& actual, const std::vector<double>& expected,
                             const std::string& what) {
  MaxError m;
  for (size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    const double d = std::fabs(actual[i] - expected[i]);
    m.abs = std::max(m.abs, d);
    m.rel = std::max(m.rel, d / std::max(std::fabs(expected[i]), 1e-300));
  }
  std::printf("[error] %s: max abs %.3g, max rel %.3g\n", what.c_str(), m.abs, m.rel);
  return m;
}

inline void expect_close(const Tensor& actual, const std::vector<double>& expected, DType tol_dtype,
                         const std::string& what) {
  expect_close(actual.values(), expected, tolerance(tol_dtype), what);
}

// Runs kernel `k` on `backend`'s device with device copies of `inputs` and of the initial
// `outputs`; returns the outputs as the kernel left them, or nothing when the kernel declines
// the call (`supports`) or fails, either a test failure naming `label`.
template <class A = NoAttrs>
std::vector<Tensor> run_on_device(::loom::kernels::testing::DeviceBackend& backend,
                                  const KernelDesc& k, std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& outputs, const A* attrs,
                                  const std::string& label) {
  std::vector<void*> owned;
  Device device{backend.device_type(), 0};
  auto to_device = [&](Tensor& t) {
    TensorView v = t.view();
    v.device = device;
    if (v.data != nullptr) {
      v.data = backend.upload(v.data, static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
      owned.push_back(v.data);
    }
    return v;
  };
  std::vector<Tensor> result = outputs;
  std::vector<TensorView> in, out;
  for (Tensor& t : inputs) in.push_back(to_device(t));
  for (Tensor& t : result) out.push_back(to_device(t));
  OpCall call{};
  call.struct_size = sizeof(OpCall);
  call.inputs = in.data();
  call.num_inputs = static_cast<int32_t>(in.size());
  call.outputs = out.data();
  call.num_outputs = static_cast<int32_t>(out.size());
  call.attrs = std::is_same_v<A, NoAttrs> ? nullptr : attrs;
  call.attrs_size = std::is_same_v<A, NoAttrs> ? 0 : sizeof(A);
  if (k.workspace != nullptr) {
    call.workspace_bytes = k.workspace(&call);
    call.workspace = backend.scratch(static_cast<size_t>(call.workspace_bytes));
    owned.push_back(call.workspace);
  }
  bool ok = false;
  if (k.supports != nullptr && !k.supports(&call)) {
    ADD_FAILURE() << label << ": kernel " << k.name << " declines the call";
  } else {
    Status st = k.fn(&call);
    ok = st.code == Code::kOk;
    EXPECT_TRUE(ok) << label << ": kernel " << k.name << ": " << take_message(&st);
    status_release(&st);
    for (size_t i = 0; ok && i < result.size(); ++i)
      if (!result[i].empty() && out[i].data != nullptr)
        backend.download(result[i].raw(), out[i].data,
                         static_cast<size_t>(result[i].numel()) * dtype_size(result[i].dtype()));
  }
  for (void* p : owned) backend.release(p);
  return ok ? result : std::vector<Tensor>{};
}

// Runs `op` on `backend`'s device (when it has one) with device copies of `inputs` and of
// the initial `outputs`, and compares each output with `expected` (cpu.ref's).
template <class A = NoAttrs>
void expect_device_matches(::loom::kernels::testing::DeviceBackend& backend, const char* op,
                           DType key, std::vector<Tensor>& inputs,
                           const std::vector<Tensor>& outputs, const std::vector<Tensor>& expected,
                           const A* attrs, const std::string& what) {
  std::string why;
  if (!backend.available(&why)) return;  // said once, at the start of the binary
  std::string label = std::string(op) + " " + dtype_name(key) + " on " + backend.name();
  const KernelDesc* k = backend.kernel(op, key);
  if (k == nullptr) {
    ADD_FAILURE() << label << ": the " << backend.name() << " library has no kernel for it";
    return;
  }
  std::vector<Tensor> result =
      run_on_device(backend, *k, inputs, outputs, attrs, label + " " + what);
  for (size_t i = 0; i < result.size(); ++i)
    if (!result[i].empty()) {
      if (key == DType::kF64)  // the f64 ops' achieved precision, in the GPU session's log
        report_error(result[i].values(), expected[i].values(),
                     label + " output " + std::to_string(i) + " " + what);
      expect_close(result[i], expected[i].values(), key,
                   label + " output " + std::to_string(i) + " " + what);
    }
}

// Runs cpu.ref and cpu.fast of `op` on the same inputs and copies of the same initial
// outputs, and compares every output at the tolerance of `key`'s dtype.
template <class A = NoAttrs>
void expect_fast_matches_ref(const char* op, DType key, std::vector<Tensor> inputs,
                             const std::vector<Tensor>& outputs, const A* attrs = nullptr,
                             const std::string& what = "") {
  std::vector<Tensor> ref_out = outputs, fast_out = outputs;
  std::vector<Tensor*> in, ro, fo;
  for (Tensor& t : inputs) in.push_back(&t);
  for (Tensor& t : ref_out) ro.push_back(&t);
  for (Tensor& t : fast_out) fo.push_back(&t);
  {
    const KernelDesc& fast = kernel(op, key, "cpu.fast");
    ASSERT_NE(fast.supports, nullptr);
    CallHolder h(in, fo, attrs);
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
      GTEST_SKIP() << "this CPU lacks AVX2/FMA: cpu.fast declines, only cpu.ref runs";
    ASSERT_TRUE(fast.supports(&h.call)) << op << " cpu.fast declines " << what;
  }
  run(op, "cpu.ref", key, in, ro, attrs);
  run(op, "cpu.fast", key, in, fo, attrs);
  for (size_t i = 0; i < outputs.size(); ++i)
    if (!outputs[i].empty())
      expect_close(
          fast_out[i], ref_out[i].values(), key,
          std::string(op) + " " + dtype_name(key) + " output " + std::to_string(i) + " " + what);
  // Every other device linked into this binary (device_backend.h), on the same inputs and
  // initial outputs, against the same reference at the same tolerance.
  for (::loom::kernels::testing::DeviceBackend* b : ::loom::kernels::testing::device_backends())
    expect_device_matches(*b, op, key, inputs, outputs, ref_out, attrs, what);
}

// ---- Vocab-parallel shards -------------------------------------------------------------

// Boundaries b[0] = 0 <= b[1] <= ... <= b[p] = v of p uneven shards of v rows (shard k holds
// [b[k], b[k+1]); the first ones are small, and empty when v < p * p).
inline std::vector<int64_t> uneven_split(int64_t v, int64_t p) {
  std::vector<int64_t> b(static_cast<size_t>(p + 1));
  for (int64_t k = 0; k <= p; ++k) b[k] = v * k * k / (p * p);
  return b;
}

// ---- Finite differences ----------------------------------------------------------------

// Gradient of L(x) = sum_i w_i f(x)_i by central differences, f evaluated by `forward`
// (which reads x). x must be f32.
inline std::vector<double> numeric_grad(Tensor& x, const std::vector<double>& w,
                                        const std::function<std::vector<double>()>& forward,
                                        double eps = 1e-2) {
  std::vector<double> grad(static_cast<size_t>(x.numel()));
  auto loss = [&] {
    std::vector<double> y = forward();
    double l = 0.0;
    for (size_t i = 0; i < y.size(); ++i) l += w[i] * y[i];
    return l;
  };
  for (int64_t i = 0; i < x.numel(); ++i) {
    double x0 = x.get(i);
    x.set(i, x0 + eps);
    double up = loss();
    x.set(i, x0 - eps);
    double down = loss();
    x.set(i, x0);
    grad[i] = (up - down) / (2 * eps);
  }
  return grad;
}

// Tolerance of finite-difference checks (f32 kernels, eps 1e-2: O(eps^2) truncation plus
// f32 rounding of the forward divided by 2 eps).
inline Tolerance fd_tolerance() { return {2e-2, 2e-3}; }

inline std::vector<double> random_weights(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> w(n);
  for (double& x : w) x = u(rng);
  return w;
}

}  // namespace loom::kernels::cpu::testing
