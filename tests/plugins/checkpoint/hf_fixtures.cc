#include "tests/plugins/checkpoint/hf_fixtures.h"

#include <cstring>
#include <fstream>
#include <stdexcept>

#include "plugins/checkpoint/safetensors_file.h"

namespace loom::testing {

nlohmann::json tiny_spec(const Tiny& m) {
  std::string norm = m.llama ? "rmsnorm" : "layernorm";
  nlohmann::json model = {
      {"impl", "gpt"},
      {"num_layers", m.l},
      {"hidden_size", m.c},
      {"num_attention_heads", m.h},
      {"num_query_groups", m.g},
      {"kv_channels", nullptr},
      {"ffn_hidden_size", m.f},
      {"vocab_size", m.v},
      {"max_position_embeddings", m.p},
      {"position_embedding", m.llama ? "rope" : "learned"},
      {"rotary", {{"base", 10000}, {"percent", 1.0}, {"scaling", {{"type", "none"}}}}},
      {"add_bias_linear", !m.llama},
      {"add_qkv_bias", nullptr},
      {"tie_embeddings", m.tied},
      {"init_std", 0.02},
      {"hidden_dropout", 0.0},
      {"attention_dropout", 0.0},
      {"layer",
       {{"impl", "transformer_layer"},
        {"norm", {{"impl", norm}, {"eps", 1e-5}, {"zero_centered_gamma", false}}},
        {"attention", {{"impl", "dot_product"}, {"causal", true}, {"softmax_scale", nullptr}}},
        {"mlp", {{"impl", "mlp"}, {"activation", m.llama ? "swiglu" : "gelu_tanh"}}}}},
      {"final_norm", {{"impl", norm}, {"eps", 1e-5}, {"zero_centered_gamma", false}}}};
  if (m.experts > 0) {
    model["add_qkv_bias"] = m.qkv_bias;
    nlohmann::json router = {{"impl", "topk"},
                             {"topk", m.k},
                             {"score_function", "softmax"},
                             {"pre_softmax", m.pre_softmax},
                             {"topk_scaling_factor", nullptr},
                             {"num_groups", nullptr},
                             {"group_topk", nullptr},
                             {"load_balancing_type", "aux_loss"},
                             {"aux_loss_coeff", 0.02},
                             {"z_loss_coeff", nullptr},
                             {"enable_expert_bias", false},
                             {"bias_update_rate", 0.001},
                             {"dtype", "fp32"}};
    model["layer"]["mlp"] = {
        {"impl", "moe"},
        {"num_experts", m.experts},
        {"moe_ffn_hidden_size", m.moe_f},
        {"activation", "swiglu"},
        {"router", router},
        {"dispatcher", {{"impl", "alltoall"}}},
        {"expert_capacity_factor", nullptr},
        {"token_drop_policy", "probs"},
        {"pad_to_capacity", false},
        {"shared_expert_intermediate_size",
         m.shared_f > 0 ? nlohmann::json(m.shared_f) : nlohmann::json(nullptr)},
        {"shared_expert_gate", m.shared_f > 0},
        {"grouped_gemm", true}};
    model["layer"]["dense_mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
    model["moe_layer_freq"] = m.freq.empty() ? nlohmann::json(1) : nlohmann::json(m.freq);
  }
  return {{"model", model}, {"train", {{"seq_length", m.p}}}, {"optimizer", {{"impl", "adamw"}}}};
}

std::vector<OwnedTensor> tiny_weights(const Tiny& m, DType dtype, std::mt19937& rng) {
  std::vector<OwnedTensor> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    out.push_back(random_tensor("model." + name, dtype, std::move(shape), rng));
  };
  const int64_t c = m.c, d = m.d();
  add("embedding.word_embeddings.weight", {m.v, c});
  if (!m.llama) add("embedding.position_embeddings.weight", {m.p, c});
  for (int64_t i = 0; i < m.l; ++i) {
    std::string p = "decoder.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {c});
    add(p + "self_attention.linear_qkv.weight", {m.g * (m.h / m.g + 2) * d, c});
    add(p + "self_attention.linear_proj.weight", {c, m.h * d});
    add(p + "pre_mlp_layernorm.weight", {c});
    if (m.qkv_bias) add(p + "self_attention.linear_qkv.bias", {m.g * (m.h / m.g + 2) * d});
    if (m.sparse(i)) {
      add(p + "mlp.router.weight", {m.experts, c});
      for (int64_t e = 0; e < m.experts; ++e) {
        add(p + "mlp.experts.linear_fc1.weight" + std::to_string(e), {2, m.moe_f, c});
        add(p + "mlp.experts.linear_fc2.weight" + std::to_string(e), {c, m.moe_f});
      }
      if (m.shared_f > 0) {
        add(p + "mlp.shared_experts.linear_fc1.weight", {2, m.shared_f, c});
        add(p + "mlp.shared_experts.linear_fc2.weight", {c, m.shared_f});
        add(p + "mlp.shared_experts.gate_weight", {1, c});
      }
      continue;
    }
    if (m.llama)
      add(p + "mlp.linear_fc1.weight", {2, m.f, c});  // swiglu: [gate; up]
    else
      add(p + "mlp.linear_fc1.weight", {m.f, c});
    add(p + "mlp.linear_fc2.weight", {c, m.f});
    if (m.llama) continue;
    add(p + "input_layernorm.bias", {c});
    add(p + "self_attention.linear_qkv.bias", {3 * c});
    add(p + "self_attention.linear_proj.bias", {c});
    add(p + "pre_mlp_layernorm.bias", {c});
    add(p + "mlp.linear_fc1.bias", {m.f});
    add(p + "mlp.linear_fc2.bias", {c});
  }
  add("decoder.final_layernorm.weight", {c});
  if (!m.llama) add("decoder.final_layernorm.bias", {c});
  if (!m.tied) add("output_layer.weight", {m.v, c});
  return out;
}

const OwnedTensor& by_name(const std::vector<OwnedTensor>& tensors, const std::string& name) {
  for (const OwnedTensor& t : tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

float at(const OwnedTensor& t, int64_t i, int64_t j, int64_t cols) {
  return t.floats()[static_cast<size_t>(i * cols + j)];
}

void write_hf_weights(const std::filesystem::path& file, const std::vector<OwnedTensor>& tensors) {
  std::vector<checkpoint::SafetensorsOutput> out;
  for (const OwnedTensor& t : tensors)
    out.push_back({t.name, t.dtype, t.global_shape, [&t](unsigned char* bytes) {
                     if (!t.bytes.empty()) std::memcpy(bytes, t.bytes.data(), t.bytes.size());
                   }});
  checkpoint::write_safetensors(file, std::move(out), {{"format", "pt"}});
}

nlohmann::json read_json(const std::filesystem::path& path) {
  return nlohmann::json::parse(std::ifstream(path));
}

void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

std::vector<float> hf_floats(const checkpoint::SafetensorsReader& file, const std::string& name) {
  const checkpoint::SafetensorsTensor* t = file.find(name);
  if (t == nullptr) throw std::runtime_error("no HF tensor " + name);
  OwnedTensor o =
      request(name, t->dtype, t->shape, std::vector<int64_t>(t->shape.size(), 0), t->shape);
  if (!o.bytes.empty())  // a zero-width tensor has no bytes (and maybe no data pointer)
    std::memcpy(o.bytes.data(), file.bytes(*t), o.bytes.size());
  return o.floats();
}

std::vector<float> part(const std::vector<float>& v, size_t begin, size_t n) {
  return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(begin),
                            v.begin() + static_cast<std::ptrdiff_t>(begin + n));
}

}  // namespace loom::testing
