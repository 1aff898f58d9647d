// The export direction: the model node of a loom checkpoint's spec as an HfModel.
#include "plugins/checkpoint/hf_model.h"

#include <algorithm>
#include <set>

#include "plugins/checkpoint/hf_moe.h"
#include "plugins/checkpoint/json_fields.h"

namespace loom::checkpoint {

using json = nlohmann::json;

void refuse_spec(const std::string& pointer, const json& value, const std::string& why) {
  fail(Code::kUnimplemented,
       "spec /model" + pointer + " = " + value.dump() + ": " + why +
           "; the safetensors export writes GPT2LMHeadModel (layernorm, learned positions, "
           "gelu_tanh, biases), LlamaForCausalLM (rmsnorm, rope, swiglu, no biases), "
           "Qwen2ForCausalLM (LLaMA with q/k/v biases), Qwen3ForCausalLM (LLaMA with "
           "qk_layernorm and kv_channels), MixtralForCausalLM, Qwen2MoeForCausalLM or "
           "Qwen3MoeForCausalLM (LLaMA with a "
           "mixture of swiglu experts under a softmax top-k router; Qwen3-MoE with "
           "qk_layernorm): save this model with the sharded format "
           "instead");
}

void known_spec_keys(const json& node, const std::string& pointer, std::set<std::string> known) {
  for (auto& [key, value] : node.items())
    if (!known.count(key) && !value.is_null())
      refuse_spec(pointer + "/" + key, value, "this setting has no Hugging Face counterpart here");
}

namespace {

std::optional<int64_t> eod_id(const json& metadata) {
  const json& data = child(child(metadata, "spec"), "data");
  const json& trainer = child(metadata, "trainer");
  for (const json* j : {&data, &child(trainer, "tokenizer"), &trainer})
    for (const char* key : {"eod_id", "eod"})
      if (j->contains(key) && (*j)[key].is_number_integer()) return (*j)[key].get<int64_t>();
  return std::nullopt;
}

}  // namespace

const char* hf_architecture(HfFamily family) {
  switch (family) {
    case HfFamily::kGpt2:
      return "GPT2LMHeadModel";
    case HfFamily::kLlama:
      return "LlamaForCausalLM";
    case HfFamily::kQwen2:
      return "Qwen2ForCausalLM";
    case HfFamily::kQwen3:
      return "Qwen3ForCausalLM";
    case HfFamily::kMixtral:
      return "MixtralForCausalLM";
    case HfFamily::kQwen2Moe:
      return "Qwen2MoeForCausalLM";
    case HfFamily::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
  }
  return "?";
}

HfModel hf_model_from_metadata(const json& metadata) {
  const json& spec = child(metadata, "spec");
  const json& m = child(spec, "model");
  if (m.empty())
    fail(Code::kInvalidArgument,
         "safetensors export: the checkpoint metadata has no spec.model node (the core passes "
         "the resolved spec)");
  const std::string at = "spec /model/";
  if (get_or<std::string>(m, "impl", "", at) != "gpt")
    refuse_spec("/impl", m.value("impl", json()), "only the 'gpt' model maps to Hugging Face");
  known_spec_keys(m, "",
                  {"impl", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                   "kv_channels", "ffn_hidden_size", "vocab_size", "max_position_embeddings",
                   "position_embedding", "rotary", "add_bias_linear", "add_qkv_bias",
                   "qk_layernorm", "tie_embeddings", "init_std", "hidden_dropout",
                   "attention_dropout", "layer", "final_norm", "moe_layer_freq",
                   // Which layers train in FP8: no effect on the weights.
                   "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
                   // Multi-token prediction: its weighting is harmless while it is off.
                   "mtp_num_layers", "mtp_loss_scaling_factor",
                   // The tables' padding: checkpoints hold the vocabulary's rows only.
                   "make_vocab_size_divisible_by"});
  if (get_or<int64_t>(m, "mtp_num_layers", 0, at) != 0)
    refuse_spec("/mtp_num_layers", m["mtp_num_layers"],
                "multi-token prediction's modules have no counterpart in these Hugging Face "
                "families");
  const json& layer = child(m, "layer");
  const json& norm = child(layer, "norm");
  const json& attention = child(layer, "attention");
  const json& mlp = child(layer, "mlp");
  const json& final_norm = child(m, "final_norm");
  if (get_or<std::string>(layer, "impl", "", at) != "transformer_layer")
    refuse_spec("/layer/impl", layer.value("impl", json()), "only transformer_layer maps");
  const std::string mlp_impl = get_or<std::string>(mlp, "impl", "mlp", at);
  const bool moe = mlp_impl == "moe";  // the rest of the moe node: moe_from_spec
  if (!moe && mlp_impl != "mlp")
    refuse_spec("/layer/mlp/impl", mlp_impl, "the dense mlp and the moe layer map");
  known_spec_keys(layer, "/layer", {"impl", "norm", "attention", "mlp", "dense_mlp"});
  known_spec_keys(attention, "/layer/attention", {"impl", "causal", "softmax_scale"});
  if (!moe) known_spec_keys(mlp, "/layer/mlp", {"impl", "activation"});
  known_spec_keys(norm, "/layer/norm", {"impl", "eps", "zero_centered_gamma"});
  known_spec_keys(final_norm, "/final_norm", {"impl", "eps", "zero_centered_gamma"});

  HfModel h;
  h.layers = get_or<int64_t>(m, "num_layers", 0, at);
  h.hidden = get_or<int64_t>(m, "hidden_size", 0, at);
  h.heads = get_or<int64_t>(m, "num_attention_heads", 0, at);
  h.vocab = get_or<int64_t>(m, "vocab_size", 0, at);
  h.qk_norm = get_or<bool>(m, "qk_layernorm", false, at);
  const bool own_head_dim = m.contains("kv_channels") && !m["kv_channels"].is_null();
  if (h.layers < 1 || h.hidden < 1 || h.heads < 1 || h.vocab < 1 ||
      (!own_head_dim && h.hidden % h.heads != 0))
    fail(Code::kInvalidArgument,
         "spec /model: num_layers, hidden_size, num_attention_heads and "
         "vocab_size must be set, with heads dividing hidden_size (or kv_channels set)");
  h.groups = get_or<int64_t>(m, "num_query_groups", h.heads, at);
  h.head_dim = get_or<int64_t>(m, "kv_channels", h.hidden / h.heads, at);
  if (h.head_dim < 1) fail(Code::kInvalidArgument, "spec /model/kv_channels: must be >= 1");
  // Qwen3 and Qwen3-MoE (qk_layernorm) write head_dim; the 4.40 families do not read it.
  if (h.head_dim * h.heads != h.hidden && !h.qk_norm)
    refuse_spec(
        "/kv_channels", m["kv_channels"],
        "a head dimension other than hidden_size / num_attention_heads needs head_dim, which "
        "transformers 4.40's GPT-2, LLaMA, Qwen2, Mixtral and Qwen2-MoE do not read (Qwen3 "
        "and Qwen3-MoE, the families of qk_layernorm, do)");
  h.ffn = get_or<int64_t>(m, "ffn_hidden_size", 4 * h.hidden, at);
  int64_t seq = get_or<int64_t>(child(spec, "train"), "seq_length", 0, "spec /train/");
  h.positions = get_or<int64_t>(m, "max_position_embeddings", seq, at);
  if (h.positions < 1)
    fail(Code::kInvalidArgument,
         "spec /model/max_position_embeddings is null and the spec has "
         "no train.seq_length to default it to");
  h.tied = get_or<bool>(m, "tie_embeddings", true, at);
  h.init_std = get_or<double>(m, "init_std", 0.02, at);
  h.eps = get_or<double>(norm, "eps", 1e-5, at + "layer/norm/");
  h.activation = get_or<std::string>(mlp, "activation", "gelu", at + "layer/mlp/");
  h.bos = h.eos = eod_id(metadata);
  bool bias = get_or<bool>(m, "add_bias_linear", true, at);
  bool qkv_bias = get_or<bool>(m, "add_qkv_bias", bias, at);
  std::string norm_impl = get_or<std::string>(norm, "impl", "layernorm", at + "layer/norm/");

  if (!get_or<bool>(attention, "causal", true, at))
    refuse_spec("/layer/attention/causal", attention["causal"], "Hugging Face decoders are causal");
  if (attention.contains("softmax_scale") && !attention["softmax_scale"].is_null())
    refuse_spec("/layer/attention/softmax_scale", attention["softmax_scale"],
                "the Hugging Face decoders scale by 1 / sqrt(head dim)");
  if (get_or<bool>(norm, "zero_centered_gamma", false, at))
    refuse_spec("/layer/norm/zero_centered_gamma", true, "norm weights are stored as gamma");
  if (get_or<std::string>(final_norm, "impl", norm_impl, at) != norm_impl)
    refuse_spec("/final_norm/impl", final_norm["impl"], "the final norm must be a " + norm_impl);
  if (get_or<double>(final_norm, "eps", 1e-5, at) != h.eps)
    refuse_spec("/final_norm/eps", final_norm.value("eps", json(1e-5)),
                "config.json has one epsilon for every norm; make it equal /layer/norm/eps");
  if (get_or<bool>(final_norm, "zero_centered_gamma", false, at))
    refuse_spec("/final_norm/zero_centered_gamma", true, "norm weights are stored as gamma");

  std::string position = get_or<std::string>(m, "position_embedding", "learned", at);
  h.qkv_bias = qkv_bias;
  // The layers moe_layer_freq gives the dense_mlp (in a dense model: equal to mlp).
  std::vector<bool> sparse = moe_layer_pattern(m, h.layers);
  if (!moe && std::find(sparse.begin(), sparse.end(), false) != sparse.end()) {
    const json& dense = child(layer, "dense_mlp");
    known_spec_keys(dense, "/layer/dense_mlp", {"impl", "activation"});
    if (get_or<std::string>(dense, "impl", "mlp", at) != "mlp" ||
        get_or<std::string>(dense, "activation", "gelu", at) != h.activation)
      refuse_spec("/layer/dense_mlp", dense,
                  "the layers moe_layer_freq marks 0 would differ from the others");
  }
  if (position == "learned") {  // GPT-2
    h.family = HfFamily::kGpt2;
    if (moe) refuse_spec("/layer/mlp/impl", mlp_impl, "GPT-2 has no mixture of experts");
    if (norm_impl != "layernorm")
      refuse_spec("/layer/norm/impl", norm_impl, "GPT-2 uses layernorm");
    if (h.activation != "gelu_tanh" && h.activation != "gelu")
      refuse_spec("/layer/mlp/activation", h.activation, "GPT-2 uses gelu_tanh (gelu_new) or gelu");
    if (!bias) refuse_spec("/add_bias_linear", false, "GPT-2 has biases on every linear");
    if (!qkv_bias) refuse_spec("/add_qkv_bias", false, "GPT-2 has a bias on the QKV projection");
    if (h.groups != h.heads)
      refuse_spec("/num_query_groups", h.groups, "GPT-2 has multi-head attention only");
    if (h.qk_norm) refuse_spec("/qk_layernorm", true, "GPT-2 does not normalise q and k");
  } else if (position == "rope") {
    // Dense: Qwen3 (qk_layernorm), else Qwen2 (q/k/v biases), else LLaMA; a mixture of
    // experts: Mixtral, Qwen2-MoE or Qwen3-MoE (moe_from_spec decides).
    h.family = moe         ? HfFamily::kLlama
               : h.qk_norm ? HfFamily::kQwen3
               : qkv_bias  ? HfFamily::kQwen2
                           : HfFamily::kLlama;
    const std::string family = moe                            ? "Mixtral and Qwen-MoE"
                               : h.family == HfFamily::kLlama ? "LLaMA"
                               : h.family == HfFamily::kQwen2 ? "Qwen2"
                                                              : "Qwen3";
    if (norm_impl != "rmsnorm") refuse_spec("/layer/norm/impl", norm_impl, family + " use rmsnorm");
    if (h.activation != "swiglu")
      refuse_spec("/layer/mlp/activation", h.activation, family + " use swiglu");
    if (bias)
      refuse_spec("/add_bias_linear", true,
                  family +
                      " have no biases on the output projection and the MLP (Qwen2 has "
                      "q/k/v biases only: add_qkv_bias)");
    if (h.family == HfFamily::kQwen3 && qkv_bias)
      refuse_spec("/add_qkv_bias", true,
                  "Qwen3 (the dense family of qk_layernorm) has no q/k/v biases (its "
                  "attention_bias would put one on o_proj too, which loom has not)");
    if (h.groups < 1 || h.heads % h.groups != 0)
      refuse_spec("/num_query_groups", h.groups, "must divide num_attention_heads");
    const json& rotary = child(m, "rotary");
    known_spec_keys(rotary, "/rotary", {"base", "percent", "scaling"});
    h.rope_base = get_or<double>(rotary, "base", 10000.0, at + "rotary/");
    if (get_or<double>(rotary, "percent", 1.0, at + "rotary/") != 1.0)
      refuse_spec("/rotary/percent", rotary["percent"], "LLaMA rotates the whole head");
    const json& scaling = child(rotary, "scaling");
    std::string type = get_or<std::string>(scaling, "type", "none", at + "rotary/scaling/");
    if (type != "none" && type != "linear" && type != "llama3")
      refuse_spec("/rotary/scaling/type", type, "only linear and llama3 scaling map");
    h.rope_scaling = scaling;
    if (type != "none" && (h.family == HfFamily::kQwen2 || h.family == HfFamily::kQwen3))
      refuse_spec("/rotary/scaling/type", type,
                  "loom maps " + family + " with plain rope (rope_theta, no rope_scaling)");
    if (moe) moe_from_spec(m, sparse, h);
  } else {
    refuse_spec("/position_embedding", position, "GPT-2 needs learned, LLaMA rope positions");
  }
  return h;
}

}  // namespace loom::checkpoint
