// The safetensors format reading Hugging Face directories that transformers wrote (no loom
// metadata): the loom spec synthesised from config.json, weights mapped back to loom's
// names and layouts (also from a sharded index and from files without the base-model
// prefix), HF -> loom -> HF being the identity, and errors naming the file and the key or
// tensor.
#include <gtest/gtest.h>

#include <fstream>

#include "plugins/checkpoint/safetensors_file.h"
#include "tests/plugins/checkpoint/hf_fixtures.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;


nlohmann::json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 16},
          {"intermediate_size", 24},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"rope_type", "llama3"},
            {"factor", 8.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192}}},
          {"vocab_size", 13},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"},
          {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

class HfImport : public ::testing::Test {
 protected:
  // A LLaMA directory as transformers writes it: HF names, f32, no loom metadata.
  fs::path llama_dir(const std::string& name) {
    fs::path dir = fresh_dir(name);
    write_json(dir / "config.json", llama_config());
    auto add = [&](const std::string& n, std::vector<int64_t> shape) {
      hf.push_back(random_tensor(n, DType::kF32, std::move(shape), rng));
    };
    hf.clear();
    add("model.embed_tokens.weight", {13, 16});
    add("model.layers.0.input_layernorm.weight", {16});
    add("model.layers.0.self_attn.q_proj.weight", {16, 16});
    add("model.layers.0.self_attn.k_proj.weight", {8, 16});
    add("model.layers.0.self_attn.v_proj.weight", {8, 16});
    add("model.layers.0.self_attn.o_proj.weight", {16, 16});
    add("model.layers.0.post_attention_layernorm.weight", {16});
    add("model.layers.0.mlp.gate_proj.weight", {24, 16});
    add("model.layers.0.mlp.up_proj.weight", {24, 16});
    add("model.layers.0.mlp.down_proj.weight", {16, 24});
    add("model.norm.weight", {16});
    add("lm_head.weight", {13, 16});
    write_hf_weights(dir / "model.safetensors", hf);
    return dir;
  }
  Outcome load_one(const fs::path& dir, OwnedTensor* out) {
    std::vector<OwnedTensor> r = {*out};
    Outcome o = load(format, dir, r);
    *out = r[0];
    return o;
  }

  CheckpointEnv env;
  Format format = env.format({{"impl", "safetensors"}});
  std::mt19937 rng{5};
  std::vector<OwnedTensor> hf;
};

TEST_F(HfImport, LlamaSpecFromConfigAndWeights) {
  fs::path dir = llama_dir("hf_in_llama");
  std::string d = dir.string();
  EXPECT_TRUE(format->recognizes({d.data(), d.size()}));
  nlohmann::json meta;
  Outcome o = metadata(format, dir, &meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  const nlohmann::json& m = meta["spec"]["model"];
  EXPECT_EQ(meta["format_version"], 1);
  EXPECT_EQ(meta["iteration"], 0);
  EXPECT_EQ(m["impl"], "gpt");
  EXPECT_EQ(m["num_layers"], 1);
  EXPECT_EQ(m["hidden_size"], 16);
  EXPECT_EQ(m["num_attention_heads"], 4);
  EXPECT_EQ(m["num_query_groups"], 2);
  EXPECT_EQ(m["ffn_hidden_size"], 24);
  EXPECT_EQ(m["vocab_size"], 13);
  EXPECT_EQ(m["max_position_embeddings"], 64);
  EXPECT_EQ(m["position_embedding"], "rope");
  EXPECT_EQ(m["rotary"]["base"], 500000.0);
  EXPECT_EQ(m["rotary"]["scaling"], (nlohmann::json{{"type", "llama3"},
                                                    {"factor", 8.0},
                                                    {"low_freq_factor", 1.0},
                                                    {"high_freq_factor", 4.0},
                                                    {"original_max_position_embeddings", 8192}}));
  EXPECT_EQ(m["tie_embeddings"], false);
  EXPECT_EQ(m["add_bias_linear"], false);
  EXPECT_EQ(m["layer"]["impl"], "transformer_layer");
  EXPECT_EQ(m["layer"]["norm"], (nlohmann::json{{"impl", "rmsnorm"}, {"eps", 1e-6}}));
  EXPECT_EQ(m["layer"]["attention"]["impl"], "fused");
  EXPECT_EQ(m["layer"]["mlp"], (nlohmann::json{{"impl", "mlp"}, {"activation", "swiglu"}}));
  EXPECT_EQ(m["final_norm"], m["layer"]["norm"]);
  EXPECT_EQ(meta["tensors"].size(), 9u);
  EXPECT_EQ(meta["tensors"]["model.decoder.layers.0.self_attention.linear_qkv.weight"],
            (nlohmann::json{{"dtype", "f32"}, {"shape", {32, 16}}}));
  EXPECT_EQ(meta["tensors"]["model.output_layer.weight"]["shape"], nlohmann::json({13, 16}));

  OwnedTensor qkv = request("model.decoder.layers.0.self_attention.linear_qkv.weight", DType::kF32,
                            {32, 16}, {0, 0}, {32, 16});
  ASSERT_EQ(load_one(dir, &qkv).code, Code::kOk);
  std::vector<float> got = qkv.floats();
  std::vector<float> q = by_name(hf, "model.layers.0.self_attn.q_proj.weight").floats();
  std::vector<float> k = by_name(hf, "model.layers.0.self_attn.k_proj.weight").floats();
  std::vector<float> v = by_name(hf, "model.layers.0.self_attn.v_proj.weight").floats();
  for (int64_t g = 0; g < 2; ++g)  // rows: [q heads 2g, 2g+1 | k_g | v_g], 4 rows per head
    for (int64_t j = 0; j < 16 * 16; ++j) {
      int64_t r = j / 16, col = j % 16;
      if (r < 8) {
        ASSERT_EQ(got[(g * 16 + r) * 16 + col], q[(g * 8 + r) * 16 + col]);
      }
      if (r < 4) {
        ASSERT_EQ(got[(g * 16 + 8 + r) * 16 + col], k[(g * 4 + r) * 16 + col]);
        ASSERT_EQ(got[(g * 16 + 12 + r) * 16 + col], v[(g * 4 + r) * 16 + col]);
      }
    }
  OwnedTensor up = request("model.decoder.layers.0.mlp.linear_fc1.weight", DType::kF32, {2, 24, 16},
                           {1, 0, 0}, {1, 24, 16});  // [gate; up]: up
  ASSERT_EQ(load_one(dir, &up).code, Code::kOk);
  EXPECT_EQ(up.bytes, by_name(hf, "model.layers.0.mlp.up_proj.weight").bytes);
}

TEST_F(HfImport, HfToLoomToHfIsTheIdentity) {
  fs::path dir = llama_dir("hf_in_identity");
  nlohmann::json meta;
  ASSERT_EQ(metadata(format, dir, &meta).code, Code::kOk);
  std::vector<OwnedTensor> weights;
  for (auto& [name, t] : meta["tensors"].items()) {
    std::vector<int64_t> shape = t["shape"];
    weights.push_back(
        request(name, DType::kF32, shape, std::vector<int64_t>(shape.size(), 0), shape));
  }
  Outcome o = load(format, dir, weights);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  fs::path out = fresh_dir("hf_in_identity_out");
  meta["spec"]["train"] = {{"seq_length", 16}};
  o = save(format, out, weights, meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  checkpoint::SafetensorsReader again(out / "model.safetensors");
  ASSERT_EQ(again.tensors().size(), hf.size());
  for (const OwnedTensor& t : hf) {
    const checkpoint::SafetensorsTensor* e = again.find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(std::memcmp(again.bytes(*e), t.bytes.data(), t.bytes.size()), 0) << t.name;
  }
}

TEST_F(HfImport, Gpt2WithoutBasePrefixAndDefaults) {
  fs::path dir = fresh_dir("hf_in_gpt2");
  write_json(dir / "config.json", {{"model_type", "gpt2"},
                                   {"n_embd", 8},
                                   {"n_layer", 1},
                                   {"n_head", 2},
                                   {"vocab_size", 11},
                                   {"n_positions", 6}});
  std::vector<OwnedTensor> w;  // names as in the GPT2Model checkpoints on the hub
  auto add = [&](const std::string& n, std::vector<int64_t> shape) {
    w.push_back(random_tensor(n, DType::kF32, std::move(shape), rng));
  };
  add("wte.weight", {11, 8});
  add("wpe.weight", {6, 8});
  add("h.0.attn.bias", {1, 1, 6, 6});  // the causal-mask buffer old checkpoints carry
  for (const char* n : {"h.0.ln_1", "h.0.ln_2", "ln_f"}) {
    add(std::string(n) + ".weight", {8});
    add(std::string(n) + ".bias", {8});
  }
  add("h.0.attn.c_attn.weight", {8, 24});
  add("h.0.attn.c_attn.bias", {24});
  add("h.0.attn.c_proj.weight", {8, 8});
  add("h.0.attn.c_proj.bias", {8});
  add("h.0.mlp.c_fc.weight", {8, 32});
  add("h.0.mlp.c_fc.bias", {32});
  add("h.0.mlp.c_proj.weight", {32, 8});
  add("h.0.mlp.c_proj.bias", {8});
  write_hf_weights(dir / "model.safetensors", w);
  nlohmann::json meta;
  Outcome o = metadata(format, dir, &meta);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  const nlohmann::json& m = meta["spec"]["model"];
  EXPECT_EQ(m["position_embedding"], "learned");
  EXPECT_EQ(m["ffn_hidden_size"], 32);  // n_inner absent: 4 * n_embd
  EXPECT_EQ(m["tie_embeddings"], true);
  EXPECT_EQ(m["add_bias_linear"], true);
  EXPECT_EQ(m["layer"]["mlp"]["activation"], "gelu_tanh");
  EXPECT_EQ(m["layer"]["norm"], (nlohmann::json{{"impl", "layernorm"}, {"eps", 1e-5}}));
  EXPECT_FALSE(m.contains("rotary"));
  EXPECT_FALSE(meta["tensors"].contains("model.output_layer.weight"));
  OwnedTensor fc1 = request("model.decoder.layers.0.mlp.linear_fc1.weight", DType::kF32, {32, 8},
                            {0, 0}, {32, 8});
  o = load_one(dir, &fc1);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  std::vector<float> got = fc1.floats(), c_fc = by_name(w, "h.0.mlp.c_fc.weight").floats();
  for (int64_t f = 0; f < 32; ++f)
    for (int64_t k = 0; k < 8; ++k) ASSERT_EQ(got[f * 8 + k], c_fc[k * 32 + f]);
}

TEST_F(HfImport, ShardedIndex) {
  fs::path dir = llama_dir("hf_in_index");
  fs::remove(dir / "model.safetensors");
  std::vector<OwnedTensor> first(hf.begin(), hf.begin() + 5), second(hf.begin() + 5, hf.end());
  write_hf_weights(dir / "model-00001-of-00002.safetensors", first);
  write_hf_weights(dir / "model-00002-of-00002.safetensors", second);
  nlohmann::json map = nlohmann::json::object();
  for (const OwnedTensor& t : first) map[t.name] = "model-00001-of-00002.safetensors";
  for (const OwnedTensor& t : second) map[t.name] = "model-00002-of-00002.safetensors";
  write_json(dir / "model.safetensors.index.json",
             {{"metadata", {{"total_size", 1}}}, {"weight_map", map}});
  std::string d = dir.string();
  EXPECT_TRUE(format->recognizes({d.data(), d.size()}));
  OwnedTensor out = request("model.output_layer.weight", DType::kF32, {13, 16}, {0, 0}, {13, 16});
  Outcome o = load_one(dir, &out);
  ASSERT_EQ(o.code, Code::kOk) << o.message;
  EXPECT_EQ(out.bytes, by_name(hf, "lm_head.weight").bytes);
  map["lm_head.weight"] = "model-00001-of-00002.safetensors";  // not where it is
  write_json(dir / "model.safetensors.index.json", {{"weight_map", map}});
  o = load_one(dir, &out);
  EXPECT_EQ(o.code, Code::kDataLoss);
  EXPECT_NE(o.message.find("model.safetensors.index.json"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("'lm_head.weight'"), std::string::npos) << o.message;
}

TEST_F(HfImport, ErrorsNameTheFileAndTensor) {
  fs::path dir = llama_dir("hf_in_errors");
  OwnedTensor qkv = request("model.decoder.layers.0.self_attention.linear_qkv.weight", DType::kF32,
                            {32, 16}, {0, 0}, {32, 16});
  // A tensor with the wrong shape, then a missing one.
  std::vector<OwnedTensor> broken = hf;
  broken[3] = random_tensor("model.layers.0.self_attn.k_proj.weight", DType::kF32, {4, 16}, rng);
  write_hf_weights(dir / "model.safetensors", broken);
  Outcome o = load_one(dir, &qkv);
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_NE(o.message.find("'model.layers.0.self_attn.k_proj.weight' has shape [4, 16]"),
            std::string::npos)
      << o.message;
  EXPECT_NE(o.message.find("model.safetensors"), std::string::npos) << o.message;
  broken.erase(broken.begin() + 3);
  write_hf_weights(dir / "model.safetensors", broken);
  o = load_one(dir, &qkv);
  EXPECT_EQ(o.code, Code::kNotFound);
  EXPECT_NE(o.message.find("'model.layers.0.self_attn.k_proj.weight'"), std::string::npos);
  // A request of another shape.
  OwnedTensor wide =
      request("model.embedding.word_embeddings.weight", DType::kF32, {14, 16}, {0, 0}, {14, 16});
  o = load_one(dir, &wide);
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_NE(o.message.find("[13, 16]"), std::string::npos) << o.message;
  // A truncated safetensors file.
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 3);
  o = load_one(dir, &wide);
  EXPECT_EQ(o.code, Code::kDataLoss);
  EXPECT_NE(o.message.find("model.safetensors"), std::string::npos) << o.message;
  // pickles are not read; config.json is required.
  fs::remove(dir / "model.safetensors");
  std::ofstream(dir / "pytorch_model.bin") << "pickle";
  o = load_one(dir, &wide);
  EXPECT_EQ(o.code, Code::kUnimplemented);
  EXPECT_NE(o.message.find("pytorch_model.bin"), std::string::npos) << o.message;
  fs::remove(dir / "config.json");
  nlohmann::json meta;
  o = metadata(format, dir, &meta);
  EXPECT_EQ(o.code, Code::kNotFound);
  EXPECT_NE(o.message.find("config.json"), std::string::npos) << o.message;
}

TEST_F(HfImport, RefusesConfigsLoomCannotRepresent) {
  const std::pair<std::function<void(nlohmann::json&)>, const char*> cases[] = {
      {[](auto& c) { c["model_type"] = "mistral"; }, "model_type"},
      {[](auto& c) { c["hidden_act"] = "gelu"; }, "hidden_act"},
      {[](auto& c) {
         c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       "rope_scaling"},
      {[](auto& c) { c["head_dim"] = 8; }, "head_dim"},
      {[](auto& c) { c["attention_bias"] = true; }, "attention_bias"},
      {[](auto& c) { c["mlp_bias"] = true; }, "mlp_bias"},
  };
  for (const auto& [change, key] : cases) {
    fs::path dir = llama_dir("hf_in_refused");
    nlohmann::json config = llama_config();
    change(config);
    write_json(dir / "config.json", config);
    nlohmann::json meta;
    Outcome o = metadata(format, dir, &meta);
    EXPECT_EQ(o.code, Code::kUnimplemented) << key << ": " << o.message;
    EXPECT_NE(o.message.find(std::string("config.json: ") + key), std::string::npos) << o.message;
  }
  fs::path dir = llama_dir("hf_in_gpt2_refused");
  write_json(dir / "config.json",
             {{"model_type", "gpt2"}, {"scale_attn_by_inverse_layer_idx", true}});
  nlohmann::json meta;
  Outcome o = metadata(format, dir, &meta);
  EXPECT_EQ(o.code, Code::kUnimplemented);
  EXPECT_NE(o.message.find("scale_attn_by_inverse_layer_idx"), std::string::npos) << o.message;
  write_json(dir / "config.json", {{"model_type", "llama"}, {"num_attention_heads", "four"}});
  o = metadata(format, dir, &meta);
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_NE(o.message.find("num_attention_heads"), std::string::npos) << o.message;
  // A layer count no model has is refused before the layout is built layer by layer.
  nlohmann::json huge = llama_config();
  huge["num_hidden_layers"] = int64_t{1} << 40;
  write_json(dir / "config.json", huge);
  o = metadata(format, dir, &meta);
  std::printf("%s\n", o.message.c_str());
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_NE(o.message.find("num_hidden_layers = 1099511627776 is beyond any model"),
            std::string::npos)
      << o.message;
}

}  // namespace
}  // namespace loom::testing
