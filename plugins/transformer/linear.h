// Linear: the compute of a dense layer, y = x W^T + b, for the modules that own the weight
// (the layer's QKV and output projections, the MLP's fc1 and fc2, the output layer). It
// holds resolved kernels only; parameters and saved activations belong to the owner.
#pragma once

#include <loom/cpp/tensor.h>

namespace loom::transformer {

class Linear {
 public:
  /// Resolves gemm, bias_add and bias_grad for activations of `dtype` on `device`.
  Linear(IHost& host, Device device, DType dtype);

  /// y (N, out) = x (N, in) @ w^T (out, in) + bias (out) when present.
  void forward(const TensorView& x, const TensorView& w, const TensorView& bias,
               const TensorView& y) const;
  /// dw (out, in) += dy^T @ x; dbias (out) += sum_n dy when present; dx (N, in) = dy @ w
  /// when present (overwritten).
  void backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                const TensorView& dw, const TensorView& dbias, const TensorView& dx) const;
  /// y (N, out) += bias (out): the bias of a row-parallel layer, added after the sum.
  void add_bias(const TensorView& bias, const TensorView& y) const;
  /// dbias (out) += sum_n dy (N, out).
  void bias_grad(const TensorView& dy, const TensorView& dbias) const;

 private:
  Kernel gemm_, bias_add_, bias_grad_;
};

}  // namespace loom::transformer
