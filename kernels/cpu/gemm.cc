// gemm: Y[b] = alpha * op(A[b]) @ op(B[b]) + beta * Y[b] (loom/ops.h).
//   reference: triple loop, f64 accumulation.
//   fast: OpenBLAS cblas_sgemm per batch (one call when B is shared and A not transposed);
//         bf16 / f16 operands are converted to f32 scratch first.
// f64 (A, B and Y all f64, keyed on f64): the reference is the same triple loop in f64 with
// alpha and beta as f64, the fast kernel cblas_dgemm with the same batch folding.
#include <cblas.h>
#include <loom/cpp/op_checks/gemm.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::GemmShape;
using ops::GemmAttrs;

// The shared checks (loom/cpp/op_checks/gemm.h) for host tensors.
GemmShape check_gemm(const OpCall* call, bool shapes_only) {
  return op_checks::check_gemm(call, shapes_only, DeviceType::kCpu);
}

bool gemm_supports(const OpCall* call) {
  return passes([&] { check_gemm(call, true); });
}

Status gemm_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    GemmShape s = check_gemm(call, true);
    *out = io_cost(call, 2.0 * s.batch * s.m * s.n * s.k);
    if (s.attrs.beta != 0.0f)  // Y is read too
      out->bytes_read += static_cast<double>(numel(call->outputs[0])) *
                         static_cast<double>(dtype_size(call->outputs[0].dtype));
  });
}

// The f64 reference: the loop below with f64 operands, no rounding but the products' own.
void gemm_ref_f64(const GemmShape& s, const TensorView& A, const TensorView& B,
                  const TensorView& Y) {
  const GemmAttrs& at = s.attrs;
  const double *a = static_cast<const double*>(A.data), *bm = static_cast<const double*>(B.data);
  double* y = static_cast<double*>(Y.data);
  for (int64_t b = 0; b < s.batch; ++b) {
    int64_t a0 = b * s.m * s.k, b0 = s.shared_b ? 0 : b * s.k * s.n, y0 = b * s.m * s.n;
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0.0;
        for (int64_t p = 0; p < s.k; ++p)
          acc += a[a0 + (at.trans_a ? p * s.m + i : i * s.k + p)] *
                 bm[b0 + (at.trans_b ? j * s.k + p : p * s.n + j)];
        double v = static_cast<double>(at.alpha) * acc;
        if (at.beta != 0.0f) v += static_cast<double>(at.beta) * y[y0 + i * s.n + j];
        y[y0 + i * s.n + j] = v;
      }
  }
}

Status gemm_ref(const OpCall* call) {
  return guard([&] {
    GemmShape s = check_gemm(call, false);
    const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
    if (A.dtype == DType::kF64) return gemm_ref_f64(s, A, B, Y);
    const GemmAttrs& at = s.attrs;
    for (int64_t b = 0; b < s.batch; ++b) {
      int64_t a0 = b * s.m * s.k, b0 = s.shared_b ? 0 : b * s.k * s.n, y0 = b * s.m * s.n;
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) {
          double acc = 0.0;
          for (int64_t p = 0; p < s.k; ++p) {
            float av = load(A, a0 + (at.trans_a ? p * s.m + i : i * s.k + p));
            float bv = load(B, b0 + (at.trans_b ? j * s.k + p : p * s.n + j));
            acc += static_cast<double>(av) * bv;
          }
          double y = at.alpha * acc;
          // beta == 0 overwrites without reading Y (it may hold NaN).
          if (at.beta != 0.0f) y += static_cast<double>(at.beta) * load(Y, y0 + i * s.n + j);
          store(Y, y0 + i * s.n + j, static_cast<float>(y));
        }
    }
  });
}

// f32 scratch of at least n floats, one per thread and slot (reused across calls).
float* scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& v = buffers[slot];
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The f64 fast path: cblas_dgemm per batch, one call when the batches stack along M.
void gemm_fast_f64(const GemmShape& s, const TensorView& A, const TensorView& B,
                   const TensorView& Y) {
  const GemmAttrs& at = s.attrs;
  if (s.m * s.n == 0 || s.batch == 0) return;
  int64_t calls = s.batch, m = s.m;
  if (s.shared_b && !at.trans_a) {
    m = s.batch * s.m;
    calls = 1;
  }
  const int64_t a_size = m * s.k, b_size = s.k * s.n, c_size = m * s.n;
  for (int64_t b = 0; b < calls; ++b) {
    const double* pa = static_cast<const double*>(A.data) + b * a_size;
    const double* pb = static_cast<const double*>(B.data) + (s.shared_b ? 0 : b * b_size);
    double* pc = static_cast<double*>(Y.data) + b * c_size;
    // beta == 0 must not read Y (it may hold NaN).
    if (at.beta == 0.0f) std::memset(pc, 0, static_cast<size_t>(c_size) * sizeof(double));
    if (s.k == 0) {
      if (at.beta != 0.0f && at.beta != 1.0f)
        for (int64_t i = 0; i < c_size; ++i) pc[i] *= at.beta;
      continue;
    }
    cblas_dgemm(CblasRowMajor, at.trans_a ? CblasTrans : CblasNoTrans,
                at.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(s.n),
                static_cast<int>(s.k), at.alpha, pa, static_cast<int>(at.trans_a ? m : s.k), pb,
                static_cast<int>(at.trans_b ? s.k : s.n), at.beta, pc, static_cast<int>(s.n));
  }
}

Status gemm_fast(const OpCall* call) {
  return guard([&] {
    GemmShape s = check_gemm(call, false);
    const TensorView &A = call->inputs[0], &B = call->inputs[1], &Y = call->outputs[0];
    if (A.dtype == DType::kF64) return gemm_fast_f64(s, A, B, Y);
    const GemmAttrs& at = s.attrs;
    int64_t y_size = s.m * s.n;
    if (y_size == 0 || s.batch == 0) return;
    // One sgemm over all batches when they stack along M: B shared and A (batch*M, K).
    int64_t calls = s.batch, m = s.m;
    if (s.shared_b && !at.trans_a) {
      m = s.batch * s.m;
      calls = 1;
    }
    int64_t a_size = m * s.k, b_size = s.k * s.n, c_size = m * s.n;
    for (int64_t b = 0; b < calls; ++b) {
      const float* pa = A.dtype == DType::kF32 ? f32(A) + b * a_size : nullptr;
      const float* pb = B.dtype == DType::kF32 ? f32(B) + (s.shared_b ? 0 : b * b_size) : nullptr;
      float* pc = Y.dtype == DType::kF32 ? f32_mut(Y) + b * c_size : nullptr;
      if (pa == nullptr) {
        float* t = scratch(0, a_size);
        load_row(A.data, A.dtype, b * a_size, a_size, t);
        pa = t;
      }
      if (pb == nullptr && (b == 0 || !s.shared_b)) {
        float* t = scratch(1, b_size);
        load_row(B.data, B.dtype, s.shared_b ? 0 : b * b_size, b_size, t);
        pb = t;
      } else if (pb == nullptr) {
        pb = scratch(1, b_size);  // shared B, converted at b == 0
      }
      bool convert_c = pc == nullptr;
      if (convert_c) {
        pc = scratch(2, c_size);
        if (at.beta != 0.0f) load_row(Y.data, Y.dtype, b * c_size, c_size, pc);
      }
      // beta == 0 must not read Y (it may hold NaN); zero it so no BLAS reads garbage.
      if (at.beta == 0.0f) std::memset(pc, 0, static_cast<size_t>(c_size) * sizeof(float));
      if (s.k == 0) {
        if (at.beta != 0.0f && at.beta != 1.0f)
          for (int64_t i = 0; i < c_size; ++i) pc[i] *= at.beta;
      } else {
        cblas_sgemm(CblasRowMajor, at.trans_a ? CblasTrans : CblasNoTrans,
                    at.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                    static_cast<int>(s.n), static_cast<int>(s.k), at.alpha, pa,
                    static_cast<int>(at.trans_a ? m : s.k), pb,
                    static_cast<int>(at.trans_b ? s.k : s.n), at.beta, pc, static_cast<int>(s.n));
      }
      if (convert_c) store_row(Y.data, Y.dtype, b * c_size, c_size, pc);
    }
  });
}

bool gemm_fast_supports(const OpCall* call) {
  // BLAS takes int dimensions.
  return cpu_has_avx2() && passes([&] {
           GemmShape s = check_gemm(call, true);
           if (s.batch * s.m > INT32_MAX || s.n > INT32_MAX || s.k > INT32_MAX) throw 0;
         });
}

}  // namespace

void add_gemm_kernels(std::vector<KernelDesc>& out) {
  // f64 too: the fp64 router's GEMMs (loom/ops/gemm.h).
  add_kernels(out, ops::kGemm, kRefName, kRefPriority, gemm_ref, gemm_supports, gemm_cost,
              {DType::kF32, DType::kBF16, DType::kF16, DType::kF64});
  add_kernels(out, ops::kGemm, kFastName, kFastPriority, gemm_fast, gemm_fast_supports, gemm_cost,
              {DType::kF32, DType::kBF16, DType::kF16, DType::kF64});
}

}  // namespace loom::kernels::cpu
