// A diagnostic for `compute-sanitizer --tool initcheck` (run by gpu_bundle/run.sh, not a
// test): does initcheck see the writes of loom's cuBLASLt GEMM?
//
// initcheck reports ~11,800 "uninitialised __global__ memory reads" of 8 bytes in
// bias_add_kernel<bf16, bf16, true> during device_test's tiny GPT on an H200 (memcheck: 0
// errors). bias_add reads Y (N, C), a pack of 4 columns of a row at a time (in bounds: c < C / 4
// packs, y + n * C + 4 c, kernels/cuda/elementwise/bias.cu), and the bias (C). In a Linear, Y is
// the output the GEMM just wrote with beta = 0 (sdk/include/loom/cpp/nn/linear.h, forward).
// Hypothesis: the sm_90 cuBLASLt kernels store their output through TMA (bulk tensor stores
// from shared memory), which initcheck does not track, so every first read of a GEMM output
// looks uninitialised, and bias_add is that first reader. Each phase runs in its own process
// (one initcheck run each, errors counted by the caller):
//
//   control_memset  Y zero-filled by cudaMemset, bias uploaded; bias_add      -> 0 expected
//   control_bias    bias cudaMalloc'ed and never written; bias_add            -> errors
//                   expected (initcheck does see bias_add's reads)
//   gemm_bias       Y fresh; gemm (beta 0) writes Y; bias_add                 -> 0 if the
//                   writes are tracked; errors in bias_add = the hypothesis
//   gemm_copy       Y fresh; gemm writes Y; cudaMemcpy of Y to the host       -> a host API
//                   "uninitialized access" on the copy = the same, without any loom kernel
//   memset_gemm_bias  Y zero-filled, then gemm, then bias_add                 -> 0 (a fill
//                   before the GEMM hides it)
//
// loom's GEMMs mark what cuBLASLt wrote for initcheck through NVTX (mark_written in
// kernels/cuda/gemm/cublaslt.cuh; taken with `compute-sanitizer --nvtx yes`): run the phases
// above with LOOM_NVTX_MARK=0 to see what initcheck sees by itself, and gemm_bias with the
// marks on to check the remedy (0 errors expected).
//
//   initcheck_probe PHASE [M N K]   (default 32 96 32: device_test's QKV projection, bf16)
#include <cuda_runtime.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/gemm/gemm.h"

namespace {

using namespace loom;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "initcheck_probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

const KernelDesc& find(const std::vector<KernelDesc>& ks, const char* op, DType t) {
  for (const KernelDesc& k : ks)
    if (std::strcmp(k.op, op) == 0 && k.dtype == t && std::strcmp(k.name, "cuda") == 0) return k;
  std::fprintf(stderr, "initcheck_probe: no cuda kernel for %s\n", op);
  std::exit(2);
}

TensorView view(void* p, std::vector<int64_t> shape) {
  TensorView v{};
  v.data = p;
  v.dtype = DType::kBF16;
  v.device = Device{DeviceType::kCuda, 0};
  v.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.strides[i] = stride;
    stride *= shape[i];
  }
  return v;
}

void run(const KernelDesc& k, std::vector<TensorView> in, std::vector<TensorView> out,
         const void* attrs, uint64_t attrs_size) {
  OpCall call{sizeof(OpCall),
              in.data(),
              static_cast<int32_t>(in.size()),
              out.data(),
              static_cast<int32_t>(out.size()),
              attrs,
              attrs_size,
              nullptr,
              nullptr,
              0};
  Status s = k.fn(&call);
  if (s.code != Code::kOk) {
    std::fprintf(stderr, "initcheck_probe: %s failed (code %d)\n", k.op, static_cast<int>(s.code));
    std::exit(2);
  }
}

void* upload_bf16(int64_t n, uint16_t bits) {
  std::vector<uint16_t> host(static_cast<size_t>(n), bits);
  void* p = nullptr;
  ok(cudaMalloc(&p, n * 2), "cudaMalloc");
  ok(cudaMemcpy(p, host.data(), n * 2, cudaMemcpyHostToDevice), "upload");
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 5) {
    std::fprintf(stderr, "usage: initcheck_probe PHASE [M N K]\n");
    return 2;
  }
  const std::string phase = argv[1];
  const int64_t m = argc == 5 ? std::atoll(argv[2]) : 32, n = argc == 5 ? std::atoll(argv[3]) : 96,
                k = argc == 5 ? std::atoll(argv[4]) : 32;
  std::vector<KernelDesc> ks;
  loom::kernels::cuda::add_gemm_kernels(ks);
  loom::kernels::cuda::add_elementwise_kernels(ks);
  const KernelDesc& gemm = find(ks, ops::kGemm, DType::kBF16);
  const KernelDesc& bias_add = find(ks, ops::kBiasAdd, DType::kBF16);

  void *x = upload_bf16(m * k, 0x3c00), *w = upload_bf16(n * k, 0x3c00);  // 0.0078125
  void *y = nullptr, *bias = nullptr;
  ok(cudaMalloc(&y, m * n * 2), "cudaMalloc(Y)");
  if (phase == "control_bias")
    ok(cudaMalloc(&bias, n * 2), "cudaMalloc(bias)");  // never written, on purpose
  else
    bias = upload_bf16(n, 0x3f80);  // 1.0
  std::printf("initcheck_probe %s: (M, N, K) = (%lld, %lld, %lld); Y at %p..%p, bias at %p..%p\n",
              phase.c_str(), static_cast<long long>(m), static_cast<long long>(n),
              static_cast<long long>(k), y, static_cast<char*>(y) + m * n * 2, bias,
              static_cast<char*>(bias) + n * 2);
  const ops::GemmAttrs at{0, 1, 1.0f, 0.0f};  // Y = X @ W^T, as a Linear's forward
  auto do_gemm = [&] {
    run(gemm, {view(x, {m, k}), view(w, {n, k})}, {view(y, {m, n})}, &at, sizeof at);
  };
  auto do_bias = [&] { run(bias_add, {view(bias, {n})}, {view(y, {m, n})}, nullptr, 0); };
  if (phase == "control_memset" || phase == "control_bias") {
    ok(cudaMemset(y, 0, m * n * 2), "cudaMemset(Y)");
    do_bias();
  } else if (phase == "gemm_bias") {
    do_gemm();
    do_bias();
  } else if (phase == "gemm_copy") {
    do_gemm();
    std::vector<uint16_t> host(static_cast<size_t>(m * n));
    ok(cudaMemcpy(host.data(), y, m * n * 2, cudaMemcpyDeviceToHost), "download");
  } else if (phase == "memset_gemm_bias") {
    ok(cudaMemset(y, 0, m * n * 2), "cudaMemset(Y)");
    do_gemm();
    do_bias();
  } else {
    std::fprintf(stderr, "initcheck_probe: unknown phase '%s'\n", phase.c_str());
    return 2;
  }
  ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::printf("initcheck_probe %s: done\n", phase.c_str());
  return 0;
}
