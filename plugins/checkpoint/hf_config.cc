// The import direction and config.json: HfModel <-> transformers' config.json, and the
// loom spec node of an HfModel.
#include "plugins/checkpoint/hf_model.h"
#include "plugins/checkpoint/hf_moe.h"
#include "plugins/checkpoint/json_fields.h"

namespace loom::checkpoint {
namespace {

using json = nlohmann::json;

// What transformers fills in for the keys the rotary families share.
struct RopeDefaults {
  int64_t hidden, ffn, layers, heads, kv_heads /* 0: = heads */, positions, vocab;
  double eps, theta;
};
constexpr RopeDefaults kLlamaDefaults{4096, 11008, 32, 32, 0, 2048, 32000, 1e-6, 10000.0};
// Qwen2Config and Qwen3Config (Qwen3's head_dim defaults to 128: kQwen3HeadDim).
constexpr RopeDefaults kQwenDefaults{4096, 22016, 32, 32, 32, 32768, 151936, 1e-6, 10000.0};
constexpr int64_t kQwen3HeadDim = 128;
constexpr RopeDefaults kMixtralDefaults{4096, 14336, 32, 32, 8, 4096 * 32, 32000, 1e-5, 1e6};
constexpr RopeDefaults kQwen2MoeDefaults{2048, 5632, 24, 16, 16, 32768, 151936, 1e-6, 10000.0};
constexpr RopeDefaults kQwen3MoeDefaults{2048, 6144, 24, 32, 4, 32768, 151936, 1e-6, 10000.0};

json gpt2_config(const HfModel& m, const char* torch_dtype, const json& bos, const json& eos) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", m.vocab},
          {"n_positions", m.positions},
          {"n_embd", m.hidden},
          {"n_layer", m.layers},
          {"n_head", m.heads},
          {"n_inner", m.ffn},
          {"activation_function", m.activation == "gelu" ? "gelu" : "gelu_new"},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"layer_norm_epsilon", m.eps},
          {"initializer_range", m.init_std},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", m.tied},
          {"use_cache", true},
          {"bos_token_id", bos},
          {"eos_token_id", eos},
          {"torch_dtype", torch_dtype}};
}

// LLaMA's rope_scaling (the MoE families' 4.40 models have none; export refuses it there).
json rope_scaling_config(const HfModel& m) {
  std::string type = m.rope_scaling.value("type", "none");
  if (type == "linear")
    return {{"type", "linear"}, {"factor", m.rope_scaling.value("factor", 8.0)}};
  if (type == "llama3")  // transformers >= 4.43 reads this
    return {{"rope_type", "llama3"},
            {"factor", m.rope_scaling.value("factor", 8.0)},
            {"low_freq_factor", m.rope_scaling.value("low_freq_factor", 1.0)},
            {"high_freq_factor", m.rope_scaling.value("high_freq_factor", 4.0)},
            {"original_max_position_embeddings",
             m.rope_scaling.value("original_max_position_embeddings", int64_t{8192})}};
  return nullptr;
}

// The keys LLaMA, Mixtral and Qwen2-MoE share.
json rope_config(const HfModel& m, const char* torch_dtype, const json& bos, const json& eos) {
  return {{"architectures", {hf_architecture(m.family)}},
          {"vocab_size", m.vocab},
          {"hidden_size", m.hidden},
          {"intermediate_size", m.ffn},
          {"num_hidden_layers", m.layers},
          {"num_attention_heads", m.heads},
          {"num_key_value_heads", m.groups},
          {"hidden_act", "silu"},
          {"max_position_embeddings", m.positions},
          {"initializer_range", m.init_std},
          {"rms_norm_eps", m.eps},
          {"rope_theta", m.rope_base},
          {"attention_dropout", 0.0},
          {"tie_word_embeddings", m.tied},
          {"use_cache", true},
          {"bos_token_id", bos},
          {"eos_token_id", eos},
          {"torch_dtype", torch_dtype}};
}

// Reads the keys of rope_config into `h` with the family's defaults. `head_dim_key`: the
// family reads head_dim (Qwen3, Qwen3-MoE), which may differ from hidden_size / heads;
// `absent_head_dim`: its value when config.json has no head_dim key (0: hidden / heads).
void read_rope_config(const ConfigReader& c, const RopeDefaults& d, HfModel& h,
                      bool head_dim_key = false, int64_t absent_head_dim = 0) {
  const json& config = c.config;
  h.hidden = c.integer("hidden_size", d.hidden);
  h.ffn = c.integer("intermediate_size", d.ffn);
  h.layers = c.integer("num_hidden_layers", d.layers);
  // The layout is built layer by layer before any tensor is matched: bound the count by
  // far more layers than any model has, so a damaged config cannot loop for hours.
  constexpr int64_t kMaxLayers = 1 << 16;
  if (h.layers > kMaxLayers)
    fail(Code::kInvalidArgument, c.where + "num_hidden_layers = " + std::to_string(h.layers) +
                                     " is beyond any model (more than 65536 layers)");
  h.heads = c.integer("num_attention_heads", d.heads);
  // null (and, for LLaMA, absent) means as many as the query heads
  const bool kv_null =
      config.contains("num_key_value_heads") && config["num_key_value_heads"].is_null();
  h.groups = c.integer("num_key_value_heads", d.kv_heads > 0 && !kv_null ? d.kv_heads : h.heads);
  h.positions = c.integer("max_position_embeddings", d.positions);
  h.vocab = c.integer("vocab_size", d.vocab);
  h.eps = c.number("rms_norm_eps", d.eps);
  h.rope_base = c.number("rope_theta", d.theta);
  // Newer transformers write rope_parameters {"rope_type", "rope_theta"} instead.
  if (!config.contains("rope_theta") && config.contains("rope_parameters") &&
      config["rope_parameters"].is_object()) {
    ConfigReader r{config["rope_parameters"], c.where + "rope_parameters."};
    h.rope_base = r.number("rope_theta", d.theta);
    if (get_or<std::string>(r.config, "rope_type", "default", r.where) != "default")
      r.refuse("rope_type", "loom maps this family with plain rope (rope_type default)");
  }
  h.tied = get_or<bool>(config, "tie_word_embeddings", false, c.where);
  h.activation = "swiglu";
  const bool own_head_dim =
      head_dim_key && config.contains("head_dim") && !config["head_dim"].is_null();
  const bool default_head_dim = head_dim_key && absent_head_dim > 0 && !config.contains("head_dim");
  if ((!own_head_dim && !default_head_dim && h.hidden % h.heads != 0) || h.heads % h.groups != 0)
    fail(Code::kInvalidArgument, c.where +
                                     "num_attention_heads must divide hidden_size (or head_dim "
                                     "be given) and be a multiple of num_key_value_heads");
  h.head_dim = own_head_dim       ? c.integer("head_dim", 0)
               : default_head_dim ? absent_head_dim
                                  : h.hidden / h.heads;
  if (!head_dim_key && config.contains("head_dim") && !config["head_dim"].is_null() &&
      config["head_dim"] != json(h.head_dim))
    c.refuse("head_dim", "loom's import needs head_dim == hidden_size / num_attention_heads");
  if (get_or<std::string>(config, "hidden_act", "silu", c.where) != "silu")
    c.refuse("hidden_act", "loom's swiglu uses silu");
  if (config.contains("rope_scaling") && !config["rope_scaling"].is_null()) {
    const json& s = config["rope_scaling"];
    std::string kind = s.is_object() ? s.value("rope_type", s.value("type", "")) : "";
    ConfigReader r{s, c.where + "rope_scaling."};
    if (kind == "linear") {
      h.rope_scaling = {{"type", "linear"}, {"factor", r.number("factor", 1.0)}};
    } else if (kind == "llama3") {
      h.rope_scaling = {{"type", "llama3"},
                        {"factor", r.number("factor", 8.0)},
                        {"low_freq_factor", r.number("low_freq_factor", 1.0)},
                        {"high_freq_factor", r.number("high_freq_factor", 4.0)},
                        {"original_max_position_embeddings",
                         r.integer("original_max_position_embeddings", 8192)}};
    } else if (kind != "default") {
      c.refuse("rope_scaling", "loom has linear and llama3 rope scaling");
    }
  }
}

// Qwen2 (q/k/v biases, implied by the family) and Qwen3 (head_dim, q_norm / k_norm, no
// biases): the keys beyond rope_config, with plain rope and no sliding window.
void qwen_config(const HfModel& m, json& config) {
  const bool qwen3 = m.family == HfFamily::kQwen3;
  config["model_type"] = qwen3 ? "qwen3" : "qwen2";
  if (qwen3) {
    config["head_dim"] = m.head_dim;  // independent of hidden_size / heads
    config["attention_bias"] = false;
  }
  config["rope_scaling"] = nullptr;
  config["use_sliding_window"] = false;
  config["sliding_window"] = nullptr;  // loom's attention has none
  config["max_window_layers"] = m.layers;
}

// The import side of qwen_config (`h`: the keys of rope_config read).
void qwen_from_config(const ConfigReader& c, HfModel& h) {
  const json& config = c.config;
  const bool qwen3 = h.family == HfFamily::kQwen3;
  h.qkv_bias = !qwen3;  // Qwen2's q/k/v projections always have biases, o_proj none
  h.qk_norm = qwen3;    // q_norm / k_norm over head_dim in every layer
  if (qwen3 && get_or<bool>(config, "attention_bias", false, c.where))
    c.refuse("attention_bias",
             "it puts biases on q/k/v_proj and o_proj; loom's Qwen3 has none (loom has no "
             "o_proj bias without MLP biases)");
  if (!h.rope_scaling.empty())
    c.refuse("rope_scaling", std::string("loom maps ") + (qwen3 ? "Qwen3" : "Qwen2") +
                                 " with plain rope (rope_theta); set it to null");
  // Newer transformers keep sliding_window only with use_sliding_window, and for the layers
  // from max_window_layers on; a window of at least the positions is plain causal attention.
  const json w = config.value("sliding_window", json(nullptr));
  if (get_or<bool>(config, "use_sliding_window", false, c.where) && w.is_number() &&
      w.get<double>() < static_cast<double>(h.positions) &&
      c.integer("max_window_layers", 28, 0) < h.layers)
    c.refuse("use_sliding_window",
             "loom's attention has no sliding window; set it to false, or sliding_window to "
             "at least max_position_embeddings");
}

HfModel gpt2_from_config(const ConfigReader& c, HfModel h) {
  const json& config = c.config;
  h.family = HfFamily::kGpt2;
  h.hidden = c.integer("n_embd", 768);
  h.layers = c.integer("n_layer", 12);
  h.heads = c.integer("n_head", 12);
  h.positions = c.integer("n_positions", 1024);
  h.vocab = c.integer("vocab_size", 50257);
  h.ffn = c.integer("n_inner", 4 * h.hidden);
  h.eps = c.number("layer_norm_epsilon", 1e-5);
  h.tied = get_or<bool>(config, "tie_word_embeddings", true, c.where);
  h.qkv_bias = true;
  std::string act = get_or<std::string>(config, "activation_function", "gelu_new", c.where);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh")
    h.activation = "gelu_tanh";
  else if (act == "gelu")
    h.activation = "gelu";
  else
    c.refuse("activation_function", "loom has gelu_new (gelu_tanh) and gelu");
  if (!get_or<bool>(config, "scale_attn_weights", true, c.where))
    c.refuse("scale_attn_weights", "loom scales attention by 1 / sqrt(head dim)");
  if (get_or<bool>(config, "scale_attn_by_inverse_layer_idx", false, c.where))
    c.refuse("scale_attn_by_inverse_layer_idx", "loom has no per-layer attention scaling");
  if (get_or<bool>(config, "add_cross_attention", false, c.where))
    c.refuse("add_cross_attention", "loom models are decoder-only");
  if (h.hidden % h.heads != 0)
    fail(Code::kInvalidArgument, c.where + "n_head does not divide n_embd");
  h.groups = h.heads;
  h.head_dim = h.hidden / h.heads;
  return h;
}

}  // namespace

json hf_config(const HfModel& m, DType dtype) {
  const char* torch_dtype = dtype == DType::kBF16  ? "bfloat16"
                            : dtype == DType::kF16 ? "float16"
                                                   : "float32";
  json bos = m.bos ? json(*m.bos) : json(nullptr), eos = m.eos ? json(*m.eos) : json(nullptr);
  if (m.family == HfFamily::kGpt2) return gpt2_config(m, torch_dtype, bos, eos);
  json config = rope_config(m, torch_dtype, bos, eos);
  if (m.family == HfFamily::kLlama) {
    config["model_type"] = "llama";
    config["rope_scaling"] = rope_scaling_config(m);
    config["attention_bias"] = false;
    config["mlp_bias"] = false;
    config["pretraining_tp"] = 1;
  } else if (m.family == HfFamily::kQwen2 || m.family == HfFamily::kQwen3) {
    qwen_config(m, config);
  } else {
    moe_config(m, config);
  }
  return config;
}

HfModel hf_model_from_config(const json& config, const std::filesystem::path& file) {
  ConfigReader c{config, file.string() + ": "};
  if (!config.is_object()) fail(Code::kInvalidArgument, file.string() + " is not a JSON object");
  std::string type = get_or<std::string>(config, "model_type", "", c.where);
  HfModel h;
  auto token = [&](const char* key) -> std::optional<int64_t> {
    if (config.contains(key) && config[key].is_number_integer()) return config[key].get<int64_t>();
    return std::nullopt;
  };
  h.bos = token("bos_token_id");
  h.eos = token("eos_token_id");
  h.init_std = get_or<double>(config, "initializer_range", 0.02, c.where);
  if (type == "gpt2") return gpt2_from_config(c, h);
  const RopeDefaults* defaults = type == "llama"                      ? &kLlamaDefaults
                                 : type == "qwen2" || type == "qwen3" ? &kQwenDefaults
                                 : type == "mixtral"                  ? &kMixtralDefaults
                                 : type == "qwen2_moe"                ? &kQwen2MoeDefaults
                                 : type == "qwen3_moe"                ? &kQwen3MoeDefaults
                                                                      : nullptr;
  if (defaults == nullptr)
    fail(Code::kUnimplemented, c.where + "model_type '" + type +
                                   "': loom reads gpt2 (GPT2LMHeadModel), llama "
                                   "(LlamaForCausalLM), qwen2 (Qwen2ForCausalLM), qwen3 "
                                   "(Qwen3ForCausalLM), mixtral (MixtralForCausalLM), "
                                   "qwen2_moe (Qwen2MoeForCausalLM) and qwen3_moe "
                                   "(Qwen3MoeForCausalLM) models");
  read_rope_config(c, *defaults, h, type == "qwen3_moe" || type == "qwen3",
                   type == "qwen3" ? kQwen3HeadDim : 0);
  if (type == "qwen2" || type == "qwen3") {
    h.family = type == "qwen2" ? HfFamily::kQwen2 : HfFamily::kQwen3;
    qwen_from_config(c, h);
    return h;
  }
  if (type != "llama") {
    h.family = type == "mixtral"     ? HfFamily::kMixtral
               : type == "qwen2_moe" ? HfFamily::kQwen2Moe
                                     : HfFamily::kQwen3Moe;
    moe_from_config(c, h);
    return h;
  }
  h.family = HfFamily::kLlama;
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (get_or<bool>(config, key, false, c.where)) c.refuse(key, "loom's LLaMA has no biases");
  return h;
}

json loom_model_node(const HfModel& h) {
  bool gpt2 = h.family == HfFamily::kGpt2;
  json norm = {{"impl", gpt2 ? "layernorm" : "rmsnorm"}, {"eps", h.eps}};
  json node = {{"impl", "gpt"},
               {"num_layers", h.layers},
               {"hidden_size", h.hidden},
               {"num_attention_heads", h.heads},
               {"num_query_groups", h.groups},
               {"ffn_hidden_size", h.ffn},
               {"vocab_size", h.vocab},
               {"max_position_embeddings", h.positions},
               {"position_embedding", gpt2 ? "learned" : "rope"},
               {"tie_embeddings", h.tied},
               {"add_bias_linear", gpt2},
               {"init_std", h.init_std},
               {"layer",
                {{"impl", "transformer_layer"},
                 {"norm", norm},
                 {"attention", {{"impl", "fused"}}},
                 {"mlp", {{"impl", "mlp"}, {"activation", h.activation}}}}},
               {"final_norm", norm}};
  if (h.qkv_bias && !gpt2) node["add_qkv_bias"] = true;  // Qwen2 (and Qwen2-MoE)
  if (h.qk_norm) {                                       // Qwen3 (and Qwen3-MoE)
    node["qk_layernorm"] = true;
    node["kv_channels"] = h.head_dim;
  }
  if (!gpt2) {
    json scaling = h.rope_scaling.empty() ? json{{"type", "none"}} : h.rope_scaling;
    node["rotary"] = {{"base", h.rope_base}, {"percent", 1.0}, {"scaling", scaling}};
  }
  if (h.moe) moe_node(h, node);
  return node;
}

}  // namespace loom::checkpoint
