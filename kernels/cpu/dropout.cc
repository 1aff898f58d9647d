// dropout_fwd / dropout_bwd: Y = X * keep / (1 - p), keep drawn from Philox4x32-10 at
// (key, counter) as loom/ops.h specifies (loom/cpp/philox.h), so backward redraws the mask.
//   reference: one Philox block per element (the plain definition).
//   fast: OpenMP over chunks, one Philox block per 4 elements; bit-identical mask.
#include <loom/cpp/op_checks/dropout.h>
#include <loom/cpp/philox.h>

#include <algorithm>

#include "kernels/cpu/common.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kChunk = 4096;  // a multiple of 4: chunks start on Philox block boundaries

int64_t check_dropout_fwd(const OpCall* c, bool s) {
  return op_checks::check_dropout_fwd(c, s, DeviceType::kCpu);
}
int64_t check_dropout_bwd(const OpCall* c, bool s) {
  return op_checks::check_dropout_bwd(c, s, DeviceType::kCpu);
}

// Forward and backward are the same map (the mask scaled by 1 / (1 - p)).
void dropout_ref_impl(const OpCall* call, int64_t n) {
  const ops::DropoutAttrs& at = *static_cast<const ops::DropoutAttrs*>(call->attrs);
  uint32_t threshold = keep_threshold(at.p);
  float scale = 1.0f / (1.0f - at.p);
  for (int64_t i = 0; i < n; ++i) {
    bool keep = philox_keep(at.key, at.counter, static_cast<uint64_t>(i), threshold);
    store(call->outputs[0], i, keep ? load(call->inputs[0], i) * scale : 0.0f);
  }
}

Status dropout_fwd_ref(const OpCall* call) {
  return guard([&] { dropout_ref_impl(call, check_dropout_fwd(call, false)); });
}
Status dropout_bwd_ref(const OpCall* call) {
  return guard([&] { dropout_ref_impl(call, check_dropout_bwd(call, false)); });
}

LOOM_CPU_FAST_BEGIN

void dropout_fast_impl(const OpCall* call, int64_t n) {
  const ops::DropoutAttrs& at = *static_cast<const ops::DropoutAttrs*>(call->attrs);
  const TensorView &X = call->inputs[0], &Y = call->outputs[0];
  uint32_t threshold = keep_threshold(at.p);
  float scale = 1.0f / (1.0f - at.p);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n; c += kChunk) {
    float x[kChunk];
    uint8_t keep[kChunk];
    int64_t len = std::min(kChunk, n - c);
    load_row(X.data, X.dtype, c, len, x);
    philox_keep_range(at.key, at.counter, static_cast<uint64_t>(c), len, threshold, keep);
    for (int64_t i = 0; i < len; ++i) x[i] = keep[i] ? x[i] * scale : 0.0f;
    store_row(Y.data, Y.dtype, c, len, x);
  }
}

Status dropout_fwd_fast(const OpCall* call) {
  return guard([&] { dropout_fast_impl(call, check_dropout_fwd(call, false)); });
}
Status dropout_bwd_fast(const OpCall* call) {
  return guard([&] { dropout_fast_impl(call, check_dropout_bwd(call, false)); });
}

LOOM_CPU_FAST_END

LOOM_CPU_HOOKS(dropout_fwd, check_dropout_fwd, 2)
LOOM_CPU_HOOKS(dropout_bwd, check_dropout_bwd, 2)

}  // namespace

void add_dropout_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kDropoutFwd, dropout_fwd);
  LOOM_CPU_REGISTER(out, ops::kDropoutBwd, dropout_bwd);
}

}  // namespace loom::kernels::cpu
