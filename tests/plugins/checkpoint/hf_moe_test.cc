// The safetensors format and the mixture-of-experts families, MixtralForCausalLM,
// Qwen2MoeForCausalLM and Qwen3MoeForCausalLM (q_norm / k_norm, head_dim), both ways: which family the export picks, config.json, the names and
// layouts of routers, experts, shared experts, dense layers and q/k/v biases (element by
// element against the transformers conventions, written out here), zeros for what Qwen2-MoE
// has and loom's model lacks, loom -> HF -> loom being the identity, the spec the import
// synthesises, and the refusals (naming the spec field or config.json key) of what the
// families cannot express. Logits against transformers: tests/reference/hf_test.sh.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include "plugins/checkpoint/safetensors_file.h"
#include "tests/plugins/checkpoint/hf_family_fixture.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;
using checkpoint::SafetensorsReader;
using json = nlohmann::json;


// A tiny LLaMA-style mixture of experts: C 8, H 2, G 2, V 11, P 6, 4 experts of width 4,
// top 2.
Tiny moe_model() {
  Tiny m;
  m.llama = true;
  m.tied = false;
  m.experts = 4;
  return m;
}

class HfMoe : public HfFamilyTest {
 protected:
  // Loads loom weight `name` of `shape` whole from `dir`.
  OwnedTensor load_whole(const fs::path& dir, const std::string& name, std::vector<int64_t> shape) {
    std::vector<OwnedTensor> r = {
        request(name, DType::kF32, shape, std::vector<int64_t>(shape.size(), 0), shape)};
    Outcome o = load(format, dir, r);
    EXPECT_EQ(o.code, Code::kOk) << o.message;
    return r[0];
  }
};

TEST_F(HfMoe, MixtralNamesLayoutConfigAndRoundTrip) {
  Tiny m = moe_model();
  fs::path dir = fresh_dir("hf_mixtral");
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  Outcome o = export_to(dir, w, tiny_spec(m));
  ASSERT_EQ(o.code, Code::kOk) << o.message;

  json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], json({"MixtralForCausalLM"}));
  EXPECT_EQ(config["model_type"], "mixtral");
  EXPECT_EQ(config["num_local_experts"], 4);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["intermediate_size"], 4);  // the experts' width
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["router_aux_loss_coef"], 0.02);
  EXPECT_EQ(config["router_jitter_noise"], 0.0);
  EXPECT_EQ(config["sliding_window"], nullptr);
  EXPECT_EQ(config["hidden_act"], "silu");

  SafetensorsReader file(dir / "model.safetensors");
  std::set<std::string> want = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  for (int i = 0; i < 2; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n :
         {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
          "self_attn.v_proj", "self_attn.o_proj", "block_sparse_moe.gate"})
      want.insert(p + n + ".weight");
    for (int e = 0; e < 4; ++e)
      for (const char* n : {"w1", "w2", "w3"})
        want.insert(p + "block_sparse_moe.experts." + std::to_string(e) + "." + n + ".weight");
  }
  EXPECT_EQ(names(file), want);
  // Expert e: w1 (F, C) is the gate half of linear_fc1.weight{e} (2, F, C), w3 the up half,
  // w2 (C, F) linear_fc2.weight{e}; the router is block_sparse_moe.gate (E, C).
  const size_t fc = 4 * 8;
  for (int e = 0; e < 4; ++e) {
    std::string loom = "model.decoder.layers.1.mlp.experts.linear_fc";
    std::string hf = "model.layers.1.block_sparse_moe.experts." + std::to_string(e) + ".";
    std::vector<float> fc1 = by_name(w, loom + "1.weight" + std::to_string(e)).floats();
    EXPECT_EQ(hf_floats(file, hf + "w1.weight"), part(fc1, 0, fc)) << e;
    EXPECT_EQ(hf_floats(file, hf + "w3.weight"), part(fc1, fc, fc)) << e;
    EXPECT_EQ(hf_floats(file, hf + "w2.weight"),
              by_name(w, loom + "2.weight" + std::to_string(e)).floats());
  }
  EXPECT_EQ(hf_floats(file, "model.layers.0.block_sparse_moe.gate.weight"),
            by_name(w, "model.decoder.layers.0.mlp.router.weight").floats());
  expect_identity(dir, w);
}

TEST_F(HfMoe, Qwen2MoeSharedExpertDenseLayersAndBiases) {
  Tiny m = moe_model();
  m.l = 3;
  m.freq = {0, 1, 0};  // decoder_sparse_step 2
  m.shared_f = 6;
  m.qkv_bias = true;
  m.pre_softmax = true;
  m.g = 1;  // 2 query heads share 1 key/value head
  fs::path dir = fresh_dir("hf_qwen2_moe");
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  Outcome o = export_to(dir, w, tiny_spec(m));
  ASSERT_EQ(o.code, Code::kOk) << o.message;

  json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], json({"Qwen2MoeForCausalLM"}));
  EXPECT_EQ(config["model_type"], "qwen2_moe");
  EXPECT_EQ(config["num_experts"], 4);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["moe_intermediate_size"], 4);
  EXPECT_EQ(config["intermediate_size"], 32);  // the dense layers' width
  EXPECT_EQ(config["shared_expert_intermediate_size"], 6);
  EXPECT_EQ(config["norm_topk_prob"], false);  // pre_softmax
  EXPECT_EQ(config["decoder_sparse_step"], 2);
  EXPECT_EQ(config["mlp_only_layers"], json::array());
  EXPECT_EQ(config["use_sliding_window"], false);
  EXPECT_EQ(config["num_key_value_heads"], 1);

  SafetensorsReader file(dir / "model.safetensors");
  std::set<std::string> got = names(file);
  for (const char* n :
       {"model.layers.0.mlp.gate_proj.weight", "model.layers.2.mlp.down_proj.weight",
        "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.3.up_proj.weight",
        "model.layers.1.mlp.shared_expert.down_proj.weight",
        "model.layers.1.mlp.shared_expert_gate.weight", "model.layers.2.self_attn.v_proj.bias"})
    EXPECT_TRUE(got.count(n)) << n;
  EXPECT_FALSE(got.count("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(got.count("model.layers.1.mlp.gate_proj.weight"));
  // Biases in loom's grouped layout: one group [q head 0 | q head 1 | k | v], D = 4.
  std::vector<float> bias =
      by_name(w, "model.decoder.layers.2.self_attention.linear_qkv.bias").floats();
  EXPECT_EQ(hf_floats(file, "model.layers.2.self_attn.q_proj.bias"), part(bias, 0, 8));
  EXPECT_EQ(hf_floats(file, "model.layers.2.self_attn.k_proj.bias"), part(bias, 8, 4));
  EXPECT_EQ(hf_floats(file, "model.layers.2.self_attn.v_proj.bias"), part(bias, 12, 4));
  std::vector<float> shared =
      by_name(w, "model.decoder.layers.1.mlp.shared_experts.linear_fc1.weight").floats();
  EXPECT_EQ(hf_floats(file, "model.layers.1.mlp.shared_expert.gate_proj.weight"),
            part(shared, 0, 6 * 8));
  EXPECT_EQ(hf_floats(file, "model.layers.1.mlp.shared_expert.up_proj.weight"),
            part(shared, 6 * 8, 6 * 8));
  EXPECT_EQ(hf_floats(file, "model.layers.1.mlp.shared_expert_gate.weight"),
            by_name(w, "model.decoder.layers.1.mlp.shared_experts.gate_weight").floats());
  std::vector<float> expert =
      by_name(w, "model.decoder.layers.1.mlp.experts.linear_fc1.weight2").floats();
  EXPECT_EQ(hf_floats(file, "model.layers.1.mlp.experts.2.up_proj.weight"),
            part(expert, 4 * 8, 4 * 8));
  std::vector<float> dense = by_name(w, "model.decoder.layers.0.mlp.linear_fc1.weight").floats();
  EXPECT_EQ(hf_floats(file, "model.layers.0.mlp.gate_proj.weight"), part(dense, 0, 32 * 8));
  expect_identity(dir, w);

  // A pattern no decoder_sparse_step makes: mlp_only_layers (transformers >= 4.41).
  m.freq = {1, 0, 1};
  fs::path other = fresh_dir("hf_qwen2_moe_only");
  ASSERT_EQ(export_to(other, tiny_weights(m, DType::kF32, rng), tiny_spec(m)).code, Code::kOk);
  config = read_json(other / "config.json");
  EXPECT_EQ(config["decoder_sparse_step"], 1);
  EXPECT_EQ(config["mlp_only_layers"], json({1}));
}

TEST_F(HfMoe, Qwen2MoeZerosForWhatLoomLacks) {
  // Top-2 without renormalising (pre_softmax): not Mixtral. No q/k/v bias, no shared expert:
  // written as zeros (a width-0 shared expert) so that Qwen2-MoE computes the same.
  Tiny m = moe_model();
  m.pre_softmax = true;
  fs::path dir = fresh_dir("hf_qwen2_moe_zeros");
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kBF16, rng);
  Outcome o = export_to(dir, w, tiny_spec(m));
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], json({"Qwen2MoeForCausalLM"}));
  EXPECT_EQ(config["shared_expert_intermediate_size"], 0);
  EXPECT_EQ(config["decoder_sparse_step"], 1);
  SafetensorsReader file(dir / "model.safetensors");
  const std::pair<const char*, std::vector<int64_t>> zeros[] = {
      {"self_attn.q_proj.bias", {8}},
      {"self_attn.k_proj.bias", {8}},
      {"self_attn.v_proj.bias", {8}},
      {"mlp.shared_expert.gate_proj.weight", {0, 8}},
      {"mlp.shared_expert.up_proj.weight", {0, 8}},
      {"mlp.shared_expert.down_proj.weight", {8, 0}},
      {"mlp.shared_expert_gate.weight", {1, 8}}};
  for (const auto& [name, shape] : zeros) {
    std::string hf = "model.layers.1." + std::string(name);
    const checkpoint::SafetensorsTensor* t = file.find(hf);
    ASSERT_NE(t, nullptr) << hf;
    EXPECT_EQ(t->shape, shape) << hf;
    EXPECT_EQ(t->st_dtype, "BF16") << hf;
    for (float x : hf_floats(file, hf)) ASSERT_EQ(x, 0.f) << hf;
  }
  expect_identity(dir, w);
}

// Qwen3-MoE: a mixture of experts with qk_layernorm. q_norm / k_norm (D) per layer, no
// biases, no shared expert, head_dim written; loom -> HF -> loom is the identity.
TEST_F(HfMoe, Qwen3MoeQkNormsAndHeadDim) {
  Tiny m = moe_model();
  m.l = 3;
  m.freq = {1, 0, 1};  // no step makes it: mlp_only_layers [1]
  json spec = tiny_spec(m);
  spec["model"]["qk_layernorm"] = true;
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  for (int i = 0; i < 3; ++i)
    for (const char* n : {"q_layernorm", "k_layernorm"})
      w.push_back(random_tensor("model.decoder.layers." + std::to_string(i) +
                                    ".self_attention." + n + ".weight",
                                DType::kF32, {4}, rng));
  fs::path dir = fresh_dir("hf_qwen3_moe");
  Outcome o = export_to(dir, w, spec);
  ASSERT_EQ(o.code, Code::kOk) << o.message;

  json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], json({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(config["model_type"], "qwen3_moe");
  EXPECT_EQ(config["head_dim"], 4);
  EXPECT_EQ(config["num_experts"], 4);
  EXPECT_EQ(config["moe_intermediate_size"], 4);
  EXPECT_EQ(config["norm_topk_prob"], true);
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["decoder_sparse_step"], 1);
  EXPECT_EQ(config["mlp_only_layers"], json({1}));
  EXPECT_FALSE(config.contains("shared_expert_intermediate_size"));

  SafetensorsReader file(dir / "model.safetensors");
  std::set<std::string> got = names(file);
  for (const char* n : {"model.layers.0.self_attn.q_norm.weight",
                        "model.layers.2.self_attn.k_norm.weight", "model.layers.1.mlp.up_proj.weight",
                        "model.layers.2.mlp.experts.3.down_proj.weight"})
    EXPECT_TRUE(got.count(n)) << n;
  for (const char* n : {"model.layers.0.self_attn.q_proj.bias",
                        "model.layers.0.mlp.shared_expert_gate.weight",
                        "model.layers.0.mlp.shared_expert.up_proj.weight"})
    EXPECT_FALSE(got.count(n)) << n;
  EXPECT_EQ(hf_floats(file, "model.layers.2.self_attn.k_norm.weight"),
            by_name(w, "model.decoder.layers.2.self_attention.k_layernorm.weight").floats());
  EXPECT_EQ(hf_floats(file, "model.layers.1.self_attn.q_norm.weight"),
            by_name(w, "model.decoder.layers.1.self_attention.q_layernorm.weight").floats());
  expect_identity(dir, w);

  // What Qwen3-MoE lacks is refused, naming the spec field.
  const std::pair<std::function<void(json&)>, const char*> refused[] = {
      {[](json& s) { s["model"]["add_qkv_bias"] = true; }, "/add_qkv_bias"},
      {[](json& s) {
         s["model"]["layer"]["mlp"]["shared_expert_intermediate_size"] = 6;
         s["model"]["layer"]["mlp"]["shared_expert_gate"] = true;
       },
       "/layer/mlp/shared_expert_intermediate_size"},
  };
  for (const auto& [change, field] : refused) {
    json bad = spec;
    change(bad);
    Outcome r = export_to(fresh_dir("hf_qwen3_moe_refused"), w, bad);
    EXPECT_EQ(r.code, Code::kUnimplemented) << field << ": " << r.message;
    EXPECT_NE(r.message.find(std::string("spec /model") + field), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("Qwen3-MoE"), std::string::npos) << r.message;
  }
  // A dense model with qk_layernorm is Qwen3: hf_qwen_test.cc.
}

TEST_F(HfMoe, RefusesWhatNeitherFamilyExpresses) {
  const Tiny moe = moe_model();
  Tiny shared = moe;
  shared.shared_f = 4;
  Tiny dense = moe;
  dense.freq = {0, 1};
  struct Case {
    Tiny model;
    std::function<void(json&)> change;
    const char* field;
  };
  auto router = [](json& s) -> json& { return s["layer"]["mlp"]["router"]; };
  const Case cases[] = {
      {moe, [&](json& s) { router(s)["score_function"] = "sigmoid"; },
       "/layer/mlp/router/score_function"},
      {moe, [&](json& s) { router(s)["num_groups"] = 2; }, "/layer/mlp/router/num_groups"},
      {moe, [&](json& s) { router(s)["enable_expert_bias"] = true; },
       "/layer/mlp/router/enable_expert_bias"},
      {moe, [&](json& s) { router(s)["topk_scaling_factor"] = 2.5; },
       "/layer/mlp/router/topk_scaling_factor"},
      {moe, [](json& s) { s["layer"]["mlp"]["expert_capacity_factor"] = 1.0; },
       "/layer/mlp/expert_capacity_factor"},
      {moe, [](json& s) { s["layer"]["mlp"]["activation"] = "gelu"; }, "/layer/mlp/activation"},
      {shared, [](json& s) { s["layer"]["mlp"]["shared_expert_gate"] = false; },
       "/layer/mlp/shared_expert_gate"},
      {dense, [](json& s) { s["layer"]["dense_mlp"]["activation"] = "gelu"; },
       "/layer/dense_mlp/activation"},
      {moe,
       [](json& s) {
         s["rotary"]["scaling"] = {{"type", "linear"}, {"factor", 2}};
       },
       "/rotary/scaling/type"},
      {moe, [](json& s) { s["add_bias_linear"] = true; }, "/add_bias_linear"},
  };
  for (const Case& c : cases) {
    json spec = tiny_spec(c.model);
    c.change(spec["model"]);
    Outcome o =
        export_to(fresh_dir("hf_moe_refused"), tiny_weights(c.model, DType::kF32, rng), spec);
    EXPECT_EQ(o.code, Code::kUnimplemented) << c.field << ": " << o.message;
    EXPECT_NE(o.message.find(std::string("spec /model") + c.field), std::string::npos) << o.message;
  }
}

// Hugging Face directories as transformers writes them (no loom metadata).
json mixtral_config() {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"model_type", "mixtral"},
          {"hidden_size", 8},
          {"intermediate_size", 4},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"max_position_embeddings", 16},
          {"num_local_experts", 3},
          {"num_experts_per_tok", 2},
          {"router_aux_loss_coef", 0.01},
          {"router_jitter_noise", 0.0},
          {"sliding_window", nullptr},
          {"vocab_size", 11}};
}

// head_dim 6 where hidden / heads is 4; layer 1 dense; Qwen3's rope_theta and defaults.
json qwen3_moe_config() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"moe_intermediate_size", 4},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", 6},
          {"max_position_embeddings", 16},
          {"num_experts", 3},
          {"num_experts_per_tok", 2},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", {1}},
          {"norm_topk_prob", true},
          {"rope_theta", 1e6},
          {"use_sliding_window", false},
          {"sliding_window", nullptr},
          {"attention_bias", false},
          {"tie_word_embeddings", false},
          {"vocab_size", 11}};
}

json qwen2_moe_config() {
  return {{"architectures", {"Qwen2MoeForCausalLM"}},
          {"model_type", "qwen2_moe"},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"moe_intermediate_size", 4},
          {"shared_expert_intermediate_size", 0},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 16},
          {"num_experts", 3},
          {"num_experts_per_tok", 2},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", {2}},
          {"norm_topk_prob", true},
          {"use_sliding_window", false},
          {"sliding_window", 4},  // unused without use_sliding_window
          {"tie_word_embeddings", true},
          {"vocab_size", 11}};
}

class HfMoeImport : public HfMoe {
 protected:
  void add(const std::string& n, std::vector<int64_t> shape) {
    hf.push_back(random_tensor(n, DType::kF32, std::move(shape), rng));
  }
  // The attention and norms of layer i (D 4, `kv` key/value heads).
  void attention(int i, int64_t kv, bool bias) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {8});
    add(p + "post_attention_layernorm.weight", {8});
    add(p + "self_attn.q_proj.weight", {8, 8});
    add(p + "self_attn.k_proj.weight", {kv * 4, 8});
    add(p + "self_attn.v_proj.weight", {kv * 4, 8});
    add(p + "self_attn.o_proj.weight", {8, 8});
    if (!bias) return;
    add(p + "self_attn.q_proj.bias", {8});
    add(p + "self_attn.k_proj.bias", {kv * 4});
    add(p + "self_attn.v_proj.bias", {kv * 4});
  }
  fs::path mixtral_dir(const std::string& name) {
    fs::path dir = fresh_dir(name);
    write_json(dir / "config.json", mixtral_config());
    hf.clear();
    add("model.embed_tokens.weight", {11, 8});
    attention(0, 1, false);
    add("model.layers.0.block_sparse_moe.gate.weight", {3, 8});
    for (int e = 0; e < 3; ++e) {
      std::string p = "model.layers.0.block_sparse_moe.experts." + std::to_string(e) + ".";
      add(p + "w1.weight", {4, 8});
      add(p + "w2.weight", {8, 4});
      add(p + "w3.weight", {4, 8});
    }
    add("model.norm.weight", {8});
    add("lm_head.weight", {11, 8});
    write_hf_weights(dir / "model.safetensors", hf);
    return dir;
  }
  // A dense SwiGLU MLP of width 12 under prefix `p` ("model.layers.N.mlp.").
  void dense_mlp(const std::string& p) {
    add(p + "gate_proj.weight", {12, 8});
    add(p + "up_proj.weight", {12, 8});
    add(p + "down_proj.weight", {8, 12});
  }
  // The router and 3 experts of width 4 under prefix `p`.
  void routed_experts(const std::string& p) {
    add(p + "gate.weight", {3, 8});
    for (int e = 0; e < 3; ++e)
      for (const char* n : {"gate_proj", "up_proj", "down_proj"})
        add(p + "experts." + std::to_string(e) + "." + n + ".weight",
            std::string(n) == "down_proj" ? std::vector<int64_t>{8, 4}
                                          : std::vector<int64_t>{4, 8});
  }
  // Layers 0 and 1 sparse with a shared expert of width 0; layer 2 dense (mlp_only_layers).
  fs::path qwen2_moe_dir(const std::string& name) {
    fs::path dir = fresh_dir(name);
    write_json(dir / "config.json", qwen2_moe_config());
    hf.clear();
    add("model.embed_tokens.weight", {11, 8});
    for (int i = 0; i < 3; ++i) {
      attention(i, 2, true);
      std::string p = "model.layers." + std::to_string(i) + ".mlp.";
      if (i == 2) {
        dense_mlp(p);
        continue;
      }
      routed_experts(p);
      add(p + "shared_expert.gate_proj.weight", {0, 8});
      add(p + "shared_expert.up_proj.weight", {0, 8});
      add(p + "shared_expert.down_proj.weight", {8, 0});
      add(p + "shared_expert_gate.weight", {1, 8});
    }
    add("model.norm.weight", {8});
    write_hf_weights(dir / "model.safetensors", hf);
    return dir;
  }
  // Layer 0 sparse, layer 1 dense (mlp_only_layers); D 6, 2 query heads, 1 key/value head.
  fs::path qwen3_moe_dir(const std::string& name) {
    fs::path dir = fresh_dir(name);
    write_json(dir / "config.json", qwen3_moe_config());
    hf.clear();
    add("model.embed_tokens.weight", {11, 8});
    for (int i = 0; i < 2; ++i) {
      std::string p = "model.layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", {8});
      add(p + "post_attention_layernorm.weight", {8});
      add(p + "self_attn.q_proj.weight", {12, 8});
      add(p + "self_attn.k_proj.weight", {6, 8});
      add(p + "self_attn.v_proj.weight", {6, 8});
      add(p + "self_attn.o_proj.weight", {8, 12});
      add(p + "self_attn.q_norm.weight", {6});
      add(p + "self_attn.k_norm.weight", {6});
      p += "mlp.";
      if (i == 1) {
        dense_mlp(p);
        continue;
      }
      routed_experts(p);
    }
    add("model.norm.weight", {8});
    add("lm_head.weight", {11, 8});
    write_hf_weights(dir / "model.safetensors", hf);
    return dir;
  }
  // Every weight the metadata lists, loaded.
  void load_all(const fs::path& dir, const json& meta) {
    std::vector<OwnedTensor> weights;
    for (auto& [name, t] : meta["tensors"].items()) {
      std::vector<int64_t> shape = t["shape"];
      weights.push_back(
          request(name, DType::kF32, shape, std::vector<int64_t>(shape.size(), 0), shape));
    }
    Outcome o = load(format, dir, weights);
    ASSERT_EQ(o.code, Code::kOk) << o.message;
  }

  std::vector<OwnedTensor> hf;
};

TEST_F(HfMoeImport, MixtralSpecFromConfigAndWeights) {
  fs::path dir = mixtral_dir("hf_in_mixtral");
  json meta;
  Outcome o = metadata(format, dir, &meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  const json& m = meta["spec"]["model"];
  EXPECT_EQ(meta["format"]["architecture"], "MixtralForCausalLM");
  EXPECT_EQ(m["position_embedding"], "rope");
  EXPECT_EQ(m["rotary"]["base"], 1e6);  // Mixtral's default rope_theta
  EXPECT_EQ(m["num_query_groups"], 1);
  EXPECT_EQ(m["add_qkv_bias"], false);
  EXPECT_EQ(m["moe_layer_freq"], 1);
  EXPECT_EQ(m["layer"]["norm"]["eps"], 1e-5);  // Mixtral's default rms_norm_eps
  const json& mlp = m["layer"]["mlp"];
  EXPECT_EQ(mlp["impl"], "moe");
  EXPECT_EQ(mlp["num_experts"], 3);
  EXPECT_EQ(mlp["moe_ffn_hidden_size"], 4);
  EXPECT_EQ(mlp["activation"], "swiglu");
  EXPECT_EQ(mlp["shared_expert_intermediate_size"], nullptr);
  EXPECT_EQ(mlp["router"], (json{{"impl", "topk"},
                                 {"topk", 2},
                                 {"score_function", "softmax"},
                                 {"pre_softmax", false},
                                 {"load_balancing_type", "aux_loss"},
                                 {"aux_loss_coeff", 0.01}}));
  EXPECT_EQ(meta["tensors"]["model.decoder.layers.0.mlp.experts.linear_fc1.weight2"]["shape"],
            json({2, 4, 8}));
  OwnedTensor fc1 =
      load_whole(dir, "model.decoder.layers.0.mlp.experts.linear_fc1.weight1", {2, 4, 8});
  std::vector<float> want = by_name(hf, "model.layers.0.block_sparse_moe.experts.1.w1.weight")
                                .floats();  // [gate = w1; up = w3]
  std::vector<float> up =
      by_name(hf, "model.layers.0.block_sparse_moe.experts.1.w3.weight").floats();
  want.insert(want.end(), up.begin(), up.end());
  EXPECT_EQ(fc1.floats(), want);
  OwnedTensor router = load_whole(dir, "model.decoder.layers.0.mlp.router.weight", {3, 8});
  EXPECT_EQ(router.bytes, by_name(hf, "model.layers.0.block_sparse_moe.gate.weight").bytes);
  load_all(dir, meta);
}

TEST_F(HfMoeImport, Qwen2MoeSpecFromConfigAndWeights) {
  fs::path dir = qwen2_moe_dir("hf_in_qwen2_moe");
  json meta;
  Outcome o = metadata(format, dir, &meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  const json& m = meta["spec"]["model"];
  EXPECT_EQ(meta["format"]["architecture"], "Qwen2MoeForCausalLM");
  EXPECT_EQ(m["add_qkv_bias"], true);
  EXPECT_EQ(m["add_bias_linear"], false);
  EXPECT_EQ(m["tie_embeddings"], true);
  EXPECT_EQ(m["ffn_hidden_size"], 12);
  EXPECT_EQ(m["moe_layer_freq"], json({1, 1, 0}));  // layer 2 in mlp_only_layers
  EXPECT_EQ(m["layer"]["dense_mlp"], (json{{"impl", "mlp"}, {"activation", "swiglu"}}));
  const json& mlp = m["layer"]["mlp"];
  EXPECT_EQ(mlp["moe_ffn_hidden_size"], 4);
  EXPECT_EQ(mlp["router"]["pre_softmax"], false);              // norm_topk_prob true
  EXPECT_EQ(mlp["shared_expert_intermediate_size"], nullptr);  // width 0
  EXPECT_EQ(mlp["shared_expert_gate"], false);
  EXPECT_FALSE(meta["tensors"].contains("model.decoder.layers.0.mlp.shared_experts.gate_weight"));
  EXPECT_TRUE(meta["tensors"].contains("model.decoder.layers.2.mlp.linear_fc1.weight"));
  // Biases in loom's grouped layout: per group g (2 groups of 1 head, D 4): [q_g | k_g | v_g].
  OwnedTensor bias = load_whole(dir, "model.decoder.layers.1.self_attention.linear_qkv.bias", {24});
  std::vector<float> got = bias.floats();
  std::vector<float> q = by_name(hf, "model.layers.1.self_attn.q_proj.bias").floats();
  std::vector<float> k = by_name(hf, "model.layers.1.self_attn.k_proj.bias").floats();
  std::vector<float> v = by_name(hf, "model.layers.1.self_attn.v_proj.bias").floats();
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_EQ(part(got, g * 12, 4), part(q, g * 4, 4));
    EXPECT_EQ(part(got, g * 12 + 4, 4), part(k, g * 4, 4));
    EXPECT_EQ(part(got, g * 12 + 8, 4), part(v, g * 4, 4));
  }
  OwnedTensor down =
      load_whole(dir, "model.decoder.layers.0.mlp.experts.linear_fc2.weight2", {8, 4});
  EXPECT_EQ(down.bytes, by_name(hf, "model.layers.0.mlp.experts.2.down_proj.weight").bytes);
  load_all(dir, meta);

  // decoder_sparse_step 2 without mlp_only_layers: layer i sparse iff (i + 1) % 2 == 0.
  json config = qwen2_moe_config();
  config["decoder_sparse_step"] = 2;
  config["mlp_only_layers"] = json::array();
  config["shared_expert_intermediate_size"] = 6;
  write_json(dir / "config.json", config);
  ASSERT_EQ(metadata(format, dir, &meta).code, Code::kOk);
  EXPECT_EQ(meta["spec"]["model"]["moe_layer_freq"], json({0, 1, 0}));
  EXPECT_EQ(meta["spec"]["model"]["layer"]["mlp"]["shared_expert_intermediate_size"], 6);
  EXPECT_EQ(meta["spec"]["model"]["layer"]["mlp"]["shared_expert_gate"], true);
}

TEST_F(HfMoeImport, Qwen3MoeSpecFromConfigAndWeights) {
  fs::path dir = qwen3_moe_dir("hf_in_qwen3_moe");
  json meta;
  Outcome o = metadata(format, dir, &meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  const json& m = meta["spec"]["model"];
  EXPECT_EQ(meta["format"]["architecture"], "Qwen3MoeForCausalLM");
  EXPECT_EQ(m["qk_layernorm"], true);
  EXPECT_EQ(m["kv_channels"], 6);
  EXPECT_EQ(m["add_qkv_bias"], false);
  EXPECT_EQ(m["num_query_groups"], 1);
  EXPECT_EQ(m["rotary"]["base"], 1e6);
  EXPECT_EQ(m["moe_layer_freq"], json({1, 0}));
  EXPECT_EQ(m["tie_embeddings"], false);
  const json& mlp = m["layer"]["mlp"];
  EXPECT_EQ(mlp["num_experts"], 3);
  EXPECT_EQ(mlp["router"]["pre_softmax"], false);  // norm_topk_prob
  EXPECT_EQ(mlp["shared_expert_intermediate_size"], nullptr);
  EXPECT_EQ(meta["tensors"]["model.decoder.layers.1.self_attention.k_layernorm.weight"]["shape"],
            json({6}));
  EXPECT_EQ(meta["tensors"]["model.decoder.layers.0.self_attention.linear_qkv.weight"]["shape"],
            json({24, 8}));  // one group: 2 query heads, k, v of D 6
  load_all(dir, meta);
  OwnedTensor q_norm =
      load_whole(dir, "model.decoder.layers.0.self_attention.q_layernorm.weight", {6});
  EXPECT_EQ(q_norm.floats(), by_name(hf, "model.layers.0.self_attn.q_norm.weight").floats());

  // head_dim disagreeing with the weights: the tensor, the file and config.json are named.
  json config = qwen3_moe_config();
  config["head_dim"] = 4;
  write_json(dir / "config.json", config);
  ASSERT_EQ(metadata(format, dir, &meta).code, Code::kOk);
  std::vector<OwnedTensor> one = {request("model.decoder.layers.0.self_attention.q_layernorm.weight",
                                          DType::kF32, {4}, {0}, {4})};
  Outcome bad = load(format, dir, one);
  EXPECT_EQ(bad.code, Code::kInvalidArgument) << bad.message;
  EXPECT_NE(bad.message.find("self_attn.q_norm.weight"), std::string::npos) << bad.message;
  EXPECT_NE(bad.message.find("config.json"), std::string::npos) << bad.message;
  // Biases on the attention are refused, naming the key.
  config = qwen3_moe_config();
  config["attention_bias"] = true;
  write_json(dir / "config.json", config);
  o = metadata(format, dir, &meta);
  EXPECT_EQ(o.code, Code::kUnimplemented) << o.message;
  EXPECT_NE(o.message.find("config.json: attention_bias"), std::string::npos) << o.message;
}

TEST_F(HfMoeImport, RefusesConfigsLoomCannotRepresent) {
  struct Case {
    bool qwen;
    std::function<void(json&)> change;
    const char* key;
  };
  const Case cases[] = {
      {false, [](json& c) { c["router_jitter_noise"] = 0.1; }, "router_jitter_noise"},
      {false, [](json& c) { c["sliding_window"] = 8; }, "sliding_window"},
      {false, [](json& c) { c["num_experts_per_tok"] = 1; }, "num_experts_per_tok"},
      {false, [](json& c) { c["hidden_act"] = "gelu"; }, "hidden_act"},
      {true, [](json& c) { c["use_sliding_window"] = true; }, "use_sliding_window"},
      {true,
       [](json& c) {
         c["num_experts_per_tok"] = 1;  // renormalised: weight 1
       },
       "norm_topk_prob"},
      {true, [](json& c) { c["model_type"] = "qwen4_moe"; }, "model_type"},
  };
  for (const Case& c : cases) {
    fs::path dir = c.qwen ? qwen2_moe_dir("hf_in_moe_refused") : mixtral_dir("hf_in_moe_refused");
    json config = c.qwen ? qwen2_moe_config() : mixtral_config();
    c.change(config);
    write_json(dir / "config.json", config);
    json meta;
    Outcome o = metadata(format, dir, &meta);
    EXPECT_EQ(o.code, Code::kUnimplemented) << c.key << ": " << o.message;
    EXPECT_NE(o.message.find(std::string("config.json: ") + c.key), std::string::npos) << o.message;
    if (std::string(c.key) == "model_type") {
      EXPECT_NE(o.message.find("qwen3_moe (Qwen3MoeForCausalLM)"), std::string::npos)
          << o.message;
    }
  }
  // Malformed values are kInvalidArgument naming the key.
  fs::path dir = qwen2_moe_dir("hf_in_moe_invalid");
  json config = qwen2_moe_config();
  config["mlp_only_layers"] = {3};
  write_json(dir / "config.json", config);
  json meta;
  Outcome o = metadata(format, dir, &meta);
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_NE(o.message.find("mlp_only_layers"), std::string::npos) << o.message;
}

}  // namespace
}  // namespace loom::testing
