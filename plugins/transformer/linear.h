// Linear: the compute of a dense layer, y = x W^T + b, for the modules that own the weight
// (the layer's QKV and output projections, the MLP's fc1 and fc2, the output layer). It
// holds resolved kernels only; parameters belong to the owner, and so do saved activations
// except the FP8 operands below.
//
// FP8 (a run with spec /precision/fp8): a module makes the GEMMs of one of its linear
// "sites" FP8 with enable_fp8 while it is built, which asks the run's recipe for three
// quantisers (activation, weight, output gradient). That site's forward then quantises x
// and W (keeping their transposes for backward, saved in the forward context under the
// site's slots), multiplies them with "fp8_gemm" into y in the module's dtype, and its
// backward quantises dy and runs the two backward GEMMs in FP8 as well (Transformer
// Engine's Linear with fp8_wgrad). Bias terms stay in the module's dtype.
#pragma once

#include <loom/cpp/tensor.h>
#include <loom/sdk.h>

#include <array>
#include <map>
#include <utility>

namespace loom::transformer {

/// Names one GEMM site of a module: its FP8 tensors are saved under (owner, slot ..
/// slot + Linear::kFp8Slots - 1), which the module must leave free.
struct LinearSite {
  const void* owner;
  int32_t slot;
};

class Linear {
 public:
  /// Forward-context slots an FP8 site uses from its first slot on.
  static constexpr int32_t kFp8Slots = 4;

  /// Resolves gemm, bias_add and bias_grad for activations of `dtype` on `device`.
  Linear(IHost& host, Device device, DType dtype);

  /// Makes `site`'s GEMMs FP8 when the run has an FP8 recipe (ctx.fp8_recipe()); does
  /// nothing otherwise. Call it while the owner is built.
  void enable_fp8(IBuildContext& ctx, LinearSite site);
  /// True when `site` runs in FP8.
  bool fp8(LinearSite site) const;

  /// y (N, out) = x (N, in) @ w^T (out, in) + bias (out) when present. In FP8 the site's
  /// quantised operands are saved in `ctx` when it is training.
  void forward(IForwardContext& ctx, LinearSite site, const TensorView& x, const TensorView& w,
               const TensorView& bias, const TensorView& y) const;
  /// dw (out, in) += dy^T @ x; dbias (out) += sum_n dy when present; dx (N, in) = dy @ w
  /// when present (overwritten). In FP8, x and w are not read (the saved quantised
  /// operands are): they may be empty views.
  void backward(IForwardContext& ctx, LinearSite site, const TensorView& dy, const TensorView& x,
                const TensorView& w, const TensorView& dw, const TensorView& dbias,
                const TensorView& dx) const;
  /// The same without FP8 (the output layer's GEMMs).
  void forward(const TensorView& x, const TensorView& w, const TensorView& bias,
               const TensorView& y) const;
  void backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                const TensorView& dw, const TensorView& dbias, const TensorView& dx) const;
  /// y (N, out) += bias (out): the bias of a row-parallel layer, added after the sum.
  void add_bias(const TensorView& bias, const TensorView& y) const;
  /// dbias (out) += sum_n dy (N, out).
  void bias_grad(const TensorView& dy, const TensorView& dbias) const;

 private:
  /// The quantisers of one FP8 site.
  struct Fp8Site {
    int32_t act, weight, grad;
    DType act_dtype, weight_dtype, grad_dtype;
  };
  const Fp8Site* fp8_site(LinearSite site) const;
  /// Quantises `x` (M, K) with quantiser `id` of `dtype` into (M, K) (when `rowwise`) and
  /// its (K, M) transpose (when `columnwise`); returns {q, q^T, scale_inv}, empty views for
  /// what was not asked.
  std::array<TensorView, 3> quantize(IForwardContext& ctx, int32_t id, DType dtype,
                                     const TensorView& x, bool rowwise, bool columnwise) const;
  const Kernel& fp8_gemm(DType a_dtype) const;

  Device device_;
  Kernel gemm_, bias_add_, bias_grad_;
  IHost* host_;
  IFp8Recipe* recipe_ = nullptr;
  std::map<std::pair<const void*, int32_t>, Fp8Site> sites_;
  std::map<DType, Kernel> fp8_gemm_;
};

}  // namespace loom::transformer
