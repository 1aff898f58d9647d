// attention_fwd / attention_bwd through cuDNN's fused attention (SDPA) graphs, built with the
// cudnn-frontend C++ headers (tools/requirements-cudnn.txt, tools/bazel/system_libs.bzl).
//
// Choice and pinning. The kernels are registered as "cuda.cudnn" for bf16 and f16 at priority
// 25, above loom's own "cuda" kernels (20), so the host tries them first. Their `supports`
// accepts exactly what loom's own kernels accept, because the host resolves a kernel once per
// module and the decision "cuDNN or not" depends on things `supports` cannot see or must not
// pay for (the device's compute capability, the loaded cuDNN's version, whether cuDNN builds
// a graph for these shapes, the pointers' alignment). Each call therefore decides for itself:
// cuDNN runs it only when every condition below holds, and otherwise loom's own kernel runs
// it (same contract, same outputs up to rounding), inside the same call:
//   - device of compute capability 9.0 (Hopper: tested on an H200 with cuDNN 9.14) and
//     cuDNN >= 9.0 at run time (cudnnGetVersion);
//   - Q, K, V, O (and dO, dQ, dK, dV) all bf16 or all f16, lse f32, 16-byte aligned; O, dO
//     and lse contiguous, Q, K, V (dQ, dK, dV) contiguous or views with strided rows
//     (ops::kAttentionFwd) whose strides are multiples of 8 elements (cuDNN's graphs take
//     the strides; the graph cache is keyed on them); head dim D a multiple of 8 and at
//     most 128; B, T, S, H >= 1;
//   - AttentionAttrs (not AttentionBlockAttrs: context parallelism stays on loom's kernels),
//     dropout_p == 0 (cuDNN's dropout draws other random numbers than loom's Philox
//     numbering), no segment ids (packed documents);
//   - causal only with T <= S (bottom-right alignment, loom's `s > t + (S - T)`; T > S has
//     fully masked rows, whose outputs cuDNN does not define as loom does); with T == S the
//     graph asks for the same mask in its top-left form, as PyTorch and TransformerEngine
//     do (LOOM_CUDNN_CAUSAL=bottom_right keeps the bottom-right form, to compare);
//   - cuDNN accepts the graph (validate, check_support and build_plans succeed); a rejected
//     shape is remembered and not retried;
//   - the call's workspace holds cuDNN's (the KernelDesc's workspace function reports the
//     larger of cuDNN's and loom's needs).
// Each graph runs the first execution plan of cuDNN's heuristic (mode A).
// LOOM_CUDNN_PLANS=measured builds every plan of it and times them on the graph's first call
// outside a CUDA graph capture (cudnn-frontend's autotune), keeping the fastest, with the
// largest plan's workspace; one line to stderr per graph says what was timed.
// A spec pins loom's own kernel with /kernels/pin {"attention_fwd": "cuda",
// "attention_bwd": "cuda"}, or cuDNN's with "cuda.cudnn" (which still falls back per call;
// it exists for bf16 and f16 only, so an f32 model with that pin stops at resolution with
// the host's "no kernel 'cuda.cudnn'" message). Tests and benchmarks tell a cuDNN run from a
// fallback by cudnn_attention_counters().
//
// lse: cuDNN's softmax Stats output is max + ln(sum exp(x - max)) over the scaled scores
// x = scale * Q K^T (natural log, scale included: cudnn-frontend 1.32's node/softmax.h builds
// it as ADD(max, LOG(sum)) with dims (B, H, T, 1), strides (H*T, T, 1, 1); graph_properties.h,
// SDPA_attributes::set_stats_use_log2, converts it to base 2 only when asked, left off here):
// exactly loom's lse (B, H, T) f32, so cuDNN writes it in place and the backward takes loom's
// lse (from either forward) as its Stats input. On an H200 with cuDNN 9.14 the forward's lse
// matched cpu.ref's to 5e-7 (tests/kernels/cpu/attention_test, AttentionCuda).
#pragma once

#include <loom/kernel.h>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::kernels::cuda {

inline constexpr const char* kCudnnAttentionName = "cuda.cudnn";
inline constexpr int32_t kCudnnAttentionPriority = 25;

/// Appends the KernelDescs of attention_fwd and attention_bwd for bf16 and f16 (keyed on Q's
/// dtype) named "cuda.cudnn" with priority 25 (see above).
/// \param out  the list to append to
void add_cudnn_attention_kernels(std::vector<loom::KernelDesc>& out);

/// What the cuDNN kernels did so far in this process (for tests and benchmarks: a call that
/// fell back is correct but slower, and only these counters tell the two apart).
struct CudnnAttentionCounters {
  int64_t cudnn_calls;       ///< calls run by cuDNN
  int64_t fallback_calls;    ///< calls handed to loom's own kernel
  std::string last_decline;  ///< why the latest fallback happened ("" when none)
};
CudnnAttentionCounters cudnn_attention_counters();

/// The loaded cuDNN's version (cudnnGetVersion, e.g. 91400 for 9.14.0).
int64_t cudnn_runtime_version();

}  // namespace loom::kernels::cuda
