// moe_permute / moe_unpermute / moe_unpermute_bwd: tokens to expert rows and back
// (loom/ops/moe.h). Gathers only (each output row is written by one iteration, sums run in
// k order), so the results do not depend on the thread count.
//   reference: element by element, f64 sums, one thread.
//   fast: whole rows (memcpy, or converted to f32 with load_row / store_row), f32 sums,
//         rows over OpenMP threads.
#include <loom/cpp/op_checks/moe.h>

#include <vector>

#include <loom/cpp/tensor.h>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::MoePermuteShape;

MoePermuteShape check_permute(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_permute(call, shapes_only, DeviceType::kCpu);
}
MoePermuteShape check_unpermute(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_unpermute(call, shapes_only, DeviceType::kCpu);
}
MoePermuteShape check_unpermute_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_moe_unpermute_bwd(call, shapes_only, DeviceType::kCpu);
}

// Every index of `v` (count n) in [lo, hi), else kOutOfRange naming the op and the place.
void check_indices(const char* op, const char* what, const int32_t* v, int64_t n, int64_t lo,
                   int64_t hi) {
  for (int64_t i = 0; i < n; ++i)
    if (v[i] < lo || v[i] >= hi)
      throw Error(Code::kOutOfRange, std::string(op) + ": " + what + "[" + std::to_string(i) +
                                         "] = " + std::to_string(v[i]) + " is outside [" +
                                         std::to_string(lo) + ", " + std::to_string(hi) + ")");
}

Status moe_permute_ref(const OpCall* call) {
  return guard([&] {
    MoePermuteShape s = check_permute(call, false);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    const int32_t* src = i32(call->inputs[1]);
    check_indices(ops::kMoePermute, "src", src, s.m, 0, s.n);
    for (int64_t j = 0; j < s.m; ++j)
      for (int64_t c = 0; c < s.c; ++c) store(Y, j * s.c + c, load(X, src[j] * s.c + c));
  });
}

Status moe_permute_fast(const OpCall* call) {
  return guard([&] {
    MoePermuteShape s = check_permute(call, false);
    const TensorView &X = call->inputs[0], &Y = call->outputs[0];
    const int32_t* src = i32(call->inputs[1]);
    check_indices(ops::kMoePermute, "src", src, s.m, 0, s.n);
    const size_t row = static_cast<size_t>(s.c) * dtype_size(X.dtype);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < s.m; ++j)
      std::memcpy(static_cast<char*>(Y.data) + j * row,
                  static_cast<const char*>(X.data) + src[j] * row, row);
  });
}

Status moe_unpermute_ref(const OpCall* call) {
  return guard([&] {
    MoePermuteShape s = check_unpermute(call, false);
    const TensorView &Y = call->inputs[0], &X = call->outputs[0];
    const int32_t* rows = i32(call->inputs[1]);
    const float* w = present(call->inputs[2]) ? f32(call->inputs[2]) : nullptr;
    check_indices(ops::kMoeUnpermute, "slot_rows", rows, s.n * s.k, -1, s.m);
    for (int64_t t = 0; t < s.n; ++t)
      for (int64_t c = 0; c < s.c; ++c) {
        double acc = 0;
        for (int64_t k = 0; k < s.k; ++k) {
          const int32_t r = rows[t * s.k + k];
          if (r >= 0) acc += (w != nullptr ? w[t * s.k + k] : 1.0) * load(Y, r * s.c + c);
        }
        store(X, t * s.c + c, static_cast<float>(acc));
      }
  });
}

Status moe_unpermute_fast(const OpCall* call) {
  return guard([&] {
    MoePermuteShape s = check_unpermute(call, false);
    const TensorView &Y = call->inputs[0], &X = call->outputs[0];
    const int32_t* rows = i32(call->inputs[1]);
    const float* w = present(call->inputs[2]) ? f32(call->inputs[2]) : nullptr;
    check_indices(ops::kMoeUnpermute, "slot_rows", rows, s.n * s.k, -1, s.m);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < s.n; ++t) {
      std::vector<float> acc(static_cast<size_t>(s.c), 0.0f), y(static_cast<size_t>(s.c));
      for (int64_t k = 0; k < s.k; ++k) {
        int32_t r = rows[t * s.k + k];
        if (r < 0) continue;
        float wk = w != nullptr ? w[t * s.k + k] : 1.0f;
        load_row(Y.data, Y.dtype, r * s.c, s.c, y.data());
        for (int64_t c = 0; c < s.c; ++c) acc[c] += wk * y[c];
      }
      store_row(X.data, X.dtype, t * s.c, s.c, acc.data());
    }
  });
}

Status moe_unpermute_bwd_ref(const OpCall* call) {
  return guard([&] {
    MoePermuteShape s = check_unpermute_bwd(call, false);
    const TensorView &dX = call->inputs[0], &Y = call->inputs[1], &dY = call->outputs[0];
    const int32_t* rows = i32(call->inputs[2]);
    const float* w = present(call->inputs[3]) ? f32(call->inputs[3]) : nullptr;
    const int32_t* slots = i32(call->inputs[4]);
    float* dw = present(call->outputs[1]) ? f32_mut(call->outputs[1]) : nullptr;
    check_indices(ops::kMoeUnpermuteBwd, "slot_rows", rows, s.n * s.k, -1, s.m);
    check_indices(ops::kMoeUnpermuteBwd, "row_slots", slots, s.m, -1, s.n * s.k);
    for (int64_t j = 0; j < s.m; ++j) {
      const int32_t slot = slots[j];
      for (int64_t c = 0; c < s.c; ++c)
        store(dY, j * s.c + c,
              slot < 0 ? 0.0f
                       : static_cast<float>((w != nullptr ? w[slot] : 1.0) *
                                            load(dX, (slot / s.k) * s.c + c)));
    }
    if (dw == nullptr) return;
    for (int64_t t = 0; t < s.n; ++t)
      for (int64_t k = 0; k < s.k; ++k) {
        const int32_t r = rows[t * s.k + k];
        double dot = 0;
        for (int64_t c = 0; r >= 0 && c < s.c; ++c)
          dot += static_cast<double>(load(dX, t * s.c + c)) * load(Y, r * s.c + c);
        dw[t * s.k + k] = static_cast<float>(dot);
      }
  });
}

Status moe_unpermute_bwd_fast(const OpCall* call) {
  return guard([&] {
    MoePermuteShape s = check_unpermute_bwd(call, false);
    const TensorView &dX = call->inputs[0], &Y = call->inputs[1], &dY = call->outputs[0];
    const int32_t* rows = i32(call->inputs[2]);
    const float* w = present(call->inputs[3]) ? f32(call->inputs[3]) : nullptr;
    const int32_t* slots = i32(call->inputs[4]);
    float* dw = present(call->outputs[1]) ? f32_mut(call->outputs[1]) : nullptr;
    check_indices(ops::kMoeUnpermuteBwd, "slot_rows", rows, s.n * s.k, -1, s.m);
    check_indices(ops::kMoeUnpermuteBwd, "row_slots", slots, s.m, -1, s.n * s.k);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < s.m; ++j) {
      std::vector<float> d(static_cast<size_t>(s.c), 0.0f);
      int32_t slot = slots[j];
      if (slot >= 0) {
        load_row(dX.data, dX.dtype, (slot / s.k) * s.c, s.c, d.data());
        float wk = w != nullptr ? w[slot] : 1.0f;
        for (float& v : d) v *= wk;
      }
      store_row(dY.data, dY.dtype, j * s.c, s.c, d.data());
    }
    if (dw == nullptr) return;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < s.n; ++t) {
      std::vector<float> dx(static_cast<size_t>(s.c)), y(static_cast<size_t>(s.c));
      load_row(dX.data, dX.dtype, t * s.c, s.c, dx.data());
      for (int64_t k = 0; k < s.k; ++k) {
        int32_t r = rows[t * s.k + k];
        double dot = 0;
        if (r >= 0) {
          load_row(Y.data, Y.dtype, r * s.c, s.c, y.data());
          for (int64_t c = 0; c < s.c; ++c) dot += static_cast<double>(dx[c]) * y[c];
        }
        dw[t * s.k + k] = static_cast<float>(dot);
      }
    }
  });
}

LOOM_CPU_HOOKS(moe_permute, check_permute, 0.0)
LOOM_CPU_HOOKS(moe_unpermute, check_unpermute, 2.0)
LOOM_CPU_HOOKS(moe_unpermute_bwd, check_unpermute_bwd, 2.0)

}  // namespace

void add_moe_permute_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kMoePermute, moe_permute);
  LOOM_CPU_REGISTER(out, ops::kMoeUnpermute, moe_unpermute);
  LOOM_CPU_REGISTER(out, ops::kMoeUnpermuteBwd, moe_unpermute_bwd);
}

}  // namespace loom::kernels::cpu
