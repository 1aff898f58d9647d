// moe_topk (loom/ops/moe.h): a router's K experts per token from its logits (N, E), f32 or
// f64 in and out (probs and lse of the logits' dtype; the bias f32), computed in f64 as the
// CPU reference does (kernels/cpu/moe_topk.cc):
//   selection score    softmax, pre_softmax 0: the logit
//                      softmax, pre_softmax 1: s = softmax over the E logits
//                      sigmoid:                s = sigmoid(logit), + bias (E) when given
//   probs (N, K)       pre_softmax 0: softmax over the K selected logits
//                      pre_softmax 1: s of the selected experts
//                      sigmoid:       s / (1e-20 + sum of the K selected s), s when K = 1
//                      then * scaling_factor, rounded to the logits' dtype last
//   experts (N, K) i32 descending selection score, ties to the lower id
//   lse (N)            max + log(sum exp(l - max)) of the row, when asked for
// With G = num_groups > 1 a group's score is the sum of its K / group_topk best selection
// scores (added best first), and only the experts of the group_topk best groups (ties to the
// lower group id) are eligible.
//
// Algorithm: one warp per row (router.cuh). The softmax statistics (max, and the sum in
// index order) are taken only for lse or pre_softmax. Each pick is a pass over the row's E
// selection scores (recomputed from the logits: no per-expert storage, so any E) keeping the
// best key below the previous pick, then a warp max: K passes for the experts, K /
// group_topk per group for the group scores (kept in shared memory, at most kMaxGroups per
// warp), group_topk over the G group scores for the group threshold. Lane 0 then writes the
// probabilities in k order, with the CPU's sums (the selected softmax, the sigmoid's Z).
//
// Launch: blocks of kRowWarps warps, a warp per row, the grid striding over the N rows.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/moe.h>

#include <climits>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"
#include "kernels/cuda/moe/registry.cuh"
#include "kernels/cuda/moe/router.cuh"

namespace loom::kernels::cuda::moe {
namespace {

// T: the logits' storage type, float or double (the router dtype).
template <class T>
struct TopkArgs {
  const T* logits;    // (N, E)
  const float* bias;  // (E) or null
  T* probs;           // (N, K)
  int32_t* experts;   // (N, K)
  T* lse;             // (N) or null
  int64_t n, e;
  int32_t k, score, pre, groups, group_topk;
  float scale;
};

// What a row's scores need besides its logits.
template <class T>
struct RowRouter {
  const T* l;         // the row's logits
  const float* bias;  // sigmoid only, or null
  bool sigmoid, pre;
  RowSoftmax sm;  // pre_softmax only

  // The score probs start from (s; the logit without pre_softmax).
  __device__ __forceinline__ double score(int64_t e) const {
    if (sigmoid) return sigmoid_f64(l[e]);
    return pre ? sm.at(l, e) : static_cast<double>(l[e]);
  }
  // The score the selection ranks: score, + bias for the sigmoid.
  __device__ __forceinline__ double selection(int64_t e) const {
    const double s = score(e);
    return sigmoid && bias != nullptr ? s + static_cast<double>(bias[e]) : s;
  }
};

template <class T>
__global__ void __launch_bounds__(kRowThreads) moe_topk_kernel(TopkArgs<T> a) {
  __shared__ double group_scores[kRowWarps][kMaxGroups];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double* gs = group_scores[warp];
  const int64_t gsize = a.e / a.groups;  // experts per group
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; row < a.n;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    RowRouter<T> r{a.logits + row * a.e, a.bias, a.score == 1, a.score == 0 && a.pre != 0,
                   RowSoftmax{0.0, 1.0}};
    if (r.pre || a.lse != nullptr) {
      r.sm = row_softmax(r.l, a.e, lane);
      if (a.lse != nullptr && lane == 0) a.lse[row] = static_cast<T>(r.sm.max + log(r.sm.sum));
    }

    // Group-limited routing: the group_topk-th best group key; the groups at or above it are
    // eligible (keys are distinct, so exactly group_topk groups are).
    RankKey group_floor = key_bottom();
    if (a.groups > 1) {
      const int per_group = a.k / a.group_topk;
      for (int g = 0; g < a.groups; ++g) {
        RankKey prev = key_top();
        double total = 0.0;
        for (int j = 0; j < per_group; ++j) {
          RankKey best = key_bottom();
          for (int64_t i = lane; i < gsize; i += 32) {
            const int64_t e = g * gsize + i;
            keep_best(best, rank_key(r.selection(e), e), prev);
          }
          prev = warp_max_key(best);
          total += key_score(prev);
        }
        if (lane == 0) gs[g] = total;
      }
      __syncwarp();
      RankKey prev = key_top();
      for (int j = 0; j < a.group_topk; ++j) {
        RankKey best = key_bottom();
        for (int g = lane; g < a.groups; g += 32) keep_best(best, rank_key(gs[g], g), prev);
        prev = warp_max_key(best);
      }
      group_floor = prev;
    }

    int32_t* experts = a.experts + row * a.k;
    RankKey prev = key_top();
    for (int k = 0; k < a.k; ++k) {
      RankKey best = key_bottom();
      for (int64_t e = lane; e < a.e; e += 32) {
        if (a.groups > 1 && key_less(rank_key(gs[e / gsize], e / gsize), group_floor)) continue;
        keep_best(best, rank_key(r.selection(e), e), prev);
      }
      prev = warp_max_key(best);
      // No pick (key_bottom) only with fewer than K eligible experts, which the checks rule
      // out; -1 then rather than an id past E.
      if (lane == 0) experts[k] = prev.score != 0ull ? key_id(prev) : -1;
    }

    if (lane == 0) {  // lane 0 reads back only the ids it wrote itself
      T* probs = a.probs + row * a.k;
      const double scale = a.scale;
      if (!r.sigmoid && !r.pre) {  // softmax over the selected logits
        const double m = experts[0] >= 0 ? r.score(experts[0]) : 0.0;
        double sum = 0.0;
        for (int k = 0; k < a.k; ++k) sum += experts[k] >= 0 ? exp(r.score(experts[k]) - m) : 0.0;
        for (int k = 0; k < a.k; ++k)
          probs[k] =
              experts[k] >= 0 ? static_cast<T>(exp(r.score(experts[k]) - m) / sum * scale) : T(0);
      } else {
        double z = 1.0;
        if (r.sigmoid && a.k > 1) {
          z = 1e-20;
          for (int k = 0; k < a.k; ++k) z += experts[k] >= 0 ? r.score(experts[k]) : 0.0;
        }
        for (int k = 0; k < a.k; ++k)
          probs[k] = experts[k] >= 0 ? static_cast<T>(r.score(experts[k]) / z * scale) : T(0);
      }
    }
    __syncwarp();  // the next row rewrites gs
  }
}

op_checks::MoeTopkShape check(const OpCall* call, bool shapes_only) {
  op_checks::MoeTopkShape s = op_checks::check_moe_topk(call, shapes_only, DeviceType::kCuda);
  if (s.attrs.num_groups > kMaxGroups)
    throw Error(Code::kUnimplemented, std::string(ops::kMoeTopk) +
                                          ": num_groups = " + std::to_string(s.attrs.num_groups) +
                                          " exceeds the " + std::to_string(kMaxGroups) +
                                          " groups the CUDA router keeps in shared memory");
  if (s.e > INT32_MAX)
    throw Error(Code::kUnimplemented, std::string(ops::kMoeTopk) + ": E = " + std::to_string(s.e) +
                                          " does not fit the i32 ids");
  return s;
}

Status moe_topk(const OpCall* call) {
  return guard([&] {
    op_checks::MoeTopkShape s = check(call, false);
    if (s.n == 0) return;
    current_device(ops::kMoeTopk, call->inputs[0]);
    const TensorView &bias = call->inputs[1], &lse = call->outputs[2];
    auto launch = [&](auto zero) {
      using T = decltype(zero);
      TopkArgs<T> a{static_cast<const T*>(call->inputs[0].data),
                    static_cast<const float*>(bias.data),  // null when absent
                    static_cast<T*>(call->outputs[0].data),
                    static_cast<int32_t*>(call->outputs[1].data),
                    static_cast<T*>(lse.data),  // null when absent (N > 0 here)
                    s.n,
                    s.e,
                    s.attrs.k,
                    s.attrs.score,
                    s.attrs.pre_softmax != 0 ? 1 : 0,
                    s.attrs.num_groups,
                    s.attrs.group_topk,
                    s.attrs.scaling_factor};
      moe_topk_kernel<T><<<router_blocks(s.n), kRowThreads, 0, stream_of(call)>>>(a);
    };
    if (call->inputs[0].dtype == DType::kF64)
      launch(0.0);
    else
      launch(0.0f);
    launch_check(ops::kMoeTopk);
  });
}

bool moe_topk_supports(const OpCall* call) {
  return check_passes([&] { check(call, true); });
}

// The CPU kernel's cost (kernels/cpu/moe_topk.cc).
Status moe_topk_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    op_checks::MoeTopkShape s = check(call, true);
    *out = io_cost(call, 8.0 * static_cast<double>(s.n * s.e));
  });
}

}  // namespace

void add_topk_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kMoeTopk, moe_topk, moe_topk_supports, moe_topk_cost,
                   {DType::kF32, DType::kF64});
}

}  // namespace loom::kernels::cuda::moe
