// moe_topk / moe_topk_bwd: a router's top-k choice of experts and its gradient
// (loom/ops/moe.h). Rows are independent and E is small: the work is a few passes over
// (N, E) in f64. The reference runs the rows in order, the fast kernel (the same row code)
// over OpenMP threads. Logits of f32 or f64 (the router dtype): the row code is templated on
// the storage type T of the logits and of every other float tensor but the expert bias (f32);
// it computes in f64 either way and rounds to T last.
#include <loom/cpp/op_checks/moe.h>
#include <loom/cpp/tensor.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::MoeTopkShape;
using ops::MoeTopkAttrs;

MoeTopkShape check_topk(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_topk(call, shapes_only, DeviceType::kCpu);
}
MoeTopkShape check_topk_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_topk_bwd(call, shapes_only, DeviceType::kCpu);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// softmax of `x` (n values) into `out`.
template <class T>
void softmax(const T* x, int64_t n, double* out) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += out[i] = std::exp(x[i] - mx);
  for (int64_t i = 0; i < n; ++i) out[i] /= sum;
}

// "a ranks before b": the higher score, or the lower index on a tie.
bool before(double sa, int64_t a, double sb, int64_t b) { return sa > sb || (sa == sb && a < b); }

// The K experts one row selects, best first. `sel` (E) are the selection scores.
void select_row(const std::vector<double>& sel, const MoeTopkAttrs& at, int64_t e,
                int32_t* experts) {
  std::vector<char> allowed(static_cast<size_t>(e), 1);
  if (at.num_groups > 1) {
    const int64_t per = e / at.num_groups, take = at.k / at.group_topk;
    std::vector<double> group_score(static_cast<size_t>(at.num_groups));
    std::vector<int64_t> idx(static_cast<size_t>(per));
    for (int32_t g = 0; g < at.num_groups; ++g) {
      std::iota(idx.begin(), idx.end(), g * per);
      std::partial_sort(idx.begin(), idx.begin() + take, idx.end(),
                        [&](int64_t a, int64_t b) { return before(sel[a], a, sel[b], b); });
      double s = 0;
      for (int64_t i = 0; i < take; ++i) s += sel[idx[i]];
      group_score[g] = s;
    }
    std::vector<int64_t> groups(static_cast<size_t>(at.num_groups));
    std::iota(groups.begin(), groups.end(), 0);
    std::partial_sort(
        groups.begin(), groups.begin() + at.group_topk, groups.end(),
        [&](int64_t a, int64_t b) { return before(group_score[a], a, group_score[b], b); });
    std::fill(allowed.begin(), allowed.end(), 0);
    for (int32_t i = 0; i < at.group_topk; ++i)
      std::fill(allowed.begin() + groups[i] * per, allowed.begin() + (groups[i] + 1) * per, 1);
  }
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < e; ++i)
    if (allowed[i]) idx.push_back(i);
  std::partial_sort(idx.begin(), idx.begin() + at.k, idx.end(),
                    [&](int64_t a, int64_t b) { return before(sel[a], a, sel[b], b); });
  for (int32_t j = 0; j < at.k; ++j) experts[j] = static_cast<int32_t>(idx[j]);
}

void check_expert_id(int32_t id, int64_t e, int64_t row) {
  if (id < 0 || id >= e)
    throw Error(Code::kOutOfRange, "moe_topk_bwd: experts[" + std::to_string(row) + "] holds " +
                                       std::to_string(id) +
                                       ", outside [0, E = " + std::to_string(e) + ")");
}

// The rows of a moe_topk call whose logits, probs and lse are T (float, or double for f64).
template <class T, bool kParallel>
void moe_topk_rows(const OpCall* call, const MoeTopkShape& s) {
  const MoeTopkAttrs& at = s.attrs;
  const T* logits = static_cast<const T*>(call->inputs[0].data);
  const float* bias = present(call->inputs[1]) ? f32(call->inputs[1]) : nullptr;
  T* probs = static_cast<T*>(call->outputs[0].data);
  int32_t* experts = static_cast<int32_t*>(call->outputs[1].data);
  T* lse = present(call->outputs[2]) ? static_cast<T*>(call->outputs[2].data) : nullptr;
  const int64_t e = s.e, k = at.k;
#pragma omp parallel for schedule(static) if (kParallel)
  for (int64_t t = 0; t < s.n; ++t) {
    const T* l = logits + t * e;
    std::vector<double> score(static_cast<size_t>(e)), sel(static_cast<size_t>(e));
    if (at.score == 1) {
      for (int64_t i = 0; i < e; ++i) {
        score[i] = sigmoid(l[i]);
        sel[i] = score[i] + (bias != nullptr ? bias[i] : 0.0);
      }
    } else if (at.pre_softmax) {
      softmax(l, e, score.data());
      sel = score;
    } else {
      for (int64_t i = 0; i < e; ++i) sel[i] = l[i];
    }
    int32_t* ex = experts + t * k;
    select_row(sel, at, e, ex);
    T* p = probs + t * k;
    if (at.score == 0 && !at.pre_softmax) {  // softmax over the selected logits
      double mx = l[ex[0]], sum = 0;
      std::vector<double> v(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) sum += v[j] = std::exp(l[ex[j]] - mx);
      for (int64_t j = 0; j < k; ++j) p[j] = static_cast<T>(v[j] / sum * at.scaling_factor);
    } else {
      double z = 1.0;
      if (at.score == 1 && k > 1) {
        z = 1e-20;
        for (int64_t j = 0; j < k; ++j) z += score[ex[j]];
      }
      for (int64_t j = 0; j < k; ++j) p[j] = static_cast<T>(score[ex[j]] / z * at.scaling_factor);
    }
    if (lse != nullptr) {
      double mx = -INFINITY, sum = 0;
      for (int64_t i = 0; i < e; ++i) mx = std::max(mx, static_cast<double>(l[i]));
      for (int64_t i = 0; i < e; ++i) sum += std::exp(l[i] - mx);
      lse[t] = static_cast<T>(mx + std::log(sum));
    }
  }
}

template <bool kParallel>
Status moe_topk_rows(const OpCall* call) {
  return guard([&] {
    MoeTopkShape s = check_topk(call, false);
    if (call->inputs[0].dtype == DType::kF64)
      moe_topk_rows<double, kParallel>(call, s);
    else
      moe_topk_rows<float, kParallel>(call, s);
  });
}

// The rows of a moe_topk_bwd call whose float tensors are T (float, or double for f64).
template <class T, bool kParallel>
void moe_topk_bwd_rows(const OpCall* call, const MoeTopkShape& s) {
  const MoeTopkAttrs& at = s.attrs;
  const T* dprobs = static_cast<const T*>(call->inputs[0].data);
  const T* logits = static_cast<const T*>(call->inputs[1].data);
  const int32_t* experts = i32(call->inputs[2]);
  const T* dlse = present(call->inputs[3]) ? static_cast<const T*>(call->inputs[3].data) : nullptr;
  T* dlogits = static_cast<T*>(call->outputs[0].data);
  const int64_t e = s.e, k = at.k;
  for (int64_t i = 0; i < s.n * k; ++i) check_expert_id(experts[i], e, i / k);
#pragma omp parallel for schedule(static) if (kParallel)
  for (int64_t t = 0; t < s.n; ++t) {
    const T* l = logits + t * e;
    const int32_t* ex = experts + t * k;
    std::vector<double> g(static_cast<size_t>(k)), d(static_cast<size_t>(e), 0.0);
    for (int64_t j = 0; j < k; ++j)
      g[j] = static_cast<double>(dprobs[t * k + j]) * at.scaling_factor;
    if (at.score == 0 && !at.pre_softmax) {
      // p = softmax of the selected logits: dl_j = p_j (g_j - sum_i p_i g_i).
      double mx = l[ex[0]], sum = 0, dot = 0;
      std::vector<double> p(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) mx = std::max(mx, static_cast<double>(l[ex[j]]));
      for (int64_t j = 0; j < k; ++j) sum += p[j] = std::exp(l[ex[j]] - mx);
      for (int64_t j = 0; j < k; ++j) dot += (p[j] /= sum) * g[j];
      for (int64_t j = 0; j < k; ++j) d[ex[j]] += p[j] * (g[j] - dot);
    } else if (at.score == 0) {
      // probs = s[selected], s = softmax over all E: dl = s (g - sum s g).
      std::vector<double> sm(static_cast<size_t>(e)), ge(static_cast<size_t>(e), 0.0);
      softmax(l, e, sm.data());
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) ge[ex[j]] += g[j];
      for (int64_t i = 0; i < e; ++i) dot += sm[i] * ge[i];
      for (int64_t i = 0; i < e; ++i) d[i] = sm[i] * (ge[i] - dot);
    } else {
      // probs_j = s_j / Z (K > 1, Z = sum of the selected s + 1e-20) or s_j (K = 1).
      std::vector<double> sg(static_cast<size_t>(k)), ds(static_cast<size_t>(k));
      double z = 1e-20, dot = 0;
      for (int64_t j = 0; j < k; ++j) z += sg[j] = sigmoid(l[ex[j]]);
      for (int64_t j = 0; j < k; ++j) dot += g[j] * sg[j];
      for (int64_t j = 0; j < k; ++j) ds[j] = k > 1 ? g[j] / z - dot / (z * z) : g[j];
      for (int64_t j = 0; j < k; ++j) d[ex[j]] += ds[j] * sg[j] * (1.0 - sg[j]);
    }
    if (dlse != nullptr) {
      std::vector<double> sm(static_cast<size_t>(e));
      softmax(l, e, sm.data());
      for (int64_t i = 0; i < e; ++i) d[i] += static_cast<double>(dlse[t]) * sm[i];
    }
    for (int64_t i = 0; i < e; ++i) dlogits[t * e + i] = static_cast<T>(d[i]);
  }
}

template <bool kParallel>
Status moe_topk_bwd_rows(const OpCall* call) {
  return guard([&] {
    MoeTopkShape s = check_topk_bwd(call, false);
    if (call->inputs[1].dtype == DType::kF64)
      moe_topk_bwd_rows<double, kParallel>(call, s);
    else
      moe_topk_bwd_rows<float, kParallel>(call, s);
  });
}

Status moe_topk_ref(const OpCall* call) { return moe_topk_rows<false>(call); }
Status moe_topk_fast(const OpCall* call) { return moe_topk_rows<true>(call); }
Status moe_topk_bwd_ref(const OpCall* call) { return moe_topk_bwd_rows<false>(call); }
Status moe_topk_bwd_fast(const OpCall* call) { return moe_topk_bwd_rows<true>(call); }

bool moe_topk_supports(const OpCall* c) {
  return passes([&] { check_topk(c, true); });
}
bool moe_topk_bwd_supports(const OpCall* c) {
  return passes([&] { check_topk_bwd(c, true); });
}
Status moe_topk_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    MoeTopkShape s = check_topk(c, true);
    *out = io_cost(c, 8.0 * static_cast<double>(s.n * s.e));
  });
}
Status moe_topk_bwd_cost(const OpCall* c, OpCost* out) {
  return guard([&] {
    MoeTopkShape s = check_topk_bwd(c, true);
    *out = io_cost(c, 8.0 * static_cast<double>(s.n * s.e));
  });
}

}  // namespace

void add_moe_topk_kernels(std::vector<KernelDesc>& out) {
  add_kernels(out, ops::kMoeTopk, kRefName, kRefPriority, moe_topk_ref, moe_topk_supports,
              moe_topk_cost, {DType::kF32, DType::kF64});
  add_kernels(out, ops::kMoeTopk, kFastName, kFastPriority, moe_topk_fast, moe_topk_supports,
              moe_topk_cost, {DType::kF32, DType::kF64});
  add_kernels(out, ops::kMoeTopkBwd, kRefName, kRefPriority, moe_topk_bwd_ref,
              moe_topk_bwd_supports, moe_topk_bwd_cost, {DType::kF32, DType::kF64});
  add_kernels(out, ops::kMoeTopkBwd, kFastName, kFastPriority, moe_topk_bwd_fast,
              moe_topk_bwd_supports, moe_topk_bwd_cost, {DType::kF32, DType::kF64});
}

}  // namespace loom::kernels::cpu
