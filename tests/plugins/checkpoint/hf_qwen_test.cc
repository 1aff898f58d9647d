// The safetensors format and the dense Qwen families, Qwen2ForCausalLM (Qwen2 / Qwen2.5:
// q/k/v biases) and Qwen3ForCausalLM (q_norm / k_norm, head_dim), both ways: which family
// the export picks from the spec, config.json, where the q/k/v biases and the q/k norms go
// (element by element against the transformers names, written out here), loom -> HF -> loom
// being the identity, the spec the import synthesises (Qwen3's head_dim default of 128
// included), and the refusals naming the spec field or config.json key. Logits against
// transformers (Qwen2) and a re-implementation (Qwen3): tests/reference/hf_test.sh.
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


// A tiny LLaMA-shaped dense model: C 8, H 2, G 1 (grouped-query), D 4, V 11, P 6, L 2.
Tiny dense_model() {
  Tiny m;
  m.llama = true;
  m.g = 1;
  return m;
}

class HfQwen : public HfFamilyTest {
 protected:
  HfQwen() { rng.seed(21); }
  // Qwen2: the tiny model with q/k/v biases and rope base 1e6.
  json qwen2_spec(const Tiny& m) {
    json spec = tiny_spec(m);
    spec["model"]["add_qkv_bias"] = true;
    spec["model"]["rotary"]["base"] = 1e6;
    return spec;
  }
  // Qwen3: the tiny model with qk_layernorm, kv_channels given, and q/k norm weights.
  json qwen3_spec(const Tiny& m, std::vector<OwnedTensor>& w) {
    json spec = tiny_spec(m);
    spec["model"]["qk_layernorm"] = true;
    spec["model"]["kv_channels"] = m.d();
    for (int64_t i = 0; i < m.l; ++i)
      for (const char* n : {"q_layernorm", "k_layernorm"})
        w.push_back(random_tensor(
            "model.decoder.layers." + std::to_string(i) + ".self_attention." + n + ".weight",
            DType::kF32, {m.d()}, rng));
    return spec;
  }
};

// add_qkv_bias without qk_layernorm: Qwen2ForCausalLM, biases on q/k/v_proj only, split out
// of loom's grouped bias (one group: [q_0; q_1; k; v], D rows each).
TEST_F(HfQwen, Qwen2FromQkvBias) {
  Tiny m = dense_model();
  m.qkv_bias = true;
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  fs::path dir = fresh_dir("hf_qwen2");
  Outcome o = export_to(dir, w, qwen2_spec(m));
  ASSERT_EQ(o.code, Code::kOk) << o.message;

  json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], json({"Qwen2ForCausalLM"}));
  EXPECT_EQ(config["model_type"], "qwen2");
  EXPECT_EQ(config["rope_theta"], 1e6);
  EXPECT_EQ(config["num_key_value_heads"], 1);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["use_sliding_window"], false);
  EXPECT_EQ(config["rope_scaling"], nullptr);
  EXPECT_FALSE(config.contains("head_dim"));

  SafetensorsReader file(dir / "model.safetensors");
  std::set<std::string> got = names(file);
  for (const char* n :
       {"model.layers.1.self_attn.q_proj.bias", "model.layers.1.self_attn.k_proj.bias",
        "model.layers.1.self_attn.v_proj.bias"})
    EXPECT_TRUE(got.count(n)) << n;
  for (const char* n : {"model.layers.0.self_attn.o_proj.bias", "model.layers.0.mlp.up_proj.bias",
                        "model.layers.0.self_attn.q_norm.weight", "lm_head.weight"})
    EXPECT_FALSE(got.count(n)) << n;
  std::vector<float> bias =
      by_name(w, "model.decoder.layers.1.self_attention.linear_qkv.bias").floats();
  EXPECT_EQ(hf_floats(file, "model.layers.1.self_attn.q_proj.bias"), part(bias, 0, 8));
  EXPECT_EQ(hf_floats(file, "model.layers.1.self_attn.k_proj.bias"), part(bias, 8, 4));
  EXPECT_EQ(hf_floats(file, "model.layers.1.self_attn.v_proj.bias"), part(bias, 12, 4));
  expect_identity(dir, w);

  // What Qwen2 cannot say is refused, naming the spec field.
  const std::pair<std::function<void(json&)>, const char*> refused[] = {
      {[](json& s) {
         s["model"]["rotary"]["scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       "/rotary/scaling/type"},
      {[](json& s) { s["model"]["kv_channels"] = 8; }, "/kv_channels"},
      {[](json& s) { s["model"]["add_bias_linear"] = true; }, "/add_bias_linear"},
  };
  for (const auto& [change, field] : refused) {
    json bad = qwen2_spec(m);
    change(bad);
    Outcome r = export_to(fresh_dir("hf_qwen2_refused"), w, bad);
    EXPECT_EQ(r.code, Code::kUnimplemented) << field << ": " << r.message;
    EXPECT_NE(r.message.find(std::string("spec /model") + field), std::string::npos) << r.message;
  }
  // Without biases the same model stays LLaMA.
  Tiny llama = dense_model();
  json spec = tiny_spec(llama);
  dir = fresh_dir("hf_qwen2_llama");
  ASSERT_EQ(export_to(dir, tiny_weights(llama, DType::kF32, rng), spec).code, Code::kOk);
  EXPECT_EQ(read_json(dir / "config.json")["architectures"], json({"LlamaForCausalLM"}));
}

// qk_layernorm (dense): Qwen3ForCausalLM with head_dim, q_norm / k_norm, no biases.
TEST_F(HfQwen, Qwen3FromQkLayernorm) {
  Tiny m = dense_model();
  m.tied = false;
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  json spec = qwen3_spec(m, w);
  fs::path dir = fresh_dir("hf_qwen3");
  Outcome o = export_to(dir, w, spec);
  ASSERT_EQ(o.code, Code::kOk) << o.message;

  json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], json({"Qwen3ForCausalLM"}));
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_EQ(config["head_dim"], 4);
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_FALSE(config.contains("num_experts"));

  SafetensorsReader file(dir / "model.safetensors");
  std::set<std::string> got = names(file);
  for (const char* n : {"model.layers.0.self_attn.q_norm.weight",
                        "model.layers.1.self_attn.k_norm.weight", "lm_head.weight"})
    EXPECT_TRUE(got.count(n)) << n;
  EXPECT_FALSE(got.count("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_EQ(hf_floats(file, "model.layers.1.self_attn.k_norm.weight"),
            by_name(w, "model.decoder.layers.1.self_attention.k_layernorm.weight").floats());
  EXPECT_EQ(hf_floats(file, "model.layers.0.self_attn.q_norm.weight"),
            by_name(w, "model.decoder.layers.0.self_attention.q_layernorm.weight").floats());
  expect_identity(dir, w);

  // q/k/v biases with qk_layernorm: no family (Qwen3's attention_bias also biases o_proj).
  json bad = spec;
  bad["model"]["add_qkv_bias"] = true;
  Outcome r = export_to(fresh_dir("hf_qwen3_refused"), w, bad);
  EXPECT_EQ(r.code, Code::kUnimplemented) << r.message;
  EXPECT_NE(r.message.find("spec /model/add_qkv_bias"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("Qwen3"), std::string::npos) << r.message;
}

json qwen_config(const char* type) {
  json c = {
      {"architectures", {std::string(type) == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"}},
      {"model_type", type},
      {"hidden_size", 8},
      {"intermediate_size", 12},
      {"num_hidden_layers", 1},
      {"num_attention_heads", 2},
      {"num_key_value_heads", 1},
      {"max_position_embeddings", 64},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 1000000.0},
      {"vocab_size", 11},
      {"tie_word_embeddings", true},
      {"use_sliding_window", false},
      {"sliding_window", 4096},
      {"max_window_layers", 28},
      {"hidden_act", "silu"},
      {"bos_token_id", 1},
      {"eos_token_id", 2}};
  if (std::string(type) == "qwen3") {
    c["head_dim"] = 6;
    c["attention_bias"] = false;
  }
  return c;
}

class HfQwenImport : public HfQwen {
 protected:
  // A tied one-layer Qwen2 (D 4) or Qwen3 (D 6) as transformers writes it.
  fs::path qwen_dir(const std::string& name, const char* type) {
    const bool qwen3 = std::string(type) == "qwen3";
    const int64_t d = qwen3 ? 6 : 4;
    fs::path dir = fresh_dir(name);
    write_json(dir / "config.json", qwen_config(type));
    hf.clear();
    auto add = [&](const std::string& n, std::vector<int64_t> shape) {
      hf.push_back(random_tensor(n, DType::kF32, std::move(shape), rng));
    };
    add("model.embed_tokens.weight", {11, 8});
    const std::string p = "model.layers.0.";
    add(p + "input_layernorm.weight", {8});
    add(p + "post_attention_layernorm.weight", {8});
    add(p + "self_attn.q_proj.weight", {2 * d, 8});
    add(p + "self_attn.k_proj.weight", {d, 8});
    add(p + "self_attn.v_proj.weight", {d, 8});
    add(p + "self_attn.o_proj.weight", {8, 2 * d});
    if (qwen3) {
      add(p + "self_attn.q_norm.weight", {d});
      add(p + "self_attn.k_norm.weight", {d});
    } else {
      add(p + "self_attn.q_proj.bias", {2 * d});
      add(p + "self_attn.k_proj.bias", {d});
      add(p + "self_attn.v_proj.bias", {d});
    }
    add(p + "mlp.gate_proj.weight", {12, 8});
    add(p + "mlp.up_proj.weight", {12, 8});
    add(p + "mlp.down_proj.weight", {8, 12});
    add("model.norm.weight", {8});
    write_hf_weights(dir / "model.safetensors", hf);
    return dir;
  }
  void load_all(const fs::path& dir, const json& meta) {
    std::vector<OwnedTensor> all;
    for (auto& [name, t] : meta["tensors"].items()) {
      std::vector<int64_t> shape = t["shape"];
      all.push_back(
          request(name, DType::kF32, shape, std::vector<int64_t>(shape.size(), 0), shape));
    }
    Outcome o = load(format, dir, all);
    ASSERT_EQ(o.code, Code::kOk) << o.message;
    loaded = all;
  }
  std::vector<OwnedTensor> hf, loaded;
};

TEST_F(HfQwenImport, Qwen2SpecFromConfigAndWeights) {
  fs::path dir = qwen_dir("hf_in_qwen2", "qwen2");
  json meta;
  Outcome o = metadata(format, dir, &meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  const json& m = meta["spec"]["model"];
  EXPECT_EQ(meta["format"]["architecture"], "Qwen2ForCausalLM");
  EXPECT_EQ(m["add_qkv_bias"], true);
  EXPECT_EQ(m["add_bias_linear"], false);
  EXPECT_FALSE(m.contains("qk_layernorm"));
  EXPECT_EQ(m["rotary"]["base"], 1e6);
  EXPECT_EQ(m["tie_embeddings"], true);
  EXPECT_EQ(m["num_query_groups"], 1);
  EXPECT_EQ(meta["tensors"]["model.decoder.layers.0.self_attention.linear_qkv.bias"]["shape"],
            json({16}));
  EXPECT_FALSE(meta["tensors"].contains("model.output_layer.weight"));
  load_all(dir, meta);
  std::vector<float> bias =
      by_name(loaded, "model.decoder.layers.0.self_attention.linear_qkv.bias").floats();
  EXPECT_EQ(part(bias, 0, 8), by_name(hf, "model.layers.0.self_attn.q_proj.bias").floats());
  EXPECT_EQ(part(bias, 8, 4), by_name(hf, "model.layers.0.self_attn.k_proj.bias").floats());
  EXPECT_EQ(part(bias, 12, 4), by_name(hf, "model.layers.0.self_attn.v_proj.bias").floats());
}

TEST_F(HfQwenImport, Qwen3SpecFromConfigAndWeights) {
  fs::path dir = qwen_dir("hf_in_qwen3", "qwen3");
  json meta;
  Outcome o = metadata(format, dir, &meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  const json& m = meta["spec"]["model"];
  EXPECT_EQ(meta["format"]["architecture"], "Qwen3ForCausalLM");
  EXPECT_EQ(m["qk_layernorm"], true);
  EXPECT_EQ(m["kv_channels"], 6);
  EXPECT_FALSE(m.contains("add_qkv_bias"));
  EXPECT_FALSE(m.contains("moe_layer_freq"));
  EXPECT_EQ(meta["tensors"]["model.decoder.layers.0.self_attention.linear_qkv.weight"]["shape"],
            json({24, 8}));  // one group: 2 query heads, k, v of D 6
  load_all(dir, meta);
  EXPECT_EQ(by_name(loaded, "model.decoder.layers.0.self_attention.k_layernorm.weight").floats(),
            by_name(hf, "model.layers.0.self_attn.k_norm.weight").floats());

  // No head_dim key: transformers' Qwen3Config default, 128 (not hidden / heads).
  json config = qwen_config("qwen3");
  config.erase("head_dim");
  write_json(dir / "config.json", config);
  ASSERT_EQ(metadata(format, dir, &meta).code, Code::kOk);
  EXPECT_EQ(meta["spec"]["model"]["kv_channels"], 128);
}

TEST_F(HfQwenImport, RefusesConfigsLoomCannotRepresent) {
  struct Case {
    const char* type;
    std::function<void(json&)> change;
    const char* key;
  };
  const Case cases[] = {
      {"qwen3", [](json& c) { c["attention_bias"] = true; }, "attention_bias"},
      {"qwen2",
       [](json& c) {
         c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       "rope_scaling"},
      {"qwen2",
       [](json& c) {
         c["use_sliding_window"] = true;
         c["sliding_window"] = 8;
         c["max_window_layers"] = 0;
       },
       "use_sliding_window"},
      {"qwen3", [](json& c) { c["hidden_act"] = "gelu"; }, "hidden_act"},
  };
  for (const Case& c : cases) {
    fs::path dir = qwen_dir("hf_in_qwen_refused", c.type);
    json config = qwen_config(c.type);
    c.change(config);
    write_json(dir / "config.json", config);
    json meta;
    Outcome o = metadata(format, dir, &meta);
    EXPECT_EQ(o.code, Code::kUnimplemented) << c.key << ": " << o.message;
    EXPECT_NE(o.message.find(std::string("config.json: ") + c.key), std::string::npos) << o.message;
  }
  // A window the layers never use (max_window_layers >= num_hidden_layers) is plain causal.
  fs::path dir = qwen_dir("hf_in_qwen_window", "qwen2");
  json config = qwen_config("qwen2");
  config["use_sliding_window"] = true;
  config["sliding_window"] = 8;
  write_json(dir / "config.json", config);
  json meta;
  Outcome o = metadata(format, dir, &meta);
  EXPECT_EQ(o.code, Code::kOk) << o.message;
}

}  // namespace
}  // namespace loom::testing
