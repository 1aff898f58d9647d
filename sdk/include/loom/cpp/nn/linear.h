// Linear: the compute of a dense layer, y = x W^T + b, for the modules that own the weight
// (a layer's QKV and output projections, an MLP's fc1 and fc2, an output layer). It holds
// resolved kernels only; parameters belong to the owner, and so do saved activations
// except the FP8 operands and the deferred weight-gradient operands below. The owner names
// each of its GEMM sites by a LinearSite: its own `this` and a first forward-context slot,
// from which the site may use kSiteSlots slots that the owner must leave free.
//
// FP8 (a run with spec /precision/fp8): a module makes the GEMMs of one of its linear sites
// FP8 with enable_fp8 while it is built, which asks the run's recipe for three quantisers
// (activation, weight, output gradient). That site's forward then quantises x and W
// (keeping their transposes for backward, saved in the forward context under the site's
// slots), multiplies them with "fp8_gemm" into y in the module's dtype, and its backward
// quantises dy and runs the two backward GEMMs in FP8 as well (Transformer Engine's Linear
// with fp8_wgrad). Bias terms stay in the module's dtype. Under a recipe that gives
// producers (fp8_recipe 1.1, delayed scaling), the kernel that computes x (or dy) may
// quantise it itself: fp8_producer hands out the buffers, scale and amax slot, and
// forward_fp8 / backward_fp8 take the result (an MLP's swiglu_fp8_fwd / _bwd).
//
// FP8 weights kept across micro-batches (Transformer Engine's weight caching, which Megatron
// asks for with is_first_microbatch): when the context gives a param_version (forward_context
// 1.9: training, several micro-batches a step), a site quantises its weight once per version,
// into a copy of its own (q, q^T and scale_inv in one block from the host, kept for the
// Linear's life), and every pass of that version, forward and backward, reads the copy. The
// parameters and the recipe's scales do not change within a version, so the copy holds the
// bits each pass would have quantised (and amax records nothing new): one quantisation a step
// instead of one a micro-batch, and one copy instead of one in each micro-batch in flight
// (a pipeline's). Without a version the weight is quantised in every forward, into the
// context's memory, and its transpose saved for backward.
//
// Weight gradients: the passes that take a context ask it whether the write into dw is the
// step's first (grad_write_beta: a kParamGradOverwrite weight's, forward_context 1.8) and then
// overwrite dw (beta 0: the GEMM does not read it, and what it held, zeros or, where the core
// skipped the zero fill, an earlier step's values, is gone) instead of adding to it.
//
// Deferred weight gradients (zero-bubble schedules; ModuleBase explains the protocol):
// backward with a `deferred` owner id computes dx only and keeps dW's operands (x and dy,
// or their FP8 transposes and scales) under (deferred, site slots); backward_weight then
// computes dW and dbias from them.
#pragma once

#include <loom/cpp/nn/views.h>
#include <loom/cpp/tensor.h>
#include <loom/kinds/fp8_recipe.h>
#include <loom/registry.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace loom::nn {

/// Names one GEMM site of a module: its saved tensors go under (owner, slot ..
/// slot + Linear::kSiteSlots - 1), which the module must leave free.
struct LinearSite {
  const void* owner;
  int32_t slot;
};

class Linear {
 public:
  /// Forward-context slots a site uses from its first slot on.
  static constexpr int32_t kSiteSlots = 4;
  /// The former name of kSiteSlots.
  static constexpr int32_t kFp8Slots = kSiteSlots;

  /// Resolves gemm, bias_add and bias_grad for activations of `dtype` on `device`, and
  /// gemm_epilogue where a kernel serves it (a spec pin "none" turns it off).
  Linear(IHost& host, Device device, DType dtype)
      : device_(device),
        gemm_(host, ops::kGemm, device, dtype),
        bias_add_(host, ops::kBiasAdd, device, dtype),
        bias_grad_(host, ops::kBiasGrad, device, dtype),
        epilogue_(Kernel::optional(host, ops::kGemmEpilogue, device, dtype)),
        host_(&host) {}

  /// Makes `site`'s GEMMs FP8 when the run has an FP8 recipe (ctx.fp8_recipe()); does
  /// nothing otherwise. Call it while the owner is built.
  void enable_fp8(IBuildContext& ctx, LinearSite site) {
    if (ctx.interface_info().minor < 1 || ctx.fp8_recipe() == nullptr) return;
    recipe_ = ctx.fp8_recipe();
    // One quantiser per (site, role): the site's id is its owner's address offset by its
    // slot (distinct slots of one owner give distinct keys).
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
  /// True when `site` runs in FP8.
  bool fp8(LinearSite site) const { return fp8_site(site) != nullptr; }

  /// y (N, out) = x (N, in) @ w^T (out, in) + bias (out) when present. In FP8 the site's
  /// quantised operands are saved in `ctx` when it is training.
  void forward(IForwardContext& ctx, LinearSite site, const TensorView& x, const TensorView& w,
               const TensorView& bias, const TensorView& y) const {
    const Fp8Site* s = fp8_site(site);
    if (s == nullptr) return forward(x, w, bias, y);
    // x (N, in) -> xq (N, in) for this GEMM, xq^T (in, N) for dW.
    auto [xq, xt, xs] = quantize(ctx, s->act, s->act_dtype, x, true, ctx.training());
    forward_fp8(ctx, site, Fp8Operand{xq, xt, xs}, w, bias, y);
  }

  /// An FP8 site's operand, quantised: q (M, K) for the GEMM, its transpose t (K, M) for
  /// the other pass's GEMM, either empty where not needed, and scale_inv f32 (1): the
  /// operand ~ q * scale_inv.
  struct Fp8Operand {
    TensorView q, t, scale_inv;
  };
  /// What a kernel that computes a site's operand and quantises it in one pass (the ops of
  /// the swiglu_fp8_fwd family) writes: `operand`'s q, t and scale_inv (allocated; the op's
  /// outputs [0], [1] and [3], ABI 1.14: scale_inv = 1 / scale is the op's to write) and its
  /// amax output, and what it reads: the quantiser's scale.
  struct Fp8Producer {
    Fp8Operand operand;
    TensorView scale;  ///< f32 (1), the recipe's
    TensorView amax;   ///< f32 (1), the recipe's; empty when nothing is recorded (evaluation)
  };
  /// For an FP8 site whose recipe gives producers (fp8_recipe 1.1: delayed scaling), fills
  /// `out` for the site's operand of `role`, an (m, k) tensor: kActivation, forward's x
  /// (q, and t when training); kGradOutput, backward's dy (q and t). Returns false and
  /// allocates nothing otherwise (not an FP8 site, an older recipe, or one whose scale needs
  /// the tensor: current scaling); the caller then computes the tensor in the module's dtype
  /// and calls forward / backward. The buffers go to forward_fp8 / backward_fp8, which
  /// release them.
  bool fp8_producer(IForwardContext& ctx, LinearSite site, Fp8Role role, int64_t m, int64_t k,
                    Fp8Producer* out) const {
    if (!fp8_produces(site)) return false;
    const Fp8Site* s = fp8_site(site);
    const bool grad = role == Fp8Role::kGradOutput;
    if (!grad && role != Fp8Role::kActivation)
      fail(Code::kInvalidArgument, "linear: fp8_producer serves kActivation and kGradOutput");
    const DType dtype = grad ? s->grad_dtype : s->act_dtype;
    Fp8Producer p{};
    p.operand.scale_inv = allocate(ctx, DType::kF32, {1}, device_);
    p.operand.q = allocate(ctx, dtype, {m, k}, device_);
    if (grad || ctx.training()) p.operand.t = allocate(ctx, dtype, {k, m}, device_);
    const uint32_t flags = ctx.training() ? kFp8QuantizeDefault : kFp8NoAmaxRecord;
    TensorView none = empty_view();  // the op writes scale_inv (its output [3])
    throw_if_error(recipe_->producer(grad ? s->grad : s->act, device_, flags, &p.scale, &p.amax,
                                     &none, nullptr),
                   "linear: FP8 producer");
    *out = p;
    return true;
  }
  /// fp8_producer for a caller that asked fp8_produces(site) first and so counts on the
  /// buffers: an Internal error naming `who` (the module) when the recipe no longer gives them.
  Fp8Producer fp8_producer_or_fail(IForwardContext& ctx, LinearSite site, Fp8Role role, int64_t m,
                                   int64_t k, const char* who) const {
    Fp8Producer p{};
    if (!fp8_producer(ctx, site, role, m, k, &p))
      fail(Code::kInternal,
           std::string(who) + ": the FP8 recipe stopped giving producers during the run");
    return p;
  }
  /// True when fp8_producer serves `site` (an FP8 site whose recipe gives producers).
  bool fp8_produces(LinearSite site) const {
    return fp8_site(site) != nullptr && recipe_gives_producers();
  }
  /// forward of an FP8 site with x already quantised (fp8_producer's kActivation operand):
  /// y (N, out) = x @ w^T (out, in) + bias (out) when present. Saves what backward reads
  /// when training and releases x's buffers.
  void forward_fp8(IForwardContext& ctx, LinearSite site, const Fp8Operand& x, const TensorView& w,
                   const TensorView& bias, const TensorView& y) const {
    const Fp8Site& s = expect_fp8_site(site, "forward_fp8");
    const bool training = ctx.training();
    // w (out, in) -> wq for this GEMM, wq^T (in, out) for dx.
    const Fp8Weight wq = quantized_weight(ctx, site, s, w);
    fp8_gemm(s.act_dtype)({x.q, wq.q, x.scale_inv, wq.scale_inv}, {y},
                          ops::Fp8GemmAttrs{1.f, 0.f, 1});
    if (present(bias)) bias_add_({bias}, {y});
    if (training) {
      save(ctx, site.owner, site.slot + kXt, x.t);
      save(ctx, site.owner, site.slot + kXScaleInv, x.scale_inv);
      if (!wq.kept) {  // a kept copy is read from the copy in backward
        save(ctx, site.owner, site.slot + kWt, wq.t);
        save(ctx, site.owner, site.slot + kWScaleInv, wq.scale_inv);
      }
    }
    release_all(ctx, {x.q, x.t, x.scale_inv});  // the saves keep what backward reads
    if (!wq.kept) release_all(ctx, {wq.q, wq.t, wq.scale_inv});
  }
  /// dw (out, in) += dy^T @ x; dbias (out) += sum_n dy when present; dx (N, in) = dy @ w
  /// when present (overwritten). In FP8, x and w are not read (the saved quantised
  /// operands are): they may be empty views.
  /// \param deferred  null: all of the above; else the owner's deferred id
  ///                  (ModuleBase::deferred_owner): dx only, dW's operands kept there for
  ///                  backward_weight (dw and dbias are not touched)
  void backward(IForwardContext& ctx, LinearSite site, const TensorView& dy, const TensorView& x,
                const TensorView& w, const TensorView& dw, const TensorView& dbias,
                const TensorView& dx, const void* deferred = nullptr) const {
    const Fp8Site* s = fp8_site(site);
    if (s == nullptr) {
      if (deferred == nullptr)
        return backward(dy, x, w, dw, dbias, dx, present(dw) ? grad_write_beta(ctx, dw) : 1.f);
      save(ctx, deferred, deferred_slot(site, kDy), dy);
      save(ctx, deferred, deferred_slot(site, kX), x);
      if (present(dx)) gemm_({dy, w}, {dx}, ops::GemmAttrs{0, 0, 1.f, 0.f});
      return;
    }
    // dy (N, out) -> dyq (N, out) for dx, dyq^T (out, N) for dW.
    auto [dyq, dyt, gs] = quantize(ctx, s->grad, s->grad_dtype, dy, present(dx), true);
    backward_quantized(ctx, site, *s, Fp8Operand{dyq, dyt, gs}, dy, dw, dbias, dx, deferred);
  }
  /// backward of an FP8 site with dy already quantised (fp8_producer's kGradOutput
  /// operand): dw (out, in) += dy^T @ x, dx (N, in) = dy @ w when present, as backward does
  /// (`deferred` likewise). No bias gradient: that needs dy in the module's dtype (use
  /// backward). Releases dy's buffers.
  void backward_fp8(IForwardContext& ctx, LinearSite site, const Fp8Operand& dy,
                    const TensorView& dw, const TensorView& dx,
                    const void* deferred = nullptr) const {
    backward_quantized(ctx, site, expect_fp8_site(site, "backward_fp8"), dy, empty_view(), dw,
                       empty_view(), dx, deferred);
  }
  /// The weight gradients backward deferred for `site` (same `deferred` id): dw (out, in)
  /// += dy^T @ x; dbias (out) += sum_n dy when present.
  void backward_weight(IForwardContext& ctx, LinearSite site, const void* deferred,
                       const TensorView& dw, const TensorView& dbias) const {
    const Fp8Site* s = fp8_site(site);
    if (s == nullptr) {
      TensorView dy = load(ctx, deferred, deferred_slot(site, kDy));
      backward(dy, load(ctx, deferred, deferred_slot(site, kX)), empty_view(), dw, dbias,
               empty_view(), present(dw) ? grad_write_beta(ctx, dw) : 1.f);
      return;
    }
    fp8_weight_grad(*s, load(ctx, deferred, deferred_slot(site, kDyt)),
                    load(ctx, deferred, deferred_slot(site, kXtDeferred)),
                    load(ctx, deferred, deferred_slot(site, kGradScaleInv)),
                    load(ctx, deferred, deferred_slot(site, kXScaleInvDeferred)), dw,
                    grad_write_beta(ctx, dw));
    if (present(dbias)) bias_grad_({load(ctx, deferred, deferred_slot(site, kDy))}, {dbias});
  }

  /// The same without FP8 and without a context (an output layer's GEMMs, tests). With
  /// gemm_epilogue and 2-D operands (rows(...)), the bias rides on the GEMM (kEpilogueBias)
  /// and dbias on the weight gradient's (kEpilogueBiasGradA).
  void forward(const TensorView& x, const TensorView& w, const TensorView& bias,
               const TensorView& y) const {
    if (present(bias) && epilogue_ && x.ndim == 2 && y.ndim == 2) {  // the op is 2-D
      epilogue_({x, w, bias, empty_view()}, {y, empty_view(), empty_view()},
                ops::GemmEpilogueAttrs{0, 1, ops::kEpilogueBias, 0, 0.f});
      return;
    }
    gemm_({x, w}, {y}, ops::GemmAttrs{0, 1, 1.f, 0.f});
    if (present(bias)) bias_add_({bias}, {y});
  }
  /// \param dw_beta  1: dw += dy^T @ x; 0: dw = dy^T @ x (dw not read)
  void backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                const TensorView& dw, const TensorView& dbias, const TensorView& dx,
                float dw_beta = 1.f) const {
    if (present(dw) && present(dbias) && epilogue_ && dy.ndim == 2 && x.ndim == 2) {
      // dw (out, in) (+)= dy^T (out, N) @ x (N, in); dbias (out) += sum_n dy[n, :].
      epilogue_({dy, x, empty_view(), empty_view()}, {dw, empty_view(), dbias},
                ops::GemmEpilogueAttrs{1, 0, ops::kEpilogueBiasGradA, 0, dw_beta});
    } else {
      if (present(dw))  // (out, N) @ (N, in)
        gemm_({dy, x}, {dw}, ops::GemmAttrs{1, 0, 1.f, dw_beta});
      if (present(dbias)) bias_grad_({dy}, {dbias});
    }
    if (present(dx)) gemm_({dy, w}, {dx}, ops::GemmAttrs{0, 0, 1.f, 0.f});  // (N, out) @ (out, in)
  }

  /// True when `site` can fuse its activation into its GEMMs (forward_gelu, backward_dgelu):
  /// a kernel serves gemm_epilogue and the site is not FP8.
  bool fuses_activation(LinearSite site) const {
    return static_cast<bool>(epilogue_) && fp8_site(site) == nullptr;
  }
  /// pre (N, out) = x (N, in) @ w^T (out, in) + bias (out) when present, and
  /// act (N, out) = gelu(pre), in one GEMM (kEpilogueGelu). Needs fuses_activation(site).
  /// \param approximate  gelu's variant (ops::GeluAttrs): 0 erf, 1 tanh
  void forward_gelu(const TensorView& x, const TensorView& w, const TensorView& bias,
                    int32_t approximate, const TensorView& pre, const TensorView& act) const {
    epilogue_({x, w, bias, empty_view()}, {act, pre, empty_view()},
              ops::GemmEpilogueAttrs{0, 1, ops::kEpilogueGelu, approximate, 0.f});
  }
  /// The input gradient of a site through the GELU before it, in one GEMM (kEpilogueDGelu):
  /// dpre (N, in) = gelu'(pre) * (dy (N, out) @ w (out, in)), where pre (N, in) is that
  /// GELU's input, and dbias (in) += the column sums of dpre when present (the bias gradient
  /// of the layer that produced pre). Needs fuses_activation(site) of this site.
  void backward_dgelu(const TensorView& dy, const TensorView& w, const TensorView& pre,
                      int32_t approximate, const TensorView& dbias, const TensorView& dpre) const {
    epilogue_({dy, w, empty_view(), pre}, {dpre, empty_view(), dbias},
              ops::GemmEpilogueAttrs{0, 0, ops::kEpilogueDGelu, approximate, 0.f});
  }
  /// y (N, out) += bias (out): the bias of a row-parallel layer, added after the sum.
  void add_bias(const TensorView& bias, const TensorView& y) const { bias_add_({bias}, {y}); }
  /// dbias (out) += sum_n dy (N, out).
  void bias_grad(const TensorView& dy, const TensorView& dbias) const { bias_grad_({dy}, {dbias}); }

 private:
  // A site's slots, from its first: the FP8 x^T and W^T with their scale_invs (forward to
  // backward, under the owner), and the deferred operands (under the deferred id).
  enum Slot : int32_t { kXt = 0, kWt = 1, kXScaleInv = 2, kWScaleInv = 3 };
  // The deferred operands of a site: under the owner's deferred id, at deferred_slot(site, k).
  enum DeferredSlot : int32_t { kDy, kX, kDyt, kXtDeferred, kGradScaleInv, kXScaleInvDeferred };
  static int32_t deferred_slot(LinearSite site, DeferredSlot k) { return site.slot * 8 + k; }

  /// The quantisers of one FP8 site.
  struct Fp8Site {
    int32_t act, weight, grad;
    DType act_dtype, weight_dtype, grad_dtype;
  };
  const Fp8Site* fp8_site(LinearSite site) const {
    auto it = sites_.find({site.owner, site.slot});
    return it == sites_.end() ? nullptr : &it->second;
  }
  const Kernel& fp8_gemm(DType a_dtype) const { return fp8_gemm_.at(a_dtype); }
  const Fp8Site& expect_fp8_site(LinearSite site, const char* what) const {
    const Fp8Site* s = fp8_site(site);
    if (s == nullptr)
      fail(Code::kFailedPrecondition,
           std::string("linear: ") + what + " on a site that is not FP8 (check fp8(site) first)");
    return *s;
  }
  // True when the recipe is 1.1 or newer and its producer answers (asked once: the answer is
  // the recipe's kind, delayed or current scaling).
  bool recipe_gives_producers() const {
    if (producers_ < 0) {
      producers_ = 0;
      if (recipe_->interface_info().minor >= 1) {
        TensorView scale{}, amax{}, none = empty_view();
        const Fp8Site& s = sites_.begin()->second;
        // A probe without a scale_inv to write and without recording: nothing changes.
        Status st =
            recipe_->producer(s.act, device_, kFp8NoAmaxRecord, &scale, &amax, &none, nullptr);
        if (st.code == Code::kOk)
          producers_ = 1;
        else if (st.code != Code::kUnimplemented)
          throw_if_error(st, "linear: FP8 producer");
        else
          status_release(&st);
      }
    }
    return producers_ == 1;
  }
  // The tail of both FP8 backwards: dy quantised; dy_dtype (the module's dtype) only for
  // dbias, which needs it.
  void backward_quantized(IForwardContext& ctx, LinearSite site, const Fp8Site& s,
                          const Fp8Operand& dy, const TensorView& dy_dtype, const TensorView& dw,
                          const TensorView& dbias, const TensorView& dx,
                          const void* deferred) const {
    TensorView xt = load(ctx, site.owner, site.slot + kXt);  // (in, N)
    TensorView xs = load(ctx, site.owner, site.slot + kXScaleInv);
    // W^T (in, out): the kept copy the forward read, or what it saved.
    const WeightCopy* kept = kept_weight(ctx, site);
    TensorView wt = kept != nullptr ? kept->t : load(ctx, site.owner, site.slot + kWt);
    TensorView ws =
        kept != nullptr ? kept->scale_inv : load(ctx, site.owner, site.slot + kWScaleInv);
    if (deferred == nullptr) {
      fp8_weight_grad(s, dy.t, xt, dy.scale_inv, xs, dw, grad_write_beta(ctx, dw));
      if (present(dbias)) bias_grad_({dy_dtype}, {dbias});
    } else {
      save(ctx, deferred, deferred_slot(site, kDyt), dy.t);
      save(ctx, deferred, deferred_slot(site, kXtDeferred), xt);
      save(ctx, deferred, deferred_slot(site, kGradScaleInv), dy.scale_inv);
      save(ctx, deferred, deferred_slot(site, kXScaleInvDeferred), xs);
      if (present(dbias))
        save(ctx, deferred, deferred_slot(site, kDy), dy_dtype);  // dbias needs dy itself
    }
    // dx (N, in) = dy (N, out) @ W (out, in): both operands out-contiguous.
    if (present(dx))
      fp8_gemm(s.grad_dtype)({dy.q, wt, dy.scale_inv, ws}, {dx}, ops::Fp8GemmAttrs{1.f, 0.f, 0});
    release_all(ctx, {dy.q, dy.t, dy.scale_inv});  // a deferred save keeps dy.t and scale_inv
  }

  // dW (out, in) (+)= dy^T (out, N) @ x (N, in): both operands N-contiguous; beta 0
  // overwrites dW.
  void fp8_weight_grad(const Fp8Site& s, const TensorView& dyt, const TensorView& xt,
                       const TensorView& gs, const TensorView& xs, const TensorView& dw,
                       float beta) const {
    fp8_gemm(s.grad_dtype)({dyt, xt, gs, xs}, {dw}, ops::Fp8GemmAttrs{1.f, beta, 0});
  }
  // The FP8 copy of one site's weight kept across the passes of one param_version (see the
  // top of this file): q (out, in), t = q^T (in, out) and scale_inv (1), in one block.
  struct WeightCopy {
    IHost* host = nullptr;
    Device device{};
    void* block = nullptr;
    uint64_t version = 0;  // the param_version it holds the weight of; 0: none yet
    TensorView q{}, t{}, scale_inv{};
    WeightCopy() = default;
    WeightCopy(const WeightCopy&) = delete;
    WeightCopy& operator=(const WeightCopy&) = delete;
    ~WeightCopy() {
      if (block != nullptr) host->deallocate(device, block);
    }
  };
  // A site's quantised weight for one pass; `kept`: the site's WeightCopy (not the context's
  // memory: neither saved nor released).
  struct Fp8Weight {
    TensorView q, t, scale_inv;
    bool kept;
  };
  // The quantised `w` (out, in) of FP8 site `site` for a pass on `ctx`: from the site's copy
  // under a param_version (quantised into it on the version's first pass), else quantised
  // into the context's memory (q^T only when training).
  Fp8Weight quantized_weight(IForwardContext& ctx, LinearSite site, const Fp8Site& s,
                             const TensorView& w) const {
    const uint64_t version = ctx.training() ? param_version_of(ctx) : 0;
    if (version == 0) {
      auto [q, t, scale_inv] = quantize(ctx, s.weight, s.weight_dtype, w, true, ctx.training());
      return {q, t, scale_inv, false};
    }
    WeightCopy& copy = weight_copy(site, s.weight_dtype, w);
    if (copy.version != version) {
      const int64_t k = w.shape[w.ndim - 1], m = numel(w) / k;
      TensorView rows_view = reshape(w, {m, k});
      throw_if_error(recipe_->quantize(s.weight, &rows_view, &copy.q, &copy.t, &copy.scale_inv,
                                       kFp8QuantizeDefault, nullptr),
                     "linear: FP8 quantisation of a kept weight");
      copy.version = version;
    }
    return {copy.q, copy.t, copy.scale_inv, true};
  }
  // The copy of `site` when it holds the weight of ctx's param_version, else null.
  const WeightCopy* kept_weight(IForwardContext& ctx, LinearSite site) const {
    const uint64_t version = ctx.training() ? param_version_of(ctx) : 0;
    if (version == 0) return nullptr;
    auto it = weight_copies_.find({site.owner, site.slot});
    return it != weight_copies_.end() && it->second->version == version ? it->second.get()
                                                                        : nullptr;
  }
  // The copy of `site` for a weight `w` (out, in) in `dtype`, allocated on first use.
  WeightCopy& weight_copy(LinearSite site, DType dtype, const TensorView& w) const {
    const int64_t k = w.shape[w.ndim - 1], m = numel(w) / k;
    std::shared_ptr<WeightCopy>& copy = weight_copies_[{site.owner, site.slot}];
    if (copy != nullptr) {
      if (copy->q.shape[0] != m || copy->q.shape[1] != k)
        fail(Code::kInvalidArgument,
             "linear: an FP8 site's weight changed shape between passes; a site serves one "
             "weight");
      return *copy;
    }
    constexpr uint64_t kAlign = 256;  // each part at a GEMM operand's alignment and more
    const uint64_t codes = (static_cast<uint64_t>(m * k) + kAlign - 1) / kAlign * kAlign;
    auto fresh = std::make_shared<WeightCopy>();
    throw_if_error(host_->allocate(device_, kAlign + 2 * codes, kAlign, &fresh->block),
                   "linear: memory for an FP8 weight's kept copy (2 bytes a weight; "
                   "/precision/fp8_weight_cache false quantises in every micro-batch instead)");
    fresh->host = host_;
    fresh->device = device_;
    char* base = static_cast<char*>(fresh->block);
    fresh->scale_inv = make_view(base, DType::kF32, {1}, device_);
    fresh->q = make_view(base + kAlign, dtype, {m, k}, device_);
    fresh->t = make_view(base + kAlign + codes, dtype, {k, m}, device_);
    copy = std::move(fresh);
    return *copy;
  }
  /// Quantises `x` (M, K) with quantiser `id` of `dtype` into (M, K) (when `rowwise`) and
  /// its (K, M) transpose (when `columnwise`); returns {q, q^T, scale_inv}, empty views for
  /// what was not asked.
  std::array<TensorView, 3> quantize(IForwardContext& ctx, int32_t id, DType dtype,
                                     const TensorView& x, bool rowwise, bool columnwise) const {
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

  Device device_;
  Kernel gemm_, bias_add_, bias_grad_;
  Kernel epilogue_;  // gemm_epilogue, or unresolved: the unfused ops above
  IHost* host_;
  IFp8Recipe* recipe_ = nullptr;
  std::map<std::pair<const void*, int32_t>, Fp8Site> sites_;
  std::map<DType, Kernel> fp8_gemm_;
  mutable int producers_ = -1;  // recipe_gives_producers: -1 not asked yet, 0 no, 1 yes
  // The sites' kept FP8 weights (quantized_weight), by site.
  mutable std::map<std::pair<const void*, int32_t>, std::shared_ptr<WeightCopy>> weight_copies_;
};

}  // namespace loom::nn
