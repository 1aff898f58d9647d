#include "plugins/transformer/linear.h"

#include <string>

#include "plugins/transformer/views.h"

namespace loom::transformer {
namespace {

// The FP8 slots of a site, from its first: the quantised x^T and W^T, their scale_invs.
enum Fp8Slot : int32_t { kXt, kWt, kXScaleInv, kWScaleInv };

}  // namespace

Linear::Linear(IHost& host, Device device, DType dtype)
    : device_(device),
      gemm_(host, ops::kGemm, device, dtype),
      bias_add_(host, ops::kBiasAdd, device, dtype),
      bias_grad_(host, ops::kBiasGrad, device, dtype),
      host_(&host) {}

void Linear::enable_fp8(IBuildContext& ctx, LinearSite site) {
  if (ctx.interface_info().minor < 1 || ctx.fp8_recipe() == nullptr) return;
  recipe_ = ctx.fp8_recipe();
  // One quantiser per (site, role): the site's id is its owner's address offset by its slot
  // (distinct slots of one owner give distinct keys).
  const void* key = static_cast<const char*>(site.owner) + site.slot;
  Fp8Site s{};
  Fp8QuantizerInfo info{};
  throw_if_error(recipe_->quantizer(key, Fp8Role::kActivation, &s.act, &info), "fp8 quantizer");
  s.act_dtype = info.dtype;
  throw_if_error(recipe_->quantizer(key, Fp8Role::kWeight, &s.weight, &info), "fp8 quantizer");
  s.weight_dtype = info.dtype;
  throw_if_error(recipe_->quantizer(key, Fp8Role::kGradOutput, &s.grad, &info), "fp8 quantizer");
  s.grad_dtype = info.dtype;
  if (info.granularity != Fp8Granularity::kPerTensor || info.scale_dtype != DType::kF32)
    fail(Code::kUnimplemented,
         "linear: the FP8 recipe asks for block scales; this layer's GEMMs take per-tensor "
         "scales (use the delayed or tensorwise recipe)");
  for (DType a : {s.act_dtype, s.grad_dtype})
    if (!fp8_gemm_.count(a)) fp8_gemm_.emplace(a, Kernel(*host_, ops::kFp8Gemm, device_, a));
  sites_[{site.owner, site.slot}] = s;
}

bool Linear::fp8(LinearSite site) const { return fp8_site(site) != nullptr; }

const Linear::Fp8Site* Linear::fp8_site(LinearSite site) const {
  auto it = sites_.find({site.owner, site.slot});
  return it == sites_.end() ? nullptr : &it->second;
}

const Kernel& Linear::fp8_gemm(DType a_dtype) const { return fp8_gemm_.at(a_dtype); }

std::array<TensorView, 3> Linear::quantize(IForwardContext& ctx, int32_t id, DType dtype,
                                           const TensorView& x, bool rowwise,
                                           bool columnwise) const {
  const int64_t k = x.shape[x.ndim - 1], m = numel(x) / k;
  std::array<TensorView, 3> out{empty_view(), empty_view(),
                                allocate(ctx, DType::kF32, {1}, device_)};
  if (rowwise) out[0] = allocate(ctx, dtype, {m, k}, device_);
  if (columnwise) out[1] = allocate(ctx, dtype, {k, m}, device_);
  TensorView rows_view = reshape(x, {m, k});
  // Evaluation quantises with the training scales and leaves the recipe's state alone.
  uint32_t flags = ctx.training() ? kFp8QuantizeDefault : kFp8NoAmaxRecord;
  throw_if_error(recipe_->quantize(id, &rows_view, &out[0], &out[1], &out[2], flags, nullptr),
                 "linear: FP8 quantisation");
  return out;
}

void Linear::forward(IForwardContext& ctx, LinearSite site, const TensorView& x,
                     const TensorView& w, const TensorView& bias, const TensorView& y) const {
  const Fp8Site* s = fp8_site(site);
  if (s == nullptr) return forward(x, w, bias, y);
  const bool training = ctx.training();
  // x (N, in) -> xq (N, in) for this GEMM, xq^T (in, N) for dW; w (out, in) -> wq for this
  // GEMM, wq^T (in, out) for dx.
  auto [xq, xt, xs] = quantize(ctx, s->act, s->act_dtype, x, true, training);
  auto [wq, wt, ws] = quantize(ctx, s->weight, s->weight_dtype, w, true, training);
  fp8_gemm(s->act_dtype)({xq, wq, xs, ws}, {y}, ops::Fp8GemmAttrs{1.f, 0.f, 1});
  if (present(bias)) bias_add_({bias}, {y});
  if (training) {
    save(ctx, site.owner, site.slot + kXt, xt);
    save(ctx, site.owner, site.slot + kWt, wt);
    save(ctx, site.owner, site.slot + kXScaleInv, xs);
    save(ctx, site.owner, site.slot + kWScaleInv, ws);
  }
  release_all(ctx, {xq, wq, xt, wt, xs, ws});  // the saves keep what backward reads
}

void Linear::backward(IForwardContext& ctx, LinearSite site, const TensorView& dy,
                      const TensorView& x, const TensorView& w, const TensorView& dw,
                      const TensorView& dbias, const TensorView& dx) const {
  const Fp8Site* s = fp8_site(site);
  if (s == nullptr) return backward(dy, x, w, dw, dbias, dx);
  TensorView xt = load(ctx, site.owner, site.slot + kXt);  // (in, N)
  TensorView wt = load(ctx, site.owner, site.slot + kWt);  // (in, out)
  TensorView xs = load(ctx, site.owner, site.slot + kXScaleInv);
  TensorView ws = load(ctx, site.owner, site.slot + kWScaleInv);
  // dy (N, out) -> dyq (N, out) for dx, dyq^T (out, N) for dW.
  auto [dyq, dyt, gs] = quantize(ctx, s->grad, s->grad_dtype, dy, present(dx), true);
  // dW (out, in) += dy^T (out, N) @ x (N, in): both operands N-contiguous.
  fp8_gemm(s->grad_dtype)({dyt, xt, gs, xs}, {dw}, ops::Fp8GemmAttrs{1.f, 1.f, 0});
  if (present(dbias)) bias_grad_({dy}, {dbias});
  // dx (N, in) = dy (N, out) @ W (out, in): both operands out-contiguous.
  if (present(dx)) fp8_gemm(s->grad_dtype)({dyq, wt, gs, ws}, {dx}, ops::Fp8GemmAttrs{1.f, 0.f, 0});
  release_all(ctx, {dyq, dyt, gs});
}

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
