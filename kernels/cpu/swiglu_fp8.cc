// swiglu_fp8_fwd / swiglu_fp8_bwd (loom/ops/fp8.h): swiglu's result quantised as fp8_quantize
// would quantise it, without the tensor in between. Forward and backward side by side.
//   reference: one element at a time: swiglu_fwd's (or swiglu_bwd's) reference value
//              (activations.h), rounded to X's dtype, then fp8_quantize's reference loop
//              (fp8.h);
//   fast:      swiglu's fast rows (AVX2), rounded to X's dtype as its store does, through
//              fp8_quantize's fast tiles.
// Each therefore gives the bits of the two ops of its own name, one after the other.
#include <loom/cpp/op_checks/fp8.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/fp8.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::SwigluFp8Shape;

SwigluFp8Shape check_swiglu_fp8_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_swiglu_fp8(call, shapes_only, DeviceType::kCpu, false);
}
SwigluFp8Shape check_swiglu_fp8_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_swiglu_fp8(call, shapes_only, DeviceType::kCpu, true);
}

// One thread's row buffers for the fast kernels: quantize_rows_fast calls `row` from its
// OpenMP threads, one row at a time, so each thread keeps its buffers from row to row (and
// from call to call) instead of allocating them per row.
struct RowScratch {
  std::vector<float> g, u, dy;
  std::vector<uint16_t> rounding;
  static RowScratch& of_this_thread(int64_t padded) {
    thread_local RowScratch s;
    const size_t n = static_cast<size_t>(padded);
    if (s.g.size() < n) {
      s.g.resize(n);
      s.u.resize(n);
      s.dy.resize(n);
    }
    return s;
  }
};

// ---- reference ----------------------------------------------------------------------------

Status swiglu_fp8_fwd_ref(const OpCall* call) {
  return guard([&] {
    const SwigluFp8Shape s = check_swiglu_fp8_fwd(call, false);
    const TensorView& X = call->inputs[0];
    const Fp8Outs o = fp8_outs(call, s.out);
    // y[n, j] = swiglu(X[n, j], X[n, F + j]) as X's dtype holds it.
    quantize_elements_ref(s.n, s.f, f32(call->inputs[1])[0], s.out.out_dtype, o.y, o.yt, o.amax,
                          o.scale_inv, [&](int64_t n, int64_t j) {
                            const int64_t gate = n * 2 * s.f + j;
                            return rounded_to(
                                X.dtype, swiglu_fwd_ref_value(load(X, gate), load(X, gate + s.f)));
                          });
  });
}

Status swiglu_fp8_bwd_ref(const OpCall* call) {
  return guard([&] {
    const SwigluFp8Shape s = check_swiglu_fp8_bwd(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1];
    const Fp8Outs o = fp8_outs(call, s.out);
    // dX[n, c] for c < F the gate's gradient, else the up projection's (of j = c - F).
    quantize_elements_ref(s.n, 2 * s.f, f32(call->inputs[2])[0], s.out.out_dtype, o.y, o.yt, o.amax,
                          o.scale_inv, [&](int64_t n, int64_t c) {
                            const int64_t j = c < s.f ? c : c - s.f, gate = n * 2 * s.f + j;
                            float dg, du;
                            swiglu_bwd_ref_values(load(X, gate), load(X, gate + s.f),
                                                  load(dY, n * s.f + j), &dg, &du);
                            return rounded_to(X.dtype, c < s.f ? dg : du);
                          });
  });
}

// ---- fast ---------------------------------------------------------------------------------

LOOM_CPU_FAST_BEGIN

Status swiglu_fp8_fwd_fast(const OpCall* call) {
  return guard([&] {
    const SwigluFp8Shape s = check_swiglu_fp8_fwd(call, false);
    const TensorView& X = call->inputs[0];
    const Fp8Outs o = fp8_outs(call, s.out);
    const int64_t padded = (s.f + 7) / 8 * 8;
    quantize_rows_fast(s.n, s.f, f32(call->inputs[1])[0], s.out.out_dtype, o.y, o.yt, o.amax,
                       o.scale_inv, [&](int64_t n, float* out) {
                         RowScratch& r = RowScratch::of_this_thread(padded);
                         float *g = r.g.data(), *u = r.u.data();
                         load_row(X.data, X.dtype, n * 2 * s.f, s.f, g);
                         load_row(X.data, X.dtype, n * 2 * s.f + s.f, s.f, u);
                         std::fill(g + s.f, g + padded, 0.f);  // the pad lanes, as before
                         std::fill(u + s.f, u + padded, 0.f);
                         swiglu_fwd_row_fast(g, u, padded);
                         round_row(X.dtype, g, s.f, r.rounding);
                         std::copy(g, g + s.f, out);
                       });
  });
}

Status swiglu_fp8_bwd_fast(const OpCall* call) {
  return guard([&] {
    const SwigluFp8Shape s = check_swiglu_fp8_bwd(call, false);
    const TensorView &dY = call->inputs[0], &X = call->inputs[1];
    const Fp8Outs o = fp8_outs(call, s.out);
    const int64_t padded = (s.f + 7) / 8 * 8;
    quantize_rows_fast(s.n, 2 * s.f, f32(call->inputs[2])[0], s.out.out_dtype, o.y, o.yt, o.amax,
                       o.scale_inv, [&](int64_t n, float* out) {
                         RowScratch& r = RowScratch::of_this_thread(padded);
                         float *g = r.g.data(), *u = r.u.data(), *dy = r.dy.data();
                         load_row(X.data, X.dtype, n * 2 * s.f, s.f, g);
                         load_row(X.data, X.dtype, n * 2 * s.f + s.f, s.f, u);
                         load_row(dY.data, dY.dtype, n * s.f, s.f, dy);
                         std::fill(g + s.f, g + padded, 0.f);  // the pad lanes, as before
                         std::fill(u + s.f, u + padded, 0.f);
                         std::fill(dy + s.f, dy + padded, 0.f);
                         swiglu_bwd_row_fast(g, u, dy, padded);
                         round_row(X.dtype, g, s.f, r.rounding);
                         round_row(X.dtype, u, s.f, r.rounding);
                         std::copy(g, g + s.f, out);
                         std::copy(u, u + s.f, out + s.f);
                       });
  });
}

LOOM_CPU_FAST_END

// swiglu's 8 (fwd) FLOPs an element plus the quantisation's 2.
LOOM_CPU_HOOKS(swiglu_fp8_fwd, check_swiglu_fp8_fwd, 10)
LOOM_CPU_HOOKS(swiglu_fp8_bwd, check_swiglu_fp8_bwd, 10)

}  // namespace

void add_swiglu_fp8_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kSwigluFp8Fwd, swiglu_fp8_fwd);
  LOOM_CPU_REGISTER(out, ops::kSwigluFp8Bwd, swiglu_fp8_bwd);
}

}  // namespace loom::kernels::cpu
