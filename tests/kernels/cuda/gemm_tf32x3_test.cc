// The 3xTF32 kernels ("cuda.tf32x3" of gemm and gemm_epilogue, kernels/cuda/gemm/tf32x3.cuh)
// on a GPU:
//   gemm           against a long double GEMM written here: the error relative to
//                  sum |alpha a b|, in registers (the kernel as registered, and the driver's
//                  run_tf32x3 in that form) at f32 level (4e-7, or 4x the "cuda" f32
//                  kernel's) and over 30x under "cuda.tf32" on the same inputs; in the split
//                  form's two and three segments (with the workspace the kernel declares and
//                  without one: K in chunks of the stream scratch) at the level cuBLASLt's
//                  truncating tensor-core sums allow (2e-6, 20x under TF32); over transposes,
//                  batches, shared B, alpha, beta, both tiles and K split into ranges;
//   gemm_epilogue  every epilogue against the "cuda" kernel of the op on the same inputs
//                  (f32, tested against cpu.ref by the op tests) within 2e-6 relative.
// The method, the split kernel and the chunk plan are tested without a GPU in
// tests/kernels/cuda/gemm_emulation. Without a GPU every test here skips, saying why.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <loom/cpp/tensor.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/tf32x3_gemm.cuh"
#include "kernels/cuda/gemm/tf32x3_plan.h"

namespace loom::kernels::cuda {
namespace {

std::string why_no_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return "no CUDA device: the kernels are only compiled here";
  }
  return "";
}

#define REQUIRE_GPU()                      \
  do {                                     \
    std::string why = why_no_gpu();        \
    if (!why.empty()) GTEST_SKIP() << why; \
  } while (0)

const KernelDesc& kernel(const char* op, const char* name) {
  static const std::vector<KernelDesc> all = [] {
    std::vector<KernelDesc> out;
    add_gemm_kernels(out);
    return out;
  }();
  for (const KernelDesc& k : all)
    if (std::string(k.op) == op && k.dtype == DType::kF32 && std::string(k.name) == name) return k;
  ADD_FAILURE() << "no kernel " << name << " for " << op;
  static const KernelDesc none{};
  return none;
}

// An f32 tensor on the host and the device.
struct Buf {
  std::vector<int64_t> shape;
  std::vector<float> host;
  float* dev = nullptr;
  explicit Buf(std::vector<int64_t> s = {}) : shape(std::move(s)) {
    int64_t n = shape.empty() ? 0 : 1;
    for (int64_t d : shape) n *= d;
    host.assign(static_cast<size_t>(n), 0.0f);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { cudaFree(dev); }
  void upload() {
    cudaFree(dev);
    dev = nullptr;
    if (host.empty()) return;
    ASSERT_EQ(cudaMalloc(&dev, host.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> download() const {
    std::vector<float> out(host.size());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (!out.empty()) {
      EXPECT_EQ(cudaMemcpy(out.data(), dev, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }
  TensorView view() const {
    const Device cuda{DeviceType::kCuda, 0};
    if (shape.empty()) {
      TensorView v{};
      v.device = cuda;
      return v;
    }
    return make_view(dev, DType::kF32, shape.data(), static_cast<int32_t>(shape.size()), cuda);
  }
};

// Runs `k` as loom::Kernel does: the workspace it declares from cudaMalloc (unless
// `no_workspace`), then the call, then a synchronize.
void call(const KernelDesc& k, std::vector<TensorView> in, std::vector<TensorView> out,
          const void* attrs, size_t attrs_size, bool no_workspace = false) {
  OpCall c{sizeof(OpCall),
           in.data(),
           static_cast<int32_t>(in.size()),
           out.data(),
           static_cast<int32_t>(out.size()),
           attrs,
           attrs_size,
           nullptr,
           nullptr,
           0};
  const uint64_t bytes = k.workspace != nullptr && !no_workspace ? k.workspace(&c) : 0;
  if (bytes > 0) {
    ASSERT_EQ(cudaMalloc(&c.workspace, bytes), cudaSuccess);
    c.workspace_bytes = bytes;
  }
  const Status s = k.fn(&c);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(c.workspace);
  ASSERT_EQ(s.code, Code::kOk) << (s.message != nullptr ? s.message : "");
}

struct GemmCase {
  int64_t batch;  // 0: 2-D A
  bool shared_b;
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
  bool no_workspace;
};

TEST(Tf32x3Gemm, F32AccuracyAgainstLongDouble) {
  REQUIRE_GPU();
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const GemmCase cases[] = {
      {0, true, 2048, 256, 256, false, true, 1.0f, 0.0f, false},  // the default spec's proj
      {0, true, 2048, 768, 256, false, true, 1.0f, 0.0f, false},  // its QKV: the large tiles
      {0, true, 256, 256, 2048, true, false, 1.0f, 1.0f, false},  // a weight gradient: ranges
      {0, true, 256, 128, 6000, false, false, 1.0f, 0.0f, true},  // 2 chunks of the scratch
      // Two segments (the split far larger than Y), in one chunk and in two.
      {0, true, 64, 64, 30000, false, true, 1.0f, 0.0f, false},
      {0, true, 64, 64, 30000, true, false, 1.0f, 1.0f, true},
      {3, true, 65, 33, 129, false, false, -0.5f, 0.5f, false},
      {2, false, 17, 40, 300, true, true, 1.5f, 0.0f, false},
      {0, true, 7, 9, 5, false, true, 1.0f, 0.0f, false},  // K < 8
  };
  for (const GemmCase& c : cases) {
    const int64_t nb = std::max<int64_t>(c.batch, 1);
    std::vector<int64_t> sa =
        c.ta ? std::vector<int64_t>{c.k, c.m} : std::vector<int64_t>{c.m, c.k};
    std::vector<int64_t> sb =
        c.tb ? std::vector<int64_t>{c.n, c.k} : std::vector<int64_t>{c.k, c.n};
    std::vector<int64_t> sy = {c.m, c.n};
    if (c.batch > 0) {
      sa.insert(sa.begin(), c.batch);
      sy.insert(sy.begin(), c.batch);
      if (!c.shared_b) sb.insert(sb.begin(), c.batch);
    }
    Buf a(sa), b(sb), y(sy);
    for (float& v : a.host)
      v = nd(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 7) - 3));
    for (float& v : b.host) v = nd(rng) * 0.02f;
    for (float& v : y.host) v = nd(rng);
    a.upload();
    b.upload();
    // The oracle and the scale of its error bound.
    std::vector<long double> want(y.host.size());
    std::vector<double> scale(y.host.size());
    for (int64_t bi = 0; bi < nb; ++bi)
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          long double acc = 0;
          double mag = 0;
          for (int64_t t = 0; t < c.k; ++t) {
            const float av = a.host[bi * c.m * c.k + (c.ta ? t * c.m + i : i * c.k + t)];
            const int64_t b0 = c.shared_b ? 0 : bi * c.k * c.n;
            const float bv = b.host[b0 + (c.tb ? j * c.k + t : t * c.n + j)];
            acc += static_cast<long double>(av) * bv;
            mag += std::fabs(static_cast<double>(av) * bv);
          }
          const size_t at = static_cast<size_t>((bi * c.m + i) * c.n + j);
          want[at] = c.alpha * acc + static_cast<long double>(c.beta) * y.host[at];
          scale[at] = std::fabs(c.alpha) * mag + std::fabs(c.beta * y.host[at]);
        }
    const ops::GemmAttrs at{c.ta, c.tb, c.alpha, c.beta};
    auto error_of = [&](const char* name, bool no_ws) {
      y.upload();
      call(kernel(ops::kGemm, name), {a.view(), b.view()}, {y.view()}, &at, sizeof at, no_ws);
      const std::vector<float> got = y.download();
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])) / scale[i]);
      return worst;
    };
    gemm::Tf32x3Shape shape;
    shape.batch = nb;
    shape.m = c.m;
    shape.n = c.n;
    shape.k = c.k;
    shape.trans_a = c.ta;
    shape.trans_b = c.tb;
    shape.shared_b = c.shared_b;
    // The driver in one form: its workspace from cudaMalloc, as loom::Kernel would give it
    // (none with `no_workspace`: the split form then chunks K in the stream scratch).
    auto form_error = [&](gemm::Tf32x3Form form, int segments) {
      gemm::Tf32x3Shape s = shape;
      s.form = form;
      s.segments = segments;
      const size_t bytes = c.no_workspace ? 0 : gemm::tf32x3_workspace(s);
      void* ws = nullptr;
      if (bytes > 0) {
        EXPECT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
      }
      y.upload();
      try {
        gemm::run_tf32x3("gemm", s, a.dev, b.dev, y.dev, c.alpha, c.beta, nullptr, ws, bytes,
                         nullptr, 0);
      } catch (const std::exception& ex) {
        ADD_FAILURE() << ex.what();
      }
      const std::vector<float> got = y.download();
      cudaFree(ws);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])) / scale[i]);
      return worst;
    };
    const double tf32 = error_of("cuda.tf32", false);
    const double f32 = error_of("cuda", false);
    const struct {
      const char* name;
      double error;
      bool split;
    } runs[] = {
        {"cuda.tf32x3 as registered", error_of("cuda.tf32x3", c.no_workspace), false},
        {"in registers", form_error(gemm::Tf32x3Form::kInRegisters, 0), false},
        {"split, 2 segments", form_error(gemm::Tf32x3Form::kSplit, 2), true},
        {"split, 3 segments", form_error(gemm::Tf32x3Form::kSplit, 3), true},
    };
    for (const auto& r : runs) {
      std::printf(
          "batch %lld M %lld N %lld K %lld ta %d tb %d%s, %s: 3xTF32 %.3g, cuda (f32) %.3g, "
          "cuda.tf32 %.3g (of sum |a b|)\n",
          static_cast<long long>(c.batch), static_cast<long long>(c.m), static_cast<long long>(c.n),
          static_cast<long long>(c.k), c.ta, c.tb, c.no_workspace ? " (no workspace)" : "", r.name,
          r.error, f32, tf32);
      if (!r.split) {
        // In registers, f32 level: 4e-7 of sum |a b| (the emulation, with the tensor cores'
        // truncating sums modelled, gives at most 1.4e-7), or within 4x of loom's f32 GEMM on
        // the same inputs where its own error is larger.
        EXPECT_LE(r.error, std::max(4e-7, 4 * f32)) << r.name;
        EXPECT_GT(tf32, 30 * r.error) << r.name;
      } else {
        // The split form sums in cuBLASLt's TF32 matmuls, whose tensor cores truncate every
        // mma's sum with the accumulator as its addend: on an H200 (2026-11-29) 1.4e-7 to
        // 1.24e-6 of sum |a b| over these cases, where cuBLAS's f32 gives 2.4e-8 to 4.8e-7
        // (BENCHMARKS.md). Its claim is that level, 2e-6, and 20x under one TF32 GEMM (27x
        // at the least, at K 30000); it fails on a dropped cross term (TF32's 1e-4 level).
        EXPECT_LE(r.error, 2e-6) << r.name;
        EXPECT_GT(tf32, 20 * r.error) << r.name;
      }
    }
  }
}

TEST(Tf32x3GemmEpilogue, EveryEpilogueMatchesTheCudaKernel) {
  REQUIRE_GPU();
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  // (96, 80, 200): three segments, one matmul; (64, 64, 30000): two, the bias in the second.
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{96, 80, 200},
                                std::tuple<int64_t, int64_t, int64_t>{64, 64, 30000}})
    for (int32_t epilogue :
         {ops::kEpilogueBias, ops::kEpilogueGelu, ops::kEpilogueDGelu, ops::kEpilogueBiasGradA}) {
      const bool wgrad = epilogue == ops::kEpilogueBiasGradA;
      Buf a(wgrad ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k});
      Buf b({n, k}), bias({n}), p({m, n}), aux({m, n}), dbias({wgrad ? m : n});
      for (Buf* t : {&a, &b, &bias, &p})
        for (float& v : t->host) v = nd(rng);
      for (Buf* t : {&a, &b, &bias, &p}) t->upload();
      ops::GemmEpilogueAttrs at{};
      at.trans_a = wgrad;
      at.trans_b = 1;
      at.epilogue = epilogue;
      at.approximate = 1;
      at.beta = wgrad ? 1.0f : 0.0f;
      std::vector<float> results[2][3];
      const char* names[2] = {"cuda", "cuda.tf32x3"};
      for (int r = 0; r < 2; ++r) {
        Buf y({m, n});
        for (float& v : y.host) v = wgrad ? 0.25f : 0.0f;  // a weight gradient accumulates
        y.upload();
        aux.upload();
        dbias.upload();
        const TensorView none = Buf().view();
        // A, B, bias, P; Y, aux, dbias: each optional one where the epilogue takes it.
        const bool with_bias = epilogue == ops::kEpilogueBias || epilogue == ops::kEpilogueGelu;
        std::vector<TensorView> in = {a.view(), b.view(), with_bias ? bias.view() : none,
                                      epilogue == ops::kEpilogueDGelu ? p.view() : none};
        std::vector<TensorView> out = {
            y.view(), epilogue == ops::kEpilogueGelu ? aux.view() : none,
            epilogue == ops::kEpilogueDGelu || wgrad ? dbias.view() : none};
        call(kernel(ops::kGemmEpilogue, names[r]), in, out, &at, sizeof at);
        results[r][0] = y.download();
        results[r][1] = aux.download();
        results[r][2] = dbias.download();
      }
      double worst = 0;
      for (int o = 0; o < 3; ++o) {
        double mag = 1e-30;
        for (float v : results[0][o]) mag = std::max(mag, static_cast<double>(std::fabs(v)));
        for (size_t i = 0; i < results[0][o].size(); ++i)
          worst = std::max(worst, std::fabs(results[0][o][i] - results[1][o][i]) / mag);
      }
      std::printf(
          "gemm_epilogue %d (M %lld N %lld K %lld): cuda.tf32x3 against cuda, largest difference "
          "%.3g of the largest value\n",
          epilogue, static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
          worst);
      EXPECT_LE(worst, 2e-6) << "epilogue " << epilogue;
    }
}

}  // namespace
}  // namespace loom::kernels::cuda
