#include "plugins/moe/topk_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace loom::moe {
namespace {

enum Slot : int32_t { kInput, kLogits, kExperts, kDlse, kAuxScores, kAuxOrder };

// A number or a list of numbers (one per load-balancing type), as a list.
std::vector<double> as_list(const nlohmann::json& v) {
  if (v.is_array()) return v.get<std::vector<double>>();
  return {v.is_null() ? 0.0 : v.get<double>()};
}

double sign(double v) { return v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0; }

// An f32 or f64 tensor (the router dtype's scores, lse) read into host doubles.
std::vector<double> to_host_doubles(IHost& host, const TensorView& v) {
  std::vector<double> out;
  if (v.dtype == DType::kF64) {
    to_host(host, v, out);
  } else {
    std::vector<float> f;
    to_host(host, v, f);
    out.assign(f.begin(), f.end());
  }
  return out;
}

// Host doubles written into an f32 or f64 tensor.
void from_host_doubles(IHost& host, const std::vector<double>& in, const TensorView& v) {
  if (v.dtype == DType::kF64)
    from_host(host, in, v);
  else
    from_host(host, std::vector<float>(in.begin(), in.end()), v);
}

}  // namespace

TopkRouter::TopkRouter(const nlohmann::json& options, IBuildContext& ctx)
    : host_(*ctx.host()),
      hidden_(inherited<int64_t>(options, "hidden_size", "router")),
      experts_(inherited<int64_t>(options, "num_experts", "router")),
      dtype_(params_dtype(options)),
      device_(device_of(options)) {
  attrs_.k = options.value("topk", 2);
  std::string score = options.value("score_function", "softmax");
  if (score != "softmax" && score != "sigmoid")
    invalid("/score_function: '" + score + "' is not one of softmax, sigmoid");
  attrs_.score = score == "sigmoid" ? 1 : 0;
  attrs_.pre_softmax = options.value("pre_softmax", false) ? 1 : 0;
  if (attrs_.k < 1 || attrs_.k > experts_)
    invalid("/topk: " + std::to_string(attrs_.k) +
            " must be in [1, num_experts = " + std::to_string(experts_) + "]");
  if (attrs_.score == 0 && attrs_.k == 1 && !attrs_.pre_softmax)
    invalid(
        "/topk: a softmax over one chosen logit is constant (zero gradient); with topk 1 set "
        "pre_softmax true, or use the sigmoid score");
  const nlohmann::json& scaling = options.contains("topk_scaling_factor")
                                      ? options["topk_scaling_factor"]
                                      : nlohmann::json(nullptr);
  attrs_.scaling_factor = scaling.is_null() ? 1.0f : scaling.get<float>();
  if (!(attrs_.scaling_factor > 0)) invalid("/topk_scaling_factor: must be > 0 (or null for none)");
  const nlohmann::json groups = options.value("num_groups", nlohmann::json(nullptr));
  const nlohmann::json group_topk = options.value("group_topk", nlohmann::json(nullptr));
  attrs_.num_groups = groups.is_null() ? 1 : groups.get<int32_t>();
  attrs_.group_topk = group_topk.is_null() ? attrs_.num_groups : group_topk.get<int32_t>();
  if (attrs_.num_groups > 1) {
    if (experts_ % attrs_.num_groups != 0)
      invalid("/num_groups: " + std::to_string(attrs_.num_groups) +
              " must divide num_experts = " + std::to_string(experts_));
    if (group_topk.is_null()) invalid("/group_topk: required with num_groups > 1");
    if (attrs_.group_topk < 1 || attrs_.group_topk > attrs_.num_groups)
      invalid("/group_topk: " + std::to_string(attrs_.group_topk) + " must be in [1, num_groups]");
    if (attrs_.k % attrs_.group_topk != 0)
      invalid("/group_topk: topk = " + std::to_string(attrs_.k) + " must be a multiple of it");
  }
  // Load balancing: a type or a list of types, with as many coefficients.
  nlohmann::json types = options.value("load_balancing_type", nlohmann::json("aux_loss"));
  if (!types.is_array()) types = nlohmann::json::array({types});
  std::vector<double> coeffs = as_list(options.value("aux_loss_coeff", nlohmann::json(0.0)));
  if (coeffs.size() != types.size())
    invalid("/aux_loss_coeff: " + std::to_string(coeffs.size()) + " coefficient(s) for " +
            std::to_string(types.size()) + " load_balancing_type(s); give one per type");
  for (size_t i = 0; i < types.size(); ++i) {
    std::string t = types[i].get<std::string>();
    if (t == "none") continue;
    if (t != "aux_loss" && t != "seq_aux_loss" && t != "global_aux_loss")
      invalid("/load_balancing_type: '" + t +
              "' is not one of aux_loss, seq_aux_loss, global_aux_loss, none");
    if (coeffs[i] < 0) invalid("/aux_loss_coeff: must be >= 0");
    const Balance type = t == "aux_loss"       ? Balance::kAux
                         : t == "seq_aux_loss" ? Balance::kSeqAux
                                               : Balance::kGlobalAux;
    for (const BalanceTerm& b : balance_)
      if (b.type == type)
        invalid("/load_balancing_type: '" + t + "' is listed twice; give each type once");
    if (coeffs[i] > 0) balance_.push_back({type, coeffs[i]});
  }
  const nlohmann::json z = options.value("z_loss_coeff", nlohmann::json(nullptr));
  z_coeff_ = z.is_null() ? 0.0 : z.get<double>();
  if (z_coeff_ < 0) invalid("/z_loss_coeff: must be >= 0 (or null)");
  expert_bias_ = options.value("enable_expert_bias", false);
  bias_rate_ = options.value("bias_update_rate", 1e-3);
  if (expert_bias_ && attrs_.score != 1)
    invalid("/enable_expert_bias: the aux-loss-free expert bias needs score_function sigmoid");
  std::string router_dtype = options.value("dtype", "fp32");
  if (router_dtype != "fp32" && router_dtype != "fp64")
    invalid("/dtype: '" + router_dtype + "' is not one of fp32, fp64");
  f64_ = router_dtype == "fp64";
  router_dtype_ = f64_ ? DType::kF64 : DType::kF32;
  layer_ = "layer_" + std::to_string(inherited_or<int64_t>(options, "layer_number", 0));

  // Replicated over tensor-parallel ranks; with sequence parallelism each holds other
  // tokens, so its gradient is summed over them (Megatron marks it sequence-parallel).
  const bool sp = inherited_or<bool>(options, "sequence_parallel", false) &&
                  group(host_, ParallelRole::kTensor).size() > 1;
  weight_ = add_param("weight", dtype_,
                      ParamSpec{{experts_, hidden_},
                                -1,
                                sp ? kParamSequenceParallel : kParamNone,
                                ParamInit::kNormal,
                                inherited<float>(options, "init_std", "router")});
  if (expert_bias_)
    bias_ = add_param("expert_bias", DType::kF32,
                      ParamSpec{{experts_}, -1, kParamFrozen, ParamInit::kZeros, 0.f});
  // fp32: the gating GEMM on the parameters' dtype writing f32 logits; fp64: x and W cast to
  // f64 and an f64 GEMM. The top-K ops, and the add of the load-balancing gradient, run in
  // the router dtype.
  gemm_ = Kernel(host_, ops::kGemm, device_, f64_ ? DType::kF64 : dtype_);
  topk_ = Kernel(host_, ops::kMoeTopk, device_, router_dtype_);
  topk_bwd_ = Kernel(host_, ops::kMoeTopkBwd, device_, router_dtype_);
  if (!balance_.empty()) add_ = Kernel(host_, ops::kAdd, device_, router_dtype_);
  if (f64_ || dtype_ != DType::kF32) cast_ = Kernel(host_, ops::kCast, device_, router_dtype_);
  ICommunicator* comm = nullptr;
  throw_if_error(host_.communicator(make_string_view("tp,cp"), &comm), "router: the tp x cp group");
  sequence_group_ = comm;
  throw_if_error(host_.communicator(make_string_view("tp,cp,ep,dp"), &comm),
                 "router: the tp x cp x ep x dp group");
  count_group_ = comm;
  step_counts_.assign(static_cast<size_t>(experts_), 0.0);
  global_sum_.assign(static_cast<size_t>(experts_), 0.0);
}

std::vector<double> TopkRouter::global_average(IForwardContext& ctx, std::vector<double> counts) {
  if (count_group_->size() > 1) {
    TensorView v = make_view(counts.data(), DType::kF64, {experts_});
    throw_if_error(count_group_->all_reduce(&v, ReduceOp::kSum, nullptr),
                   "router: global_aux_loss's counts over the tensor x context x expert x data "
                   "group");
  }
  // Under full recomputation a micro-batch's forward runs twice (the rerun in backward): the
  // rerun, same input and weights, finds the same counts recorded for its micro-batch and
  // reuses that running average (added once, as Megatron adds once: its first pass runs
  // without grad). A micro-batch index seen with other counts means a new step began without
  // step_end (a forward_backward outside a training step): the running state restarts. The
  // counts are the group's sums, the same on every rank, so every rank decides alike.
  const int32_t mb = ctx.micro_batch();
  auto seen = global_seen_.find(mb);
  if (seen != global_seen_.end() && seen->second.counts == counts) return seen->second.average;
  if (seen != global_seen_.end()) {
    std::fill(global_sum_.begin(), global_sum_.end(), 0.0);
    global_micro_batches_ = 0;
    global_seen_.clear();
  }
  ++global_micro_batches_;
  std::vector<double> average(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    global_sum_[i] += counts[i];
    average[i] = global_sum_[i] / static_cast<double>(global_micro_batches_);
  }
  global_seen_[mb] = {std::move(counts), average};
  return average;
}

double TopkRouter::balance_terms(IForwardContext& ctx, const std::vector<double>& scores,
                                 const std::vector<int32_t>& order, int64_t batch,
                                 std::vector<double>* dscores) {
  const int64_t e = experts_, k = attrs_.k;
  const int64_t n = static_cast<int64_t>(order.size()) / e;
  const double g = static_cast<double>(sequence_group_->size());
  const int64_t seq = n / batch;
  dscores->assign(static_cast<size_t>(n * e), 0.0);
  double value = 0;
  for (const BalanceTerm& term : balance_) {
    const bool per_seq = term.type == Balance::kSeqAux, global = term.type == Balance::kGlobalAux;
    const int64_t rows = per_seq ? batch : 1;  // counted separately
    std::vector<double> counts(static_cast<size_t>(rows * e), 0.0), sums(counts.size(), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = per_seq ? t / seq : 0;
      for (int64_t j = 0; j < e; ++j) {
        const int32_t ex = order[t * e + j];
        if (j < k) counts[r * e + ex] += 1;
        sums[r * e + ex] += scores[t * e + j];
      }
    }
    // The ranks whose tokens the counts cover, and T, those ranks' tokens: a sequence's
    // (seq_aux_loss), the micro-batch's (aux_loss) or the micro-batch's over every data rank
    // (global_aux_loss, whose counts are the running average over the step's micro-batches,
    // while T stays one micro-batch's: Megatron's _apply_global_aux_loss).
    double ranks = g;
    if (global) {
      ranks = static_cast<double>(count_group_->size());
      counts = global_average(ctx, std::move(counts));
    } else if (sequence_group_->size() > 1) {
      TensorView v = make_view(counts.data(), DType::kF64, {rows * e});
      throw_if_error(sequence_group_->all_reduce(&v, ReduceOp::kSum, nullptr),
                     "router: the load-balancing counts over the tensor x context group");
    }
    // Megatron's switch_load_balancing_loss_func per counted domain:
    //   coeff * E / (K T^2) * sum_e c_e * sum_{t on this rank} s_te
    // with c_e constants (no gradient flows through the counts); seq_aux_loss averages its B
    // sequences.
    const double tokens = static_cast<double>(per_seq ? seq : n) * ranks;
    const double per = term.coeff * static_cast<double>(e) /
                       (static_cast<double>(k) * tokens * tokens * static_cast<double>(rows));
    double term_value = 0;
    for (int64_t i = 0; i < rows * e; ++i) term_value += per * counts[i] * sums[i];
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = per_seq ? t / seq : 0;
      for (int64_t j = 0; j < e; ++j)
        (*dscores)[t * e + j] += per * counts[r * e + order[t * e + j]];
    }
    value += term_value;
    // Logged as Megatron does: divided by the coefficient, summed over the counted ranks
    // (the metric's mean over ranks of ranks x this share).
    std::vector<float> shown{static_cast<float>(term_value * ranks / term.coeff)};
    TensorView m = upload(ctx, host_, DType::kF32, {}, shown, device_);
    const char* name = per_seq  ? "moe/seq_aux_loss/"
                       : global ? "moe/global_aux_loss/"
                                : "moe/aux_loss/";
    report_metric(ctx, (name + layer_).c_str(), m);
    release(ctx, m);
  }
  return value;
}

void TopkRouter::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                             TensorView* outputs, int32_t num_outputs) {
  expect_count("router forward inputs", num_inputs, 1);
  expect_count("router forward outputs", num_outputs, 2);
  const TensorView& x = inputs[0];
  if (x.ndim < 2 || x.shape[x.ndim - 1] != hidden_ || x.dtype != dtype_ || !is_contiguous(x))
    fail(Code::kInvalidArgument,
         detail::concat("router input: expected contiguous ", dtype_name(dtype_), " (B, T, ",
                        hidden_, ") or (N, ", hidden_, "), got ", dtype_name(x.dtype),
                        shape_string(x)));
  const int64_t n = numel(x) / hidden_, k = attrs_.k, e = experts_, c = hidden_;
  const int64_t batch = x.ndim >= 3 ? x.shape[0] : 1;
  const bool training = ctx.training();
  const DType rt = router_dtype_;
  TensorView logits = allocate(ctx, rt, {n, e}, device_);  // (N, E)
  if (f64_) {
    // Megatron's router_gating_linear at fp64: x and W cast to f64, logits = x W^T in f64.
    TensorView x64 = allocate(ctx, DType::kF64, {n, c}, device_);
    TensorView w64 = allocate(ctx, DType::kF64, {e, c}, device_);
    cast_({rows(x, hidden_)}, {x64});
    cast_({value(weight_)}, {w64});
    gemm_({x64, w64}, {logits}, ops::GemmAttrs{0, 1, 1.0f, 0.0f});
    release_all(ctx, {x64, w64});
  } else {
    gemm_({rows(x, hidden_), value(weight_)}, {logits}, ops::GemmAttrs{0, 1, 1.0f, 0.0f});
  }
  TensorView probs = allocate(ctx, rt, {n, k}, device_);  // (N, K) in the router dtype
  TensorView experts = allocate(ctx, DType::kI32, {n, k}, device_);
  TensorView lse = training && z_coeff_ > 0 ? allocate(ctx, rt, {n}, device_) : empty_view();
  topk_({logits, expert_bias_ ? value(bias_) : empty_view()}, {probs, experts, lse}, attrs_);
  if (f64_) {
    // The MoE layer takes f32 probs (Megatron casts the f64 probs where they meet the
    // experts' activations).
    TensorView p32 = allocate(ctx, DType::kF32, {n, k}, device_);
    cast_({probs}, {p32});
    release(ctx, probs);
    probs = p32;
  }
  double aux = 0;
  if (training) {
    const double w = aux_loss_weight_of(ctx, "router");
    const double g = static_cast<double>(sequence_group_->size());
    if (!balance_.empty()) {
      // Scores over all E, sorted, and the order: the first K of each row are the plain top-K.
      ops::MoeTopkAttrs all{static_cast<int32_t>(e), attrs_.score, 1, 1, 1, 1.0f};
      std::vector<int32_t> order;
      TensorView sv = allocate(ctx, rt, {n, e}, device_);
      TensorView ids = allocate(ctx, DType::kI32, {n, e}, device_);
      topk_({logits, empty_view()}, {sv, ids, empty_view()}, all);
      std::vector<double> scores = to_host_doubles(host_, sv);
      to_host(host_, ids, order);
      release_all(ctx, {sv, ids});
      std::vector<double> dscores;
      aux += balance_terms(ctx, scores, order, batch, &dscores);
      for (double& v : dscores) v *= w;
      TensorView ds = allocate(ctx, rt, {n, e}, device_);  // d(aux) / d(scores), router dtype
      from_host_doubles(host_, dscores, ds);
      save(ctx, this, kAuxScores, ds);
      save(ctx, this, kAuxOrder, upload(ctx, host_, DType::kI32, {n, e}, order, device_));
    }
    if (z_coeff_ > 0) {
      // z = coeff / |tp x cp| * mean over this rank's tokens of lse^2 (Megatron's share).
      std::vector<double> l = to_host_doubles(host_, lse);
      double z = 0;
      const double scale = z_coeff_ / (g * static_cast<double>(n));
      for (double v : l) z += scale * v * v;
      for (double& v : l) v = 2.0 * scale * v * w;  // now d lse
      from_host_doubles(host_, l, lse);
      save(ctx, this, kDlse, lse);
      aux += z;
      std::vector<float> shown{static_cast<float>(z * g / z_coeff_)};
      TensorView m = upload(ctx, host_, DType::kF32, {}, shown, device_);
      report_metric(ctx, ("moe/z_loss/" + layer_).c_str(), m);
      release(ctx, m);
    }
    save(ctx, this, kInput, x);
    save(ctx, this, kLogits, logits);
    save(ctx, this, kExperts, experts);
  }
  if (!training || z_coeff_ == 0) release(ctx, lse);
  release(ctx, logits);
  outputs[0] = probs;
  outputs[1] = experts;
  if (num_outputs > 2) {
    std::vector<float> a{static_cast<float>(aux)};
    outputs[2] = upload(ctx, host_, DType::kF32, {}, a, device_);
  }
}

TensorView TopkRouter::backward_gemms_f64(IForwardContext& ctx, const TensorView& x,
                                          const TensorView& dlogits) {
  const int64_t n = dlogits.shape[0], e = experts_, c = hidden_;
  // x and W cast to f64 again (cheaper to keep than the f64 copies), then in f64:
  // dW += dl^T x (the gradient cast to f64 and back: one rounding of the sum) and dx = dl W.
  TensorView x64 = allocate(ctx, DType::kF64, {n, c}, device_);
  TensorView w64 = allocate(ctx, DType::kF64, {e, c}, device_);
  TensorView dw64 = allocate(ctx, DType::kF64, {e, c}, device_);
  cast_({rows(x, hidden_)}, {x64});
  cast_({value(weight_)}, {w64});
  cast_({grad(weight_)}, {dw64});
  gemm_({dlogits, x64}, {dw64}, ops::GemmAttrs{1, 0, 1.0f, 1.0f});
  cast_({dw64}, {grad(weight_)});
  release(ctx, dw64);
  TensorView dx64 = allocate(ctx, DType::kF64, {n, c}, device_);
  gemm_({dlogits, w64}, {dx64}, ops::GemmAttrs{0, 0, 1.0f, 0.0f});
  TensorView dx = allocate_like(ctx, x);
  cast_({dx64}, {rows(dx, hidden_)});
  release_all(ctx, {x64, w64, dx64});
  return dx;
}

void TopkRouter::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                              int32_t num_grad_outputs, TensorView* grad_inputs,
                              int32_t num_grad_inputs) {
  expect_count("router backward grad outputs", num_grad_outputs, 1);
  expect_count("router backward grad inputs", num_grad_inputs, 1);
  TensorView experts = load(ctx, this, kExperts);
  const int64_t n = experts.shape[0];
  expect(grad_outputs[0], {n, attrs_.k}, DType::kF32, "router grad probs");
  if (expert_bias_) {
    // The step's token counts for the expert bias, taken here because backward runs once per
    // micro-batch (forward may run twice under full recomputation).
    std::vector<int32_t> chosen;
    to_host(host_, experts, chosen);
    for (int32_t ex : chosen) step_counts_[static_cast<size_t>(ex)] += 1;
  }
  const DType rt = router_dtype_;
  TensorView x = load(ctx, this, kInput), logits = load(ctx, this, kLogits);
  TensorView dlse = z_coeff_ > 0 ? load(ctx, this, kDlse) : empty_view();
  TensorView dprobs = grad_outputs[0];
  if (f64_) {  // the probs were cast from f64 to f32: their gradient comes back to f64
    dprobs = allocate(ctx, DType::kF64, {n, attrs_.k}, device_);
    cast_({grad_outputs[0]}, {dprobs});
  }
  TensorView dlogits = allocate(ctx, rt, {n, experts_}, device_);  // (N, E)
  topk_bwd_({dprobs, logits, experts, dlse}, {dlogits}, attrs_);
  if (f64_) release(ctx, dprobs);
  if (!balance_.empty()) {
    // The load-balancing terms' gradient through the scores over all E.
    ops::MoeTopkAttrs all{static_cast<int32_t>(experts_), attrs_.score, 1, 1, 1, 1.0f};
    TensorView daux = allocate(ctx, rt, {n, experts_}, device_);
    topk_bwd_({load(ctx, this, kAuxScores), logits, load(ctx, this, kAuxOrder), empty_view()},
              {daux}, all);
    add_({dlogits, daux}, {dlogits});
    release(ctx, daux);
  }
  if (f64_) {
    grad_inputs[0] = backward_gemms_f64(ctx, x, dlogits);
    release(ctx, dlogits);
    return;
  }
  TensorView dl = dlogits;  // the GEMMs take operands of one dtype
  if (dtype_ != DType::kF32) {
    dl = allocate(ctx, dtype_, {n, experts_}, device_);
    cast_({dlogits}, {dl});
  }
  TensorView xr = rows(x, hidden_);
  gemm_({dl, xr}, {grad(weight_)}, ops::GemmAttrs{1, 0, 1.0f, 1.0f});  // dW += dl^T x
  TensorView dx = allocate_like(ctx, x);
  gemm_({dl, value(weight_)}, {rows(dx, hidden_)}, ops::GemmAttrs{0, 0, 1.0f, 0.0f});
  release_all(ctx, {dlogits, dl});
  grad_inputs[0] = dx;
}

void TopkRouter::on_step_end(const StepEvent&) {
  // global_aux_loss's running counts start again with the next step (Megatron resets them
  // in finalize_model_grads, once per optimizer step).
  std::fill(global_sum_.begin(), global_sum_.end(), 0.0);
  global_micro_batches_ = 0;
  global_seen_.clear();
  if (!expert_bias_) return;
  // Aux-loss-free balancing: b += rate * sign(mean(c) - c) from the step's counts over the
  // tensor x context x data ranks (Megatron-Core's _update_router_expert_bias).
  if (count_group_->size() > 1) {
    TensorView v = make_view(step_counts_.data(), DType::kF64, {experts_});
    throw_if_error(count_group_->all_reduce(&v, ReduceOp::kSum, nullptr),
                   "router: the expert bias's token counts");
  }
  double mean = 0;
  for (double c : step_counts_) mean += c / static_cast<double>(experts_);
  std::vector<float> b;
  to_host(host_, value(bias_), b);
  for (int64_t i = 0; i < experts_; ++i)
    b[i] = static_cast<float>(b[i] + bias_rate_ * sign(mean - step_counts_[i]));
  from_host(host_, b, value(bias_));
  std::fill(step_counts_.begin(), step_counts_.end(), 0.0);
}

}  // namespace loom::moe
