// moe_topk_bwd (loom/ops/moe.h): dlogits (N, E) from dprobs (N, K), the logits (N, E), the
// forward's experts (N, K) and dlse (N) or none; f32 or f64 in and out (every float tensor of
// the logits' dtype), computed in f64 in the CPU reference's order (kernels/cpu/moe_topk.cc). With
// g_j = dprobs_j * scaling_factor for the expert e_j picked j-th:
//   softmax, pre_softmax 0: p = softmax over the K selected logits,
//                           dlogit[e_j] += p_j * (g_j - sum_i p_i g_i), 0 elsewhere
//   softmax, pre_softmax 1: s = softmax over all E, G[e_j] += g_j,
//                           dlogit = s * (G - sum_e s_e G_e) (dense)
//   sigmoid:                s_j = sigmoid(logit[e_j]), Z = 1e-20 + sum_j s_j, D = sum_j g_j s_j,
//                           ds_j = g_j / Z - D / Z^2 (K > 1) or g_j (K = 1),
//                           dlogit[e_j] += ds_j * s_j * (1 - s_j), 0 elsewhere
//   then, with dlse:        dlogit += dlse * softmax(logits)
// ("+=": an expert picked twice, never by the forward, adds both terms, in j order.) Ids
// outside [0, E) take no part and are reported lazily (index_errors.cuh), where the CPU
// fails the call before computing.
//
// Algorithm: one warp per row (router.cuh). The sums over the K choices (the selected
// softmax's max and sum, sum p g, Z, D) are walked in j order by every lane alike; the sums
// over the row (softmax's denominator, sum s G) are taken in index order by broadcast
// shuffles; so every lane holds the same bits, the CPU's. Then each lane writes its experts
// e = lane, lane + 32, ...: every dlogit once (it is overwritten), finding the choices of e by
// a scan of the row's K ids.
//
// Launch: blocks of kRowWarps warps, a warp per row, the grid striding over the N rows.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/moe.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/moe/index_errors.cuh"
#include "kernels/cuda/moe/registry.cuh"
#include "kernels/cuda/moe/router.cuh"

namespace loom::kernels::cuda::moe {
namespace {

// T: the logits' storage type, float or double (the router dtype).
template <class T>
struct TopkBwdArgs {
  const T* dprobs;         // (N, K)
  const T* logits;         // (N, E)
  const int32_t* experts;  // (N, K)
  const T* dlse;           // (N) or null
  T* dlogits;              // (N, E)
  int64_t n, e;
  int32_t k, score, pre;
  float scale;
};

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    moe_topk_bwd_kernel(TopkBwdArgs<T> a, IndexErrorSink sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool sigmoid = a.score == 1, pre = a.score == 0 && a.pre != 0;
  const double scale = a.scale;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; row < a.n;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    const T* l = a.logits + row * a.e;
    const T* dp = a.dprobs + row * a.k;
    const int32_t* ex = a.experts + row * a.k;
    auto valid = [&](int j) { return ex[j] >= 0 && ex[j] < a.e; };
    auto g = [&](int j) { return static_cast<double>(dp[j]) * scale; };

    int bad = -1;  // the first choice with an id outside [0, E)
    for (int j = 0; j < a.k && bad < 0; ++j)
      if (!valid(j)) bad = j;
    if (bad >= 0 && lane == 0)
      report_index_error(sink, IndexOp::kTopkBwdExperts, row, ex[bad], a.e);

    RowSoftmax sm{0.0, 1.0};
    if (pre || a.dlse != nullptr) sm = row_softmax(l, a.e, lane);

    // The sums over the choices, in j order, the same in every lane.
    double mx = 0.0;   // pre_softmax 0: the max of the selected logits
    double z = 1.0;    // pre_softmax 0: the sum of exp(l - mx); sigmoid: Z
    double dot = 0.0;  // sum p g (pre_softmax 0), sum s G (1), D (sigmoid)
    if (sigmoid) {
      z = 1e-20;
      for (int j = 0; j < a.k; ++j)
        if (valid(j)) z += sigmoid_f64(l[ex[j]]);
      for (int j = 0; j < a.k; ++j)
        if (valid(j)) dot += g(j) * sigmoid_f64(l[ex[j]]);
    } else if (!pre) {
      mx = -INFINITY;
      for (int j = 0; j < a.k; ++j)
        if (valid(j)) mx = fmax(mx, static_cast<double>(l[ex[j]]));
      z = 0.0;
      for (int j = 0; j < a.k; ++j)
        if (valid(j)) z += exp(static_cast<double>(l[ex[j]]) - mx);
      for (int j = 0; j < a.k; ++j)
        if (valid(j)) dot += exp(static_cast<double>(l[ex[j]]) - mx) / z * g(j);
    } else {
      // G_e = the g of e's choices, added in j order; sum s G over the row in index order.
      dot = ordered_row_sum(a.e, lane, [&](int64_t e) {
        double g_e = 0.0;
        for (int j = 0; j < a.k; ++j)
          if (ex[j] == e) g_e += g(j);
        return sm.at(l, e) * g_e;
      });
    }

    const double dlse = a.dlse != nullptr ? static_cast<double>(a.dlse[row]) : 0.0;
    T* dl = a.dlogits + row * a.e;
    for (int64_t e = lane; e < a.e; e += 32) {
      const double x = l[e];
      double d = 0.0;
      if (sigmoid) {
        const double s = sigmoid_f64(x);
        for (int j = 0; j < a.k; ++j) {
          if (ex[j] != e) continue;
          const double ds = a.k > 1 ? g(j) / z - dot / (z * z) : g(j);
          d += ds * s * (1.0 - s);
        }
      } else if (pre) {
        double g_e = 0.0;
        for (int j = 0; j < a.k; ++j)
          if (ex[j] == e) g_e += g(j);
        d = sm.at(l, e) * (g_e - dot);
      } else {
        for (int j = 0; j < a.k; ++j) {
          if (ex[j] != e) continue;
          const double p = exp(x - mx) / z;
          d += p * (g(j) - dot);
        }
      }
      if (a.dlse != nullptr) d += dlse * sm.at(l, e);
      dl[e] = static_cast<T>(d);
    }
  }
}

op_checks::MoeTopkShape check(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_topk_bwd(call, shapes_only, DeviceType::kCuda);
}

Status moe_topk_bwd(const OpCall* call) {
  return guard([&] {
    op_checks::MoeTopkShape s = check(call, false);
    const int device = current_device(ops::kMoeTopkBwd, call->inputs[1]);
    cudaStream_t stream = stream_of(call);
    IndexErrorSink sink = index_error_sink(device, stream);  // fails for an earlier error
    if (s.n == 0) return;
    auto launch = [&](auto zero) {
      using T = decltype(zero);
      TopkBwdArgs<T> a{static_cast<const T*>(call->inputs[0].data),
                       static_cast<const T*>(call->inputs[1].data),
                       static_cast<const int32_t*>(call->inputs[2].data),
                       static_cast<const T*>(call->inputs[3].data),  // null when absent (N > 0)
                       static_cast<T*>(call->outputs[0].data),
                       s.n,
                       s.e,
                       s.attrs.k,
                       s.attrs.score,
                       s.attrs.pre_softmax != 0 ? 1 : 0,
                       s.attrs.scaling_factor};
      moe_topk_bwd_kernel<T><<<router_blocks(s.n), kRowThreads, 0, stream>>>(a, sink);
    };
    if (call->inputs[1].dtype == DType::kF64)
      launch(0.0);
    else
      launch(0.0f);
    launch_check(ops::kMoeTopkBwd);
  });
}

bool moe_topk_bwd_supports(const OpCall* call) {
  return check_passes([&] { check(call, true); });
}

// The CPU kernel's cost (kernels/cpu/moe_topk.cc).
Status moe_topk_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::MoeTopkShape s = check(call, true);
    *out = io_cost(call, 8.0 * static_cast<double>(s.n * s.e));
  });
}

}  // namespace

void add_topk_bwd_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kMoeTopkBwd, moe_topk_bwd, moe_topk_bwd_supports, moe_topk_bwd_cost,
                   {DType::kF32, DType::kF64});
}

}  // namespace loom::kernels::cuda::moe
