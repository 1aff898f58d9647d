#include "plugins/moe/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "plugins/moe/routing.h"

namespace loom::moe {
namespace {

enum Slot : int32_t { kKeptIds };

}  // namespace

MoeLayer::MoeLayer(const nlohmann::json& options, IBuildContext& ctx)
    : host_(*ctx.host()),
      hidden_(inherited<int64_t>(options, "hidden_size", "moe layer")),
      experts_(options.at("num_experts").get<int64_t>()),
      dtype_(params_dtype(options)),
      device_(device_of(options)) {
  if (experts_ < 1) invalid("/num_experts: must be >= 1, got " + std::to_string(experts_));
  if (inherited_or<bool>(options, "add_bias_linear", false))
    invalid("#/model/add_bias_linear: the experts have no biases (as Mixtral, Qwen-MoE and "
            "DeepSeek); set it false for a mixture-of-experts model");
  const int32_t tp = group(host_, ParallelRole::kTensor).size();
  const bool sp = inherited_or<bool>(options, "sequence_parallel", false);
  if (tp > 1 && !sp)
    invalid("#/parallel/sequence_parallel: a mixture-of-experts layer with tp > 1 needs sequence "
            "parallelism (each tensor-parallel rank routes its own tokens, as in Megatron-Core); "
            "set it true");
  ICommunicator& ep = group(host_, ParallelRole::kExpert);
  if (experts_ % ep.size() != 0)
    invalid(detail::concat("/num_experts: ", experts_, " is not divisible by the expert-parallel "
                           "size ", ep.size(), " (parallel.ep); choose an ep that divides it"));
  const nlohmann::json cf = options.value("expert_capacity_factor", nlohmann::json(nullptr));
  if (!cf.is_null()) {
    capacity_factor_ = cf.get<double>();
    if (!(capacity_factor_ > 0))
      invalid("/expert_capacity_factor: must be > 0 (or null for dropless routing), got " +
              cf.dump());
  }
  const std::string policy = options.value("token_drop_policy", "probs");
  if (policy != "probs" && policy != "position")
    invalid("/token_drop_policy: '" + policy + "' is not one of probs, position");
  drop_by_probs_ = policy == "probs";
  pad_ = options.value("pad_to_capacity", false);
  if (pad_ && capacity_factor_ <= 0)
    invalid("/pad_to_capacity: padding every expert to its capacity needs a capacity; set "
            "expert_capacity_factor (or pad_to_capacity false)");
  const int64_t layer = inherited_or<int64_t>(options, "layer_number", 0);
  layer_ = "layer_" + std::to_string(layer);

  const std::string activation = options.value("activation", "gelu");
  if (activation != "gelu" && activation != "gelu_tanh" && activation != "swiglu")
    invalid("/activation: '" + activation + "' is not one of gelu, gelu_tanh, swiglu");
  const nlohmann::json moe_ffn = options.value("moe_ffn_hidden_size", nlohmann::json(nullptr));
  const int64_t ffn =
      moe_ffn.is_null() ? inherited<int64_t>(options, "ffn_hidden_size", "moe layer")
                        : moe_ffn.get<int64_t>();
  if (ffn < 1) invalid("/moe_ffn_hidden_size: must be >= 1");
  nlohmann::json common = {{"params_dtype", dtype_name(dtype_)},
                           {"device", device_name(device_)},
                           {"hidden_size", hidden_},
                           {"num_experts", experts_},
                           {"init_std", inherited<float>(options, "init_std", "moe layer")},
                           {"num_layers", inherited<int64_t>(options, "num_layers", "moe layer")},
                           {"layer_number", layer},
                           {"sequence_parallel", sp && tp > 1},
                           {"activation", activation}};
  nlohmann::json expert_options = common;
  expert_options["ffn_hidden_size"] = ffn;
  expert_options["grouped"] = options.value("grouped_gemm", true);

  add_child("router", router_ = build_child<IRouter>(ctx, "router", common));
  dispatcher_ = build_child<IMoeDispatcher>(ctx, "dispatcher", common);
  add_ = Kernel(host_, ops::kAdd, device_, dtype_);
  add_child("experts", experts_module_ = new GroupedMlp(expert_options, host_));
  const nlohmann::json shared = options.value("shared_expert_intermediate_size",
                                              nlohmann::json(nullptr));
  if (!shared.is_null()) {
    nlohmann::json shared_options = common;
    shared_options["ffn_hidden_size"] = shared.get<int64_t>();
    shared_options["gate"] = options.value("shared_expert_gate", false);
    add_child("shared_experts", shared_ = new SharedExperts(shared_options, host_));
  } else if (options.value("shared_expert_gate", false)) {
    invalid("/shared_expert_gate: needs shared_expert_intermediate_size");
  }
}

MoeLayer::~MoeLayer() {
  if (dispatcher_ != nullptr) dispatcher_->destroy();
}

void MoeLayer::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                           TensorView* outputs, int32_t num_outputs) {
  expect_count("moe forward inputs", num_inputs, 1);
  expect_count("moe forward outputs", num_outputs, 1);
  const TensorView& x = inputs[0];
  expect(x, {-1, -1, hidden_}, dtype_, "moe input");
  const int64_t n = numel(x) / hidden_;
  TensorView shared_out =
      shared_ != nullptr ? call_forward(*shared_, ctx, {x}, 1, "shared_experts")[0] : empty_view();
  std::vector<TensorView> routed = call_forward(*router_, ctx, {x}, 3, "router");
  TensorView probs = routed[0], experts = routed[1];
  // K as the router chose it (any router: its output's shape), checked against N.
  if (probs.ndim != 2 || probs.shape[0] != n || experts.ndim != 2 || experts.shape[0] != n ||
      experts.shape[1] != probs.shape[1])
    fail(Code::kInvalidArgument,
         detail::concat("moe: the router returned probs ", shape_string(probs), " and experts ",
                        shape_string(experts), " for ", n, " tokens; expected (N, K) both"));
  const int64_t topk = probs.shape[1];
  std::vector<int32_t> ids;
  to_host(host_, experts, ids);
  if (capacity_factor_ > 0) {
    // Megatron-Core's capacity from this rank's tokens before dispatch.
    const int64_t capacity = static_cast<int64_t>(std::ceil(
        static_cast<double>(n * topk) / static_cast<double>(experts_) * capacity_factor_));
    std::vector<float> p;
    to_host(host_, probs, p);
    drop_over_capacity(ids, p, experts_, capacity, drop_by_probs_);
    if (pad_) {
      // Every (token, expert) a slot: the kept choices with their probs, fillers with 0.
      std::vector<int32_t> padded;
      std::vector<float> padded_probs;
      pad_to_capacity(ids, p, topk, experts_, capacity, padded, padded_probs);
      probs = upload(ctx, host_, DType::kF32, {n, experts_}, padded_probs, device_);
      experts = upload(ctx, host_, DType::kI32, {n, experts_}, padded, device_);
      // Backward maps the (N, E) probs' gradient back to the router's (N, K) choices.
      TensorView kept = allocate(ctx, DType::kI32, {n, topk}, kCpu);
      std::memcpy(kept.data, ids.data(), ids.size() * sizeof(int32_t));
      save(ctx, this, kKeptIds, kept);
    } else {
      probs = upload(ctx, host_, DType::kF32, {n, topk}, p, device_);
      experts = upload(ctx, host_, DType::kI32, {n, topk}, ids, device_);
    }
  }
  if (ctx.training()) {
    // Load imbalance of this rank's routing: max over mean tokens per expert.
    std::vector<double> per(static_cast<size_t>(experts_), 0.0);
    double routed_pairs = 0;
    for (int32_t e : ids)
      if (e >= 0) {
        per[e] += 1;
        routed_pairs += 1;
      }
    const double mean = routed_pairs / static_cast<double>(experts_);
    std::vector<float> v{mean > 0 ? static_cast<float>(*std::max_element(per.begin(), per.end()) /
                                                       mean)
                                  : 0.0f};
    TensorView m = upload(ctx, host_, DType::kF32, {}, v, device_);
    report_metric(ctx, ("moe/load_imbalance/" + layer_).c_str(), m, MetricReduce::kMax);
    release(ctx, m);
  }
  TensorView xr = rows(x, hidden_);
  TensorView dispatched{}, tokens_per_expert{};
  throw_if_error(dispatcher_->dispatch(&ctx, &xr, &experts, &dispatched, &tokens_per_expert),
                 "moe dispatch");
  TensorView expert_out =
      call_forward(*experts_module_, ctx, {dispatched, tokens_per_expert}, 1, "experts")[0];
  TensorView yr{};
  throw_if_error(dispatcher_->combine(&ctx, &expert_out, &probs, &yr), "moe combine");
  TensorView y = make_view(yr.data, yr.dtype, x.shape, x.ndim, x.device);
  if (shared_ != nullptr) add_({y, shared_out}, {y});
  std::vector<TensorView> done{dispatched, tokens_per_expert, expert_out, routed[0], routed[1],
                               routed[2], shared_out};
  if (capacity_factor_ > 0) {
    done.push_back(probs);
    done.push_back(experts);
  }
  for (const TensorView& t : done)
    if (present(t) && t.data != y.data) release(ctx, t);
  outputs[0] = y;
}

void MoeLayer::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                            int32_t num_grad_outputs, TensorView* grad_inputs,
                            int32_t num_grad_inputs) {
  expect_count("moe backward grad outputs", num_grad_outputs, 1);
  expect_count("moe backward grad inputs", num_grad_inputs, 1);
  const TensorView& dy = grad_outputs[0];
  expect(dy, {-1, -1, hidden_}, dtype_, "moe grad output");
  TensorView dyr = rows(dy, hidden_);
  TensorView dshared =
      shared_ != nullptr ? call_backward(*shared_, ctx, {dy}, 1, "shared_experts")[0]
                         : empty_view();
  TensorView dexpert_out{}, dprobs{};
  throw_if_error(dispatcher_->combine_backward(&ctx, &dyr, &dexpert_out, &dprobs),
                 "moe combine backward");
  if (pad_) {  // (N, E) -> the router's (N, K)
    TensorView kept = load(ctx, this, kKeptIds);
    const int32_t* k = static_cast<const int32_t*>(kept.data);
    std::vector<int32_t> ids(k, k + numel(kept));
    std::vector<float> padded_grad;
    to_host(host_, dprobs, padded_grad);
    release(ctx, dprobs);
    dprobs = upload(ctx, host_, DType::kF32, {kept.shape[0], kept.shape[1]},
                    unpad_probs_grad(ids, padded_grad, kept.shape[1], experts_), device_);
    drop_saved(ctx, this);
  }
  TensorView ddispatched = call_backward(*experts_module_, ctx, {dexpert_out}, 1, "experts")[0];
  TensorView dxr{};
  throw_if_error(dispatcher_->dispatch_backward(&ctx, &ddispatched, &dxr), "moe dispatch backward");
  TensorView dx_router = call_backward(*router_, ctx, {dprobs}, 1, "router")[0];
  TensorView dx = make_view(dxr.data, dxr.dtype, dy.shape, dy.ndim, dy.device);
  add_({dx, dx_router}, {dx});
  if (shared_ != nullptr) add_({dx, dshared}, {dx});
  for (const TensorView& t : {dexpert_out, dprobs, ddispatched, dx_router, dshared})
    if (present(t)) release(ctx, t);
  grad_inputs[0] = dx;
}

}  // namespace loom::moe
