#include "plugins/transformer/linear.h"

namespace loom::transformer {

Linear::Linear(IHost& host, Device device, DType dtype)
    : gemm_(host, ops::kGemm, device, dtype),
      bias_add_(host, ops::kBiasAdd, device, dtype),
      bias_grad_(host, ops::kBiasGrad, device, dtype) {}

void Linear::forward(const TensorView& x, const TensorView& w, const TensorView& bias,
                     const TensorView& y) const {
  gemm_({x, w}, {y}, ops::GemmAttrs{0, 1, 1.f, 0.f});
  if (present(bias)) bias_add_({bias}, {y});
}

void Linear::backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                      const TensorView& dw, const TensorView& dbias, const TensorView& dx) const {
  gemm_({dy, x}, {dw}, ops::GemmAttrs{1, 0, 1.f, 1.f});  // (out, N) @ (N, in), accumulated
  if (present(dbias)) bias_grad_({dy}, {dbias});
  if (present(dx)) gemm_({dy, w}, {dx}, ops::GemmAttrs{0, 0, 1.f, 0.f});  // (N, out) @ (out, in)
}

void Linear::add_bias(const TensorView& bias, const TensorView& y) const { bias_add_({bias}, {y}); }

void Linear::bias_grad(const TensorView& dy, const TensorView& dbias) const {
  bias_grad_({dy}, {dbias});
}

}  // namespace loom::transformer
