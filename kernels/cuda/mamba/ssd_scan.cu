// ssd_scan / ssd_scan_bwd (loom/ops/mamba.h): Mamba-2's selective state-space scan as SSD
// chunks, and its gradient. Device code, algorithm and launch geometry: ssd_scan_kernel.cuh.
//
// The chunk length is the attrs' chunk_size capped at kSsdMaxChunk, halved until a backward
// block's shared memory fits kSsdSmemBudget (about 99 KiB, what Ada's and Hopper's blocks may
// opt into); any length gives the same function. The backward runs four kernels on its
// workspace (ssd_scan_bwd_workspace: the chunk states, B * H * chunks * P * N f32, and the
// f32 accumulators of dB, dC and ddt): the forward state pass, the reverse chunk pass, the
// rounding of the accumulators into dxBC and ddt_in, and the ddt_bias sum.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/mamba.h>

#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/mamba/registry.cuh"
#include "kernels/cuda/mamba/ssd_scan_kernel.cuh"

namespace loom::kernels::cuda::mamba {
namespace {

inline constexpr int64_t kSsdSmemBudget = 99 * 1024;

op_checks::SsdScanShape check_fwd(const OpCall* c, bool s) {
  return op_checks::check_ssd_scan(c, s, DeviceType::kCuda);
}
op_checks::SsdScanShape check_bwd(const OpCall* c, bool s) {
  return op_checks::check_ssd_scan_bwd(c, s, DeviceType::kCuda);
}

// The kernels' chunk length, or 0 when not even one step's shared memory fits (N too large).
int chunk_len(const op_checks::SsdScanShape& s) {
  int64_t len = s.attrs.chunk_size < kSsdMaxChunk ? s.attrs.chunk_size : kSsdMaxChunk;
  while (len > 1 && ssd_smem(len, s.n, true).total * 4 > kSsdSmemBudget) len /= 2;
  return ssd_smem(len, s.n, true).total * 4 > kSsdSmemBudget ? 0 : static_cast<int>(len);
}

// Throws (kInvalidArgument) when the state dim is too large for the kernels.
int checked_chunk_len(const op_checks::SsdScanShape& s, const char* op) {
  const int len = chunk_len(s);
  if (len == 0)
    throw Error(Code::kInvalidArgument, std::string(op) + ": state_dim = " + std::to_string(s.n) +
                                            " is too large for the CUDA kernel's shared memory");
  return len;
}

SsdArgs base_args(const OpCall* call, const op_checks::SsdScanShape& s, int xi, int len) {
  SsdArgs a{};
  a.xbc = call->inputs[xi].data;
  a.dt_in = call->inputs[xi + 1].data;
  a.a_log = call->inputs[xi + 2].data;
  a.d = call->inputs[xi + 3].data;
  a.dt_bias = call->inputs[xi + 4].data;
  a.init = static_cast<const float*>(call->inputs[xi + 5].data);
  a.b = s.b, a.t = s.t, a.h = s.h, a.p = s.p, a.g = s.g, a.n = s.n, a.hg = s.h / s.g;
  a.chunk = len;
  a.chunks = static_cast<int>((s.t + len - 1) / len);
  a.softplus = s.attrs.dt_softplus;
  return a;
}

dim3 tile_grid(const op_checks::SsdScanShape& s) {
  return dim3(static_cast<unsigned>((s.p + kSsdTileP - 1) / kSsdTileP), static_cast<unsigned>(s.h),
              static_cast<unsigned>(s.b));
}

template <class T>
void launch_fwd(const SsdArgs& a, const op_checks::SsdScanShape& s, cudaStream_t stream,
                const char* op) {
  const size_t smem = static_cast<size_t>(ssd_smem(a.chunk, a.n, false).total) * sizeof(float);
  allow_dynamic_smem(ssd_scan_fwd_kernel<T>, smem, op);
  ssd_scan_fwd_kernel<T><<<tile_grid(s), kSsdThreads, smem, stream>>>(a);
  launch_check(op);
}

Status ssd_scan(const OpCall* call) {
  return guard([&] {
    op_checks::SsdScanShape s = check_fwd(call, false);
    const TensorView& xbc = call->inputs[0];
    current_device(ops::kSsdScan, xbc);
    const int len = checked_chunk_len(s, ops::kSsdScan);
    if (s.b == 0) return;
    SsdArgs a = base_args(call, s, 0, len);
    a.y = s.t > 0 ? call->outputs[0].data : nullptr;
    a.fin = call->num_outputs > 1 ? static_cast<float*>(call->outputs[1].data) : nullptr;
    if (a.y == nullptr && a.fin == nullptr) return;
    LOOM_CUDA_FLOAT_SWITCH(xbc.dtype, T, ops::kSsdScan,
                           launch_fwd<T>(a, s, stream_of(call), ops::kSsdScan));
  });
}

// The backward's workspace: chunk states, dB / dC accumulators, ddt accumulators (f32,
// each part 256-byte aligned).
struct BwdWorkspace {
  uint64_t states, dbc, ddt, total;
};

BwdWorkspace bwd_workspace(const op_checks::SsdScanShape& s, int len) {
  auto round = [](uint64_t floats) { return (floats * 4 + 255) / 256 * 256; };
  BwdWorkspace w{};
  const uint64_t chunks = len > 0 ? static_cast<uint64_t>((s.t + len - 1) / len) : 0;
  w.states = 0;
  w.dbc = round(static_cast<uint64_t>(s.b * s.h * s.p * s.n) * chunks);
  w.ddt = w.dbc + round(static_cast<uint64_t>(s.b * s.t * s.g * 2 * s.n));
  w.total = w.ddt + round(static_cast<uint64_t>(s.b * s.t * s.h));
  return w;
}

uint64_t ssd_scan_bwd_workspace(const OpCall* call) {
  uint64_t bytes = 0;
  check_passes([&] {
    op_checks::SsdScanShape s = check_bwd(call, true);
    if (s.b * s.t > 0) bytes = bwd_workspace(s, chunk_len(s)).total;
  });
  return bytes;
}

Status ssd_scan_bwd(const OpCall* call) {
  return guard([&] {
    op_checks::SsdScanShape s = check_bwd(call, false);
    const TensorView& xbc = call->inputs[1];
    current_device(ops::kSsdScanBwd, xbc);
    const int len = checked_chunk_len(s, ops::kSsdScanBwd);
    if (s.b * s.t == 0) return;  // no gradient to add; dxBC and ddt_in are empty
    const BwdWorkspace ws = bwd_workspace(s, len);
    if (call->workspace == nullptr || call->workspace_bytes < ws.total ||
        reinterpret_cast<uintptr_t>(call->workspace) % alignof(float) != 0)
      throw Error(Code::kInvalidArgument, std::string(ops::kSsdScanBwd) +
                                              ": needs a workspace of " + std::to_string(ws.total) +
                                              " bytes, f32-aligned (KernelDesc::workspace)");
    char* base = static_cast<char*>(call->workspace);
    cudaStream_t stream = stream_of(call);
    SsdArgs a = base_args(call, s, 1, len);
    a.states = reinterpret_cast<float*>(base + ws.states);
    a.dbc = reinterpret_cast<float*>(base + ws.dbc);
    a.ddt = reinterpret_cast<float*>(base + ws.ddt);
    a.dy = call->inputs[0].data;
    a.dxbc = call->outputs[0].data;
    a.ddt_in = call->outputs[1].data;
    a.da_log = static_cast<float*>(call->outputs[2].data);
    a.dd = call->num_outputs > 3 ? static_cast<float*>(call->outputs[3].data) : nullptr;
    float* ddt_bias = call->num_outputs > 4 ? static_cast<float*>(call->outputs[4].data) : nullptr;
    cuda_check(cudaMemsetAsync(a.dbc, 0, ws.total - ws.dbc, stream),
               "ssd_scan_bwd: cudaMemsetAsync");
    const char* op = ops::kSsdScanBwd;
    LOOM_CUDA_FLOAT_SWITCH(xbc.dtype, T, op, {
      launch_fwd<T>(a, s, stream, op);  // y and fin null: the chunk states only
      const size_t smem = static_cast<size_t>(ssd_smem(len, s.n, true).total) * sizeof(float);
      allow_dynamic_smem(ssd_scan_bwd_kernel<T>, smem, op);
      ssd_scan_bwd_kernel<T><<<tile_grid(s), kSsdThreads, smem, stream>>>(a);
      launch_check(op);
      const int64_t items = s.b * s.t * (s.g * 2 * s.n + s.h);
      ssd_scan_bwd_finish_kernel<T><<<grid_for(items, kSsdThreads), kSsdThreads, 0, stream>>>(a);
      launch_check(op);
    });
    if (ddt_bias != nullptr) {
      ssd_scan_bias_grad_kernel<<<static_cast<unsigned>(s.h), kSsdThreads, 32 * sizeof(float),
                                  stream>>>(a.ddt, s.b * s.t, s.h, ddt_bias);
      launch_check(op);
    }
  });
}

bool ssd_scan_supports(const OpCall* call) {
  return check_passes([&] { checked_chunk_len(check_fwd(call, true), ops::kSsdScan); });
}
bool ssd_scan_bwd_supports(const OpCall* call) {
  return check_passes([&] { checked_chunk_len(check_bwd(call, true), ops::kSsdScanBwd); });
}

// Per (b, h) and step: the chunk's quadratic form (L * (N + P)) and the state's (P * N)
// terms, about 2 flops each; the backward about three times the forward.
double scan_flops(const op_checks::SsdScanShape& s) {
  const double len =
      static_cast<double>(s.attrs.chunk_size < kSsdMaxChunk ? s.attrs.chunk_size : kSsdMaxChunk);
  return 2.0 * static_cast<double>(s.b * s.t * s.h) *
         (len * static_cast<double>(s.n + s.p) + 3.0 * static_cast<double>(s.p * s.n));
}

Status ssd_scan_cost(const OpCall* call, OpCost* out) {
  return guard([&] { *out = io_cost(call, scan_flops(check_fwd(call, true))); });
}
Status ssd_scan_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] { *out = io_cost(call, 3.0 * scan_flops(check_bwd(call, true))); });
}

}  // namespace

void add_ssd_scan_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kSsdScan, ssd_scan, ssd_scan_supports, ssd_scan_cost);
  add_cuda_kernels(out, ops::kSsdScanBwd, ssd_scan_bwd, ssd_scan_bwd_supports, ssd_scan_bwd_cost,
                   {DType::kF32, DType::kBF16, DType::kF16}, kCudaName, kCudaPriority,
                   ssd_scan_bwd_workspace);
}

}  // namespace loom::kernels::cuda::mamba
