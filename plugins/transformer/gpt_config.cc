#include "plugins/transformer/gpt_config.h"

#include <algorithm>

#include "plugins/transformer/mla_attention.h"
#include "plugins/transformer/rotary.h"
#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {

std::string str(int64_t value) { return std::to_string(value); }

void check_probability(double p, const char* key) {
  if (!(p >= 0.0 && p < 1.0))
    invalid(std::string("/") + key + ": " + std::to_string(p) +
            " is not a probability in [0, 1): use 0 to turn dropout off");
}

// The hybrid_layer_pattern: one symbol per layer (c.layer_kinds) and the layers of each
// pipeline stage its | cut out (one entry without a cut).
std::vector<int64_t> read_hybrid_pattern(const nlohmann::json& o, GptConfig& c) {
  std::vector<int64_t> stages{0};
  auto it = o.find("hybrid_layer_pattern");
  if (it == o.end() || it->is_null()) {
    c.layer_kinds.assign(static_cast<size_t>(c.num_layers), 'T');
    stages[0] = c.num_layers;
    return stages;
  }
  c.hybrid_layer_pattern = it->get<std::string>();
  for (size_t i = 0; i < c.hybrid_layer_pattern.size(); ++i) {
    const char ch = c.hybrid_layer_pattern[i];
    if (ch == '|') {
      stages.push_back(0);
      continue;
    }
    if (ch != 'M' && ch != '*' && ch != '-' && ch != 'E')
      invalid("/hybrid_layer_pattern: '" + std::string(1, ch) + "' at position " +
              str(static_cast<int64_t>(i)) + " of \"" + c.hybrid_layer_pattern +
              "\" is not a layer symbol: use M (Mamba), * (attention), - (MLP), E (mixture of "
              "experts) or | (a pipeline stage boundary)");
    c.layer_kinds += ch;
    ++stages.back();
  }
  if (static_cast<int64_t>(c.layer_kinds.size()) != c.num_layers)
    invalid("/num_layers: " + str(c.num_layers) + ", but /hybrid_layer_pattern \"" +
            c.hybrid_layer_pattern + "\" has " + str(static_cast<int64_t>(c.layer_kinds.size())) +
            " layers; make them equal");
  return stages;
}

// The core's inherited "pipeline" {"rank", "size", "chunk", "chunks", and the run's uneven
// split}: which virtual stage this model is, and so which layers it owns
// (loom/cpp/nn/pipeline_stage.h). `pattern_stages`: the layers per stage that a hybrid
// pattern's | give (one entry: no cut).
void read_pipeline_stage(const nlohmann::json& o, GptConfig& c,
                         const std::vector<int64_t>& pattern_stages) {
  c.layer_end = c.num_layers;
  auto it = o.find("pipeline");
  if (it == o.end() || it->is_null()) return;
  const nlohmann::json& p = *it;
  auto field = [&](const char* key) {
    if (!p.is_object() || !p.contains(key) || !p[key].is_number_integer())
      invalid(std::string("/pipeline: expected {\"rank\", \"size\", \"chunk\", \"chunks\"} as "
                          "integers (the core hands it down), got ") +
              p.dump());
    return p[key].get<int32_t>();
  };
  c.pp_rank = field("rank");
  c.pp_size = field("size");
  c.chunk = field("chunk");
  c.chunks = field("chunks");
  if (c.pp_size < 1 || c.chunks < 1 || c.pp_rank < 0 || c.pp_rank >= c.pp_size || c.chunk < 0 ||
      c.chunk >= c.chunks)
    invalid("/pipeline: rank " + str(c.pp_rank) + " of " + str(c.pp_size) + ", chunk " +
            str(c.chunk) + " of " + str(c.chunks) + " is not a pipeline stage");
  // The layers of every virtual stage (an even split, or the run's uneven layout), and this
  // one's: virtual stage chunk * size + rank.
  std::vector<int64_t> counts;
  if (pattern_stages.size() > 1 && c.pp_size * c.chunks > 1) {
    for (const char* key : {"layout", "first_stage_layers", "last_stage_layers"})
      if (p.contains(key) && !p[key].is_null())
        invalid(
            "/hybrid_layer_pattern: its | cut the pipeline stages, and so does the run's "
            "parallel." +
            std::string(key == std::string("layout") ? "pipeline_layout" : key) +
            "; give the stages in one place");
    if (static_cast<int64_t>(pattern_stages.size()) != int64_t{c.pp_size} * c.chunks)
      invalid("/hybrid_layer_pattern: \"" + c.hybrid_layer_pattern + "\" cuts " +
              str(static_cast<int64_t>(pattern_stages.size())) +
              " pipeline stages with |, but "
              "the run has " +
              str(int64_t{c.pp_size} * c.chunks) + " (parallel.pp x vpp); cut as many");
    counts = pattern_stages;
  } else {
    counts = nn::pipeline_stage_layers(p, c.num_layers);
  }
  const size_t mine = static_cast<size_t>(c.chunk) * static_cast<size_t>(c.pp_size) +
                      static_cast<size_t>(c.pp_rank);
  c.layer_begin = 0;
  for (size_t s = 0; s < mine; ++s) c.layer_begin += counts[s];
  c.layer_end = c.layer_begin + counts[mine];
}

// Multi-token prediction (mtp.h; next-capabilities.md section 7): D depths and their loss
// weight, and what they do not support yet (checked after the pipeline stage and the
// hybrid pattern are read).
void read_multi_token_prediction(const nlohmann::json& o, GptConfig& c) {
  const nlohmann::json d = o.value("mtp_num_layers", nlohmann::json(0));
  if (!d.is_number_integer() || d.get<int64_t>() < 0)
    invalid("/mtp_num_layers: " + d.dump() +
            " is not an integer >= 0 (0 turns multi-token "
            "prediction off)");
  c.mtp_num_layers = d.get<int64_t>();
  c.mtp_loss_scaling_factor = o.value("mtp_loss_scaling_factor", 0.1);
  if (!(c.mtp_loss_scaling_factor >= 0.0))
    invalid("/mtp_loss_scaling_factor: must be >= 0, got " +
            std::to_string(c.mtp_loss_scaling_factor));
  if (c.mtp_num_layers == 0) return;
  if (c.pp_size > 1 || c.chunks > 1)
    invalid(
        "/mtp_num_layers: multi-token prediction with parallel.pp > 1 is not supported "
        "yet (nor virtual pipeline stages); run with parallel.pp 1 or set mtp_num_layers "
        "to 0");
  if (c.position_embedding == "learned")
    invalid(
        "/mtp_num_layers: multi-token prediction does not support learned absolute "
        "position embeddings (as in Megatron); set /position_embedding to rope or none, or "
        "mtp_num_layers to 0");
  if (!c.hybrid_layer_pattern.empty())
    invalid(
        "/mtp_num_layers: multi-token prediction with a hybrid_layer_pattern is not "
        "supported yet; drop the pattern or set mtp_num_layers to 0");
}

}  // namespace

GptConfig GptConfig::from_options(const nlohmann::json& o) {
  GptConfig c;
  c.num_layers = o.at("num_layers").get<int64_t>();
  c.hidden_size = o.at("hidden_size").get<int64_t>();
  c.num_attention_heads = o.at("num_attention_heads").get<int64_t>();
  c.vocab_size = o.at("vocab_size").get<int64_t>();
  c.make_vocab_size_divisible_by = o.value("make_vocab_size_divisible_by", int64_t{128});
  if (c.make_vocab_size_divisible_by < 1)
    invalid("/make_vocab_size_divisible_by: must be >= 1, got " +
            str(c.make_vocab_size_divisible_by));
  c.padded_vocab_size = c.vocab_size;
  c.position_embedding = o.at("position_embedding").get<std::string>();
  c.rotary = o.at("rotary");
  c.add_bias_linear = o.at("add_bias_linear").get<bool>();
  c.add_qkv_bias = inherited_or<bool>(o, "add_qkv_bias", c.add_bias_linear);
  c.tie_embeddings = o.at("tie_embeddings").get<bool>();
  c.qk_layernorm = inherited_or<bool>(o, "qk_layernorm", false);
  c.multi_latent_attention = o.value("multi_latent_attention", nlohmann::json());
  if (c.multi_latent_attention.is_object()) {
    const MlaDims mla = MlaDims::from_json(c.multi_latent_attention);  // validates
    if (o.at("position_embedding").get<std::string>() != "rope")
      invalid(
          "/multi_latent_attention: needs position_embedding rope (its decoupled rotary "
          "query and key parts); set /position_embedding to rope");
    // The rotary settings apply to the qk_pos_emb_head_dim channels, YaRN's factor to all of
    // q and k (the head dim qk_head_dim + qk_pos_emb_head_dim).
    nlohmann::json rotary = o.at("rotary");
    rotary_inv_freq(rotary, static_cast<int32_t>(mla.rope_dim));
  }
  c.init_std = o.at("init_std").get<double>();
  c.hidden_dropout = o.at("hidden_dropout").get<double>();
  c.attention_dropout = o.at("attention_dropout").get<double>();
  c.layers_at_start_in_bf16 = inherited_or<int64_t>(o, "num_layers_at_start_in_bf16", 0);
  c.layers_at_end_in_bf16 = inherited_or<int64_t>(o, "num_layers_at_end_in_bf16", 0);
  c.seq_length = inherited_or<int64_t>(o, "seq_length", 0);
  c.micro_batch_size = inherited_or<int64_t>(o, "micro_batch_size", 1);
  c.return_logits = inherited_or<bool>(o, "return_logits", false);
  c.sequence_parallel = inherited_or<bool>(o, "sequence_parallel", false);
  c.cp_comm_type = inherited_or<std::string>(o, "cp_comm_type", "p2p");
  context_parallel_comm(c.cp_comm_type);  // refuses an unknown name with its spec key
  c.params_dtype = transformer::params_dtype(o);
  c.device = device_of(o);

  for (const char* key : {"num_layers", "hidden_size", "num_attention_heads", "vocab_size"})
    if (o.at(key).get<int64_t>() < 1)
      invalid(std::string("/") + key + ": must be >= 1, got " + o.at(key).dump());
  // The tokenizer the training data was written with (the core hands its size down).
  int64_t tokenizer_vocab = inherited_or<int64_t>(o, "tokenizer_vocab_size", 0);
  if (tokenizer_vocab > c.vocab_size)
    invalid("/vocab_size: " + str(c.vocab_size) + " is smaller than the tokenizer's " +
            str(tokenizer_vocab) + " ids (the data's tokenizer); raise it to at least " +
            str(tokenizer_vocab));
  int64_t heads = c.num_attention_heads;
  if (o.contains("kv_channels") && !o["kv_channels"].is_null()) {
    c.kv_channels = o["kv_channels"].get<int64_t>();
    if (c.kv_channels < 1) invalid("/kv_channels: must be >= 1, got " + str(c.kv_channels));
  } else {
    if (c.hidden_size % heads != 0)
      invalid("/num_attention_heads: " + str(heads) + " does not divide hidden_size " +
              str(c.hidden_size) +
              ": choose a head count that divides it, or set kv_channels (the head dimension)");
    c.kv_channels = c.hidden_size / heads;
  }
  c.num_query_groups = inherited_or<int64_t>(o, "num_query_groups", heads);
  if (c.num_query_groups < 1 || heads % c.num_query_groups != 0)
    invalid("/num_query_groups: " + str(c.num_query_groups) +
            " does not divide num_attention_heads " + str(heads) +
            ": use a divisor of it (1 for multi-query, " + str(heads) + " for multi-head)");
  c.ffn_hidden_size = inherited_or<int64_t>(o, "ffn_hidden_size", 4 * c.hidden_size);
  if (c.ffn_hidden_size < 1)
    invalid("/ffn_hidden_size: must be >= 1, got " + str(c.ffn_hidden_size));
  c.max_position_embeddings = inherited_or<int64_t>(o, "max_position_embeddings", c.seq_length);
  if (c.seq_length == 0 && c.max_position_embeddings == 0)
    invalid(
        "/seq_length: missing; the gpt model takes it from /train/seq_length (the core hands "
        "it down), or set /max_position_embeddings");
  if (c.seq_length == 0) c.seq_length = c.max_position_embeddings;  // generation, from a table
  if (c.max_position_embeddings < 1)
    invalid("/max_position_embeddings: must be >= 1, got " + str(c.max_position_embeddings));

  if (c.position_embedding == "learned") {
    if (c.seq_length > c.max_position_embeddings)
      invalid("#/train/seq_length: " + str(c.seq_length) +
              " exceeds the model's max_position_embeddings " + str(c.max_position_embeddings) +
              " (learned position embeddings have one row per position): lower seq_length or "
              "raise /model/max_position_embeddings");
  } else if (c.position_embedding == "rope") {
    const int32_t dim = rotary_dim(c.rotary, c.kv_channels);  // validates "/rotary/..."
    rotary_inv_freq(c.rotary, dim);
    rotary_attention_factor(c.rotary, dim, c.kv_channels);
  } else if (c.position_embedding != "none") {
    invalid("/position_embedding: '" + c.position_embedding +
            "' is not one of learned, rope, none");
  }
  if (!(c.init_std > 0.0)) invalid("/init_std: must be > 0, got " + std::to_string(c.init_std));
  check_probability(c.hidden_dropout, "hidden_dropout");
  for (auto [key, value] : {std::pair{"num_layers_at_start_in_bf16", c.layers_at_start_in_bf16},
                            {"num_layers_at_end_in_bf16", c.layers_at_end_in_bf16}})
    if (value < 0 || value > c.num_layers)
      invalid(std::string("/") + key + ": " + str(value) +
              " is outside [0, num_layers = " + str(c.num_layers) + "]");
  check_probability(c.attention_dropout, "attention_dropout");
  if (c.seq_length < 1) invalid("#/train/seq_length: must be >= 1, got " + str(c.seq_length));
  read_pipeline_stage(o, c, read_hybrid_pattern(o, c));
  const nlohmann::json freq = o.value("moe_layer_freq", nlohmann::json(1));
  c.moe_layers.assign(static_cast<size_t>(c.num_layers), true);
  if (freq.is_array()) {
    if (static_cast<int64_t>(freq.size()) != c.num_layers)
      invalid("/moe_layer_freq: a pattern of " + str(static_cast<int64_t>(freq.size())) +
              " entries for " + str(c.num_layers) + " layers; give one 0 or 1 per layer");
    for (size_t i = 0; i < freq.size(); ++i) {
      if (!freq[i].is_number_integer() || (freq[i] != 0 && freq[i] != 1))
        invalid("/moe_layer_freq/" + str(static_cast<int64_t>(i)) + ": " + freq[i].dump() +
                " is not 0 (dense_mlp) or 1 (mlp)");
      c.moe_layers[i] = freq[i] == 1;
    }
  } else {
    const int64_t n = freq.is_number_integer() ? freq.get<int64_t>() : 0;
    if (n < 1) invalid("/moe_layer_freq: " + freq.dump() + " must be an integer >= 1 or a list");
    for (int64_t i = 0; i < c.num_layers; ++i) c.moe_layers[i] = i % n == 0;
  }
  if (!c.hybrid_layer_pattern.empty())  // the pattern says which MLP layers are experts
    for (int64_t i = 0; i < c.num_layers; ++i) c.moe_layers[i] = c.layer_kinds[i] == 'E';
  read_multi_token_prediction(o, c);
  return c;
}

nlohmann::json GptConfig::layer_options(int64_t layer_number) const {
  // A multi-token prediction depth's layer (past num_layers) is built like the last one.
  const size_t i = static_cast<size_t>(std::min(layer_number, num_layers) - 1);
  const bool mtp = layer_number > num_layers;
  return {{"hidden_size", hidden_size},
          {"num_attention_heads", num_attention_heads},
          {"num_query_groups", num_query_groups},
          {"kv_channels", kv_channels},
          {"ffn_hidden_size", ffn_hidden_size},
          {"add_bias_linear", add_bias_linear},
          {"add_qkv_bias", add_qkv_bias},
          {"qk_layernorm", qk_layernorm},
          {"multi_latent_attention", multi_latent_attention},
          {"init_std", init_std},
          {"num_layers", num_layers},
          {"layer_number", layer_number},
          {"moe_layer", static_cast<bool>(moe_layers[i])},
          {"has_attention", mtp || layer_kinds[i] == 'T' || layer_kinds[i] == '*'},
          {"has_mlp", mtp || layer_kinds[i] != '*'},
          {"fp8", layer_number > layers_at_start_in_bf16 &&
                      layer_number <= num_layers - layers_at_end_in_bf16},
          {"hidden_dropout", hidden_dropout},
          {"attention_dropout", attention_dropout},
          {"position_embedding", position_embedding},
          {"rotary", rotary},
          {"sequence_parallel", sequence_parallel},
          {"cp_comm_type", cp_comm_type},
          {"params_dtype", dtype_name(params_dtype)},
          {"device", device_name(device)}};
}

}  // namespace loom::transformer
