// Mixtral, Qwen2-MoE and Qwen3-MoE <-> loom's moe layer (plugins/moe): which settings
// correspond (Qwen3-MoE: as Qwen2-MoE where the column has nothing else).
//
//   loom (layer.mlp: impl moe)       Mixtral               Qwen2-MoE          Qwen3-MoE
//   num_experts                      num_local_experts     num_experts
//   router.topk                      num_experts_per_tok   num_experts_per_tok
//   moe_ffn_hidden_size              intermediate_size     moe_intermediate_size
//   router.pre_softmax false / true  renormalised / -      norm_topk_prob true / false
//   shared_expert_intermediate_size  -                     shared_expert_intermediate_size  -
//     with shared_expert_gate true                         (0: none), shared_expert_gate
//   model moe_layer_freq             every layer MoE       decoder_sparse_step,
//     (0: layer.dense_mlp)                                 mlp_only_layers
//   model ffn_hidden_size            = intermediate_size   intermediate_size (dense layers)
//   model add_qkv_bias               false                 true (always, in 4.40)  false
//   model qk_layernorm               false                 false              true (q/k_norm)
//   model kv_channels                hidden / heads        hidden / heads     head_dim
//   router.aux_loss_coeff            router_aux_loss_coef  router_aux_loss_coef
//
// Both score experts by a softmax over all E and keep the top K: Mixtral renormalises the K
// probabilities, which equals loom's softmax over the K chosen logits (pre_softmax false);
// Qwen2-MoE renormalises with norm_topk_prob only, else keeps them as loom's pre_softmax
// true does.
//
// The load-balancing coefficient is carried over as is, and the losses are not claimed to
// be equal: transformers' load_balancing_loss_func pools the router outputs of every layer
// into one term and sums its token fractions over the K choices, which makes it about K
// times Megatron's aux loss (loom's, one term per layer, averaged over the K choices).
#include "plugins/checkpoint/hf_moe.h"

#include <algorithm>
#include <cmath>

namespace loom::checkpoint {

using json = nlohmann::json;

namespace {

bool all_sparse(const std::vector<bool>& sparse) {
  return std::all_of(sparse.begin(), sparse.end(), [](bool s) { return s; });
}

// The load-balancing coefficient of the router node: the aux_loss entry of its
// load_balancing_type (one type with a number, or lists), 0 when it has none.
double aux_loss_coeff(const json& router) {
  const json types = router.value("load_balancing_type", json("aux_loss"));
  const json coeffs = router.value("aux_loss_coeff", json(0.0));
  if (types.is_string())
    return types == "aux_loss" && coeffs.is_number() ? coeffs.get<double>() : 0.0;
  if (types.is_array() && coeffs.is_array())
    for (size_t i = 0; i < types.size() && i < coeffs.size(); ++i)
      if (types[i] == "aux_loss" && coeffs[i].is_number()) return coeffs[i].get<double>();
  return 0.0;
}

// A sliding window shorter than the positions: loom's attention has none.
bool windowed(const json& config, int64_t positions) {
  const json w = config.value("sliding_window", json(nullptr));
  return w.is_number() && w.get<double>() < static_cast<double>(positions);
}

}  // namespace

std::vector<bool> moe_layer_pattern(const json& m, int64_t layers) {
  const json freq = m.value("moe_layer_freq", json(1));
  std::vector<bool> sparse(static_cast<size_t>(layers), true);
  if (freq.is_null()) return sparse;
  if (freq.is_number_integer() && freq.get<int64_t>() >= 1) {
    for (int64_t i = 0; i < layers; ++i) sparse[i] = i % freq.get<int64_t>() == 0;
    return sparse;
  }
  if (freq.is_array() && static_cast<int64_t>(freq.size()) == layers) {
    for (int64_t i = 0; i < layers; ++i) {
      if (freq[i] != json(0) && freq[i] != json(1))
        fail(Code::kInvalidArgument, "spec /model/moe_layer_freq/" + std::to_string(i) + ": " +
                                         freq[i].dump() + " is not 0 (dense_mlp) or 1 (mlp)");
      sparse[i] = freq[i] == json(1);
    }
    return sparse;
  }
  fail(Code::kInvalidArgument, "spec /model/moe_layer_freq: " + freq.dump() +
                                   " must be an integer >= 1 or a list of num_layers (" +
                                   std::to_string(layers) + ") 0/1 entries");
}

void moe_from_spec(const json& m, const std::vector<bool>& sparse, HfModel& h) {
  const json& layer = child(m, "layer");
  const json& mlp = child(layer, "mlp");
  const json& router = child(mlp, "router");
  const std::string at = "spec /model/layer/mlp/";
  // dispatcher, grouped_gemm and token_drop_policy (without a capacity) change how the
  // experts run, not what they compute.
  known_spec_keys(mlp, "/layer/mlp",
                  {"impl", "num_experts", "moe_ffn_hidden_size", "activation", "router",
                   "dispatcher", "expert_capacity_factor", "token_drop_policy", "pad_to_capacity",
                   "shared_expert_intermediate_size", "shared_expert_gate", "grouped_gemm"});
  // load_balancing_type, z_loss_coeff and bias_update_rate shape training, not the model.
  known_spec_keys(router, "/layer/mlp/router",
                  {"impl", "topk", "score_function", "pre_softmax", "topk_scaling_factor",
                   "num_groups", "group_topk", "load_balancing_type", "aux_loss_coeff",
                   "z_loss_coeff", "enable_expert_bias", "bias_update_rate", "dtype"});
  HfMoe e;
  e.experts = get_or<int64_t>(mlp, "num_experts", 0, at);
  e.ffn = get_or<int64_t>(mlp, "moe_ffn_hidden_size", h.ffn, at);
  e.topk = get_or<int64_t>(router, "topk", 2, at + "router/");
  if (e.experts < 1 || e.ffn < 1 || e.topk < 1 || e.topk > e.experts)
    fail(Code::kInvalidArgument,
         "spec /model/layer/mlp: num_experts and moe_ffn_hidden_size must be >= 1 and "
         "router.topk in [1, num_experts]");
  if (mlp.contains("expert_capacity_factor") && !mlp["expert_capacity_factor"].is_null())
    refuse_spec("/layer/mlp/expert_capacity_factor", mlp["expert_capacity_factor"],
                "Mixtral and Qwen2-MoE drop no tokens (every token reaches its K experts)");
  if (get_or<bool>(mlp, "pad_to_capacity", false, at))
    refuse_spec("/layer/mlp/pad_to_capacity", true, "Mixtral and Qwen2-MoE have no capacity");
  e.shared_ffn = get_or<int64_t>(mlp, "shared_expert_intermediate_size", 0, at);
  if (e.shared_ffn > 0 && !get_or<bool>(mlp, "shared_expert_gate", false, at))
    refuse_spec("/layer/mlp/shared_expert_gate", false,
                "Qwen2-MoE multiplies its shared expert by sigmoid(x . shared_expert_gate); an "
                "ungated shared expert has no counterpart");

  if (get_or<std::string>(router, "impl", "topk", at) != "topk")
    refuse_spec("/layer/mlp/router/impl", router["impl"], "only the topk router maps");
  const std::string score = get_or<std::string>(router, "score_function", "softmax", at);
  if (score != "softmax")
    refuse_spec("/layer/mlp/router/score_function", score,
                "Mixtral and Qwen2-MoE score the experts by a softmax");
  if (router.contains("topk_scaling_factor") && !router["topk_scaling_factor"].is_null() &&
      router["topk_scaling_factor"] != json(1.0))
    refuse_spec("/layer/mlp/router/topk_scaling_factor", router["topk_scaling_factor"],
                "Mixtral and Qwen2-MoE do not scale the routing probabilities");
  for (const char* key : {"num_groups", "group_topk"})
    if (router.contains(key) && !router[key].is_null())
      refuse_spec(std::string("/layer/mlp/router/") + key, router[key],
                  "Mixtral and Qwen2-MoE have no group-limited routing");
  if (get_or<bool>(router, "enable_expert_bias", false, at))
    refuse_spec("/layer/mlp/router/enable_expert_bias", true,
                "Mixtral and Qwen2-MoE have no expert bias (aux-loss-free balancing)");
  e.renormalise = !get_or<bool>(router, "pre_softmax", false, at);
  e.aux_loss_coef = aux_loss_coeff(router);
  e.sparse = sparse;

  // Qwen3-MoE with qk_layernorm; else Mixtral when it says it all, else Qwen2-MoE (the rule
  // of hf_model.h).
  const bool dense_layers = !all_sparse(sparse);
  if (h.qk_norm) {
    h.family = HfFamily::kQwen3Moe;
    if (e.shared_ffn > 0)
      refuse_spec("/layer/mlp/shared_expert_intermediate_size", e.shared_ffn,
                  "Qwen3-MoE (the family of qk_layernorm) has no shared expert");
    if (h.qkv_bias)
      refuse_spec("/add_qkv_bias", true,
                  "Qwen3-MoE (the family of qk_layernorm) has no q/k/v biases");
  } else {
    h.family = e.shared_ffn == 0 && e.renormalise && !h.qkv_bias && !dense_layers
                   ? HfFamily::kMixtral
                   : HfFamily::kQwen2Moe;
  }
  if (dense_layers) {
    const json& dense = child(layer, "dense_mlp");
    known_spec_keys(dense, "/layer/dense_mlp", {"impl", "activation"});
    if (get_or<std::string>(dense, "impl", "mlp", at) != "mlp")
      refuse_spec("/layer/dense_mlp/impl", dense["impl"], "Qwen-MoE's dense layers are an mlp");
    std::string act = get_or<std::string>(dense, "activation", "gelu", at);
    if (act != "swiglu")
      refuse_spec("/layer/dense_mlp/activation", act, "Qwen-MoE's dense layers use swiglu");
  }
  std::string scaling = h.rope_scaling.value("type", "none");
  if (scaling != "none")
    refuse_spec("/rotary/scaling/type", scaling,
                "loom maps Mixtral, Qwen2-MoE and Qwen3-MoE without rope scaling");
  h.moe = e;
}

void moe_config(const HfModel& h, json& config) {
  const HfMoe& e = *h.moe;
  config["num_experts_per_tok"] = e.topk;
  config["router_aux_loss_coef"] = e.aux_loss_coef;
  config["output_router_logits"] = false;
  config["sliding_window"] = nullptr;  // loom's attention has none
  if (h.family == HfFamily::kMixtral) {
    config["model_type"] = "mixtral";
    config["intermediate_size"] = e.ffn;
    config["num_local_experts"] = e.experts;
    config["router_jitter_noise"] = 0.0;
    return;
  }
  config["num_experts"] = e.experts;
  config["moe_intermediate_size"] = e.ffn;
  config["norm_topk_prob"] = e.renormalise;
  if (h.family == HfFamily::kQwen3Moe) {
    config["model_type"] = "qwen3_moe";
    config["head_dim"] = h.head_dim;  // independent of hidden_size / heads
    config["attention_bias"] = false;
    config["rope_scaling"] = nullptr;
  } else {
    config["model_type"] = "qwen2_moe";
    config["shared_expert_intermediate_size"] = e.shared_ffn;  // 0: none (zero-width tensors)
  }
  config["use_sliding_window"] = false;
  config["max_window_layers"] = h.layers;
  // Layer i is sparse iff (i + 1) % decoder_sparse_step == 0 and i is not in
  // mlp_only_layers. A pattern no step makes goes into mlp_only_layers, which transformers
  // reads from 4.41 on (4.40's Qwen2-MoE ignores it and would build those layers sparse;
  // Qwen3-MoE always reads it).
  const int64_t layers = h.layers;
  for (int64_t step = 1; step <= layers + 1; ++step) {
    bool fits = true;
    for (int64_t i = 0; i < layers; ++i) fits = fits && e.sparse[i] == ((i + 1) % step == 0);
    if (fits) {
      config["decoder_sparse_step"] = step;
      config["mlp_only_layers"] = json::array();
      return;
    }
  }
  json dense = json::array();
  for (int64_t i = 0; i < layers; ++i)
    if (!e.sparse[i]) dense.push_back(i);
  config["decoder_sparse_step"] = 1;
  config["mlp_only_layers"] = dense;
}

void moe_from_config(const ConfigReader& c, HfModel& h) {
  const json& config = c.config;
  HfMoe e;
  e.aux_loss_coef = get_or<double>(config, "router_aux_loss_coef", 0.001, c.where);
  if (!std::isfinite(e.aux_loss_coef) || e.aux_loss_coef < 0)
    fail(Code::kInvalidArgument, c.where + "router_aux_loss_coef must be a number >= 0");
  const char* topk_key = "num_experts_per_tok";
  if (h.family == HfFamily::kMixtral) {
    e.experts = c.integer("num_local_experts", 8);
    e.topk = c.integer(topk_key, 2);
    e.ffn = h.ffn;
    e.sparse.assign(static_cast<size_t>(h.layers), true);
    h.qkv_bias = false;
    if (get_or<double>(config, "router_jitter_noise", 0.0, c.where) != 0.0)
      c.refuse("router_jitter_noise",
               "loom's router has no jitter noise on its input; set it to 0 (transformers "
               "applies it in training only)");
    if (windowed(config, h.positions))
      c.refuse("sliding_window",
               "loom's attention has no sliding window; null, or a window of at least "
               "max_position_embeddings, is plain causal attention");
  } else {
    const bool qwen3 = h.family == HfFamily::kQwen3Moe;
    const char* experts_key =  // newer transformers name Qwen3-MoE's count num_local_experts
        qwen3 && !config.contains("num_experts") && config.contains("num_local_experts")
            ? "num_local_experts"
            : "num_experts";
    e.experts = c.integer(experts_key, qwen3 ? 128 : 60, 0);
    if (e.experts == 0)
      c.refuse(experts_key, std::string("a Qwen-MoE without experts is a dense model; loom "
                                        "reads ") +
                                (qwen3 ? "Qwen3-MoE" : "Qwen2-MoE") + " with experts");
    e.topk = c.integer(topk_key, qwen3 ? 8 : 4);
    e.ffn = c.integer("moe_intermediate_size", qwen3 ? 768 : 1408);
    e.shared_ffn = qwen3 ? 0 : c.integer("shared_expert_intermediate_size", 5632, 0);
    e.renormalise = get_or<bool>(config, "norm_topk_prob", false, c.where);
    const int64_t step = c.integer("decoder_sparse_step", 1);
    const auto dense = get_or<std::vector<int64_t>>(config, "mlp_only_layers", {}, c.where);
    for (int64_t i : dense)
      if (i < 0 || i >= h.layers)
        fail(Code::kInvalidArgument, c.where + "mlp_only_layers: layer " + std::to_string(i) +
                                         " is not in [0, num_hidden_layers)");
    for (int64_t i = 0; i < h.layers; ++i)
      e.sparse.push_back((i + 1) % step == 0 &&
                         std::find(dense.begin(), dense.end(), i) == dense.end());
    h.qkv_bias = !qwen3;  // Qwen2-MoE's q/k/v projections always have biases
    if (qwen3) {
      h.qk_norm = true;  // q_norm / k_norm over head_dim in every layer
      if (get_or<bool>(config, "attention_bias", false, c.where))
        c.refuse("attention_bias",
                 "loom's Qwen3-MoE has no biases on q/k/v_proj and o_proj; set it to false");
    }
    if (get_or<bool>(config, "use_sliding_window", false, c.where) && windowed(config, h.positions))
      c.refuse("use_sliding_window",
               "loom's attention has no sliding window; set it to false, or sliding_window to "
               "at least max_position_embeddings");
  }
  if (e.topk > e.experts)
    fail(Code::kInvalidArgument,
         c.where + "num_experts_per_tok must be at most the number of experts");
  if (e.topk == 1 && e.renormalise)
    c.refuse(h.family == HfFamily::kMixtral ? topk_key : "norm_topk_prob",
             "one expert per token with renormalised probabilities weighs it 1, which loom's "
             "router does not express (its top-1 keeps the softmax probability, pre_softmax)");
  h.moe = e;
}

void moe_node(const HfModel& h, json& node) {
  const HfMoe& e = *h.moe;
  node["add_qkv_bias"] = h.qkv_bias;
  if (h.qk_norm) {  // Qwen3-MoE
    node["qk_layernorm"] = true;
    node["kv_channels"] = h.head_dim;
  }
  json router = {{"impl", "topk"},
                 {"topk", e.topk},
                 {"score_function", "softmax"},
                 {"pre_softmax", !e.renormalise},
                 {"load_balancing_type", "aux_loss"},
                 {"aux_loss_coeff", e.aux_loss_coef}};
  node["layer"]["mlp"] = {
      {"impl", "moe"},
      {"num_experts", e.experts},
      {"moe_ffn_hidden_size", e.ffn},
      {"activation", "swiglu"},
      {"router", router},
      {"dispatcher", {{"impl", "alltoall"}}},
      {"shared_expert_intermediate_size", e.shared_ffn > 0 ? json(e.shared_ffn) : json(nullptr)},
      {"shared_expert_gate", e.shared_ffn > 0}};
  if (all_sparse(e.sparse)) {
    node["moe_layer_freq"] = 1;
    return;
  }
  node["layer"]["dense_mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  json freq = json::array();
  for (bool s : e.sparse) freq.push_back(s ? 1 : 0);
  node["moe_layer_freq"] = freq;
}

}  // namespace loom::checkpoint
