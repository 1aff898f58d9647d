// The safetensors format exporting loom weights as Hugging Face GPT-2 and LLaMA
// directories: names and layouts (checked element by element against the transformers
// conventions), config.json, the dtype option, loom -> HF -> loom being the identity, and
// the refusal (naming the spec field) of models neither architecture can express.
#include <gtest/gtest.h>
#include <loom/cpp/half.h>

#include <fstream>
#include <set>

#include "plugins/checkpoint/safetensors_file.h"
#include "tests/plugins/checkpoint/hf_fixtures.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;
using checkpoint::SafetensorsReader;


class HfExport : public ::testing::Test {
 protected:
  // Saves `weights` (plus an optimizer state, which the export drops) with `spec`.
  Outcome export_to(const fs::path& dir, std::vector<OwnedTensor> weights,
                    const nlohmann::json& spec, Format* f = nullptr) {
    std::vector<OwnedTensor> all = weights;
    all.push_back(
        random_tensor("optim.exp_avg.embedding.word_embeddings.weight", DType::kF32, {3}, rng));
    return save(f != nullptr ? *f : format, dir, all, metadata_for(all, spec));
  }
  // Loads every weight back by its loom name and compares the bytes.
  void expect_identity(const fs::path& dir, const std::vector<OwnedTensor>& weights) {
    std::vector<OwnedTensor> back;
    for (const OwnedTensor& t : weights)
      back.push_back(request(t.name, t.dtype, t.global_shape, t.offset, t.shape));
    Outcome o = load(format, dir, back);
    ASSERT_EQ(o.code, Code::kOk) << o.message;
    for (size_t i = 0; i < weights.size(); ++i)
      EXPECT_EQ(back[i].bytes, weights[i].bytes) << weights[i].name;
  }

  CheckpointEnv env;
  Format format = env.format({{"impl", "safetensors"}});
  std::mt19937 rng{42};
};

TEST_F(HfExport, Gpt2NamesLayoutConfigAndRoundTrip) {
  Tiny m;  // C 8, H 2, F 32, V 11, P 6, 2 layers, tied
  fs::path dir = fresh_dir("hf_gpt2");
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  nlohmann::json spec = tiny_spec(m);
  spec["data"] = {{"eod_id", 3}};
  Outcome o = export_to(dir, w, spec);
  ASSERT_EQ(o.code, Code::kOk) << o.message;

  nlohmann::json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], nlohmann::json({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_embd"], 8);
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["n_head"], 2);
  EXPECT_EQ(config["n_inner"], 32);
  EXPECT_EQ(config["n_positions"], 6);
  EXPECT_EQ(config["vocab_size"], 11);
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["eos_token_id"], 3);
  EXPECT_EQ(read_json(dir / "generation_config.json")["eos_token_id"], 3);

  SafetensorsReader file(dir / "model.safetensors");
  std::set<std::string> names, want = {"transformer.wte.weight", "transformer.wpe.weight",
                                       "transformer.ln_f.weight", "transformer.ln_f.bias"};
  for (const auto& [name, t] : file.tensors()) names.insert(name);
  for (int i = 0; i < 2; ++i)
    for (const char* part :
         {"ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})
      for (const char* p : {"weight", "bias"})
        want.insert("transformer.h." + std::to_string(i) + "." + part + "." + p);
  EXPECT_EQ(names, want);  // no lm_head when tied, no optimizer state
  EXPECT_EQ(file.find("transformer.h.0.attn.c_attn.weight")->shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(file.find("transformer.h.1.mlp.c_proj.weight")->shape, (std::vector<int64_t>{32, 8}));

  // c_attn (C, 3C): column part*C + head*D + j is loom's row (3*head + part)*D + j.
  const int64_t c = 8, d = 4;
  std::vector<float> qkv =
      by_name(w, "model.decoder.layers.1.self_attention.linear_qkv.weight").floats();
  std::vector<float> qkv_b =
      by_name(w, "model.decoder.layers.1.self_attention.linear_qkv.bias").floats();
  std::vector<float> c_attn = hf_floats(file, "transformer.h.1.attn.c_attn.weight");
  std::vector<float> c_attn_b = hf_floats(file, "transformer.h.1.attn.c_attn.bias");
  for (int64_t head = 0; head < 2; ++head)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t j = 0; j < d; ++j) {
        int64_t row = (3 * head + part) * d + j, col = part * c + head * d + j;
        EXPECT_EQ(c_attn_b[col], qkv_b[row]);
        for (int64_t k = 0; k < c; ++k) ASSERT_EQ(c_attn[k * 3 * c + col], qkv[row * c + k]);
      }
  // Conv1D weights are the transpose of loom's (out, in).
  std::vector<float> fc1 = by_name(w, "model.decoder.layers.0.mlp.linear_fc1.weight").floats();
  std::vector<float> c_fc = hf_floats(file, "transformer.h.0.mlp.c_fc.weight");
  for (int64_t f = 0; f < 32; ++f)
    for (int64_t k = 0; k < c; ++k) ASSERT_EQ(c_fc[k * 32 + f], fc1[f * c + k]);

  nlohmann::json meta;
  ASSERT_EQ(metadata(format, dir, &meta).code, Code::kOk);
  EXPECT_EQ(meta["iteration"], 7);
  EXPECT_EQ(meta["spec"], spec);
  EXPECT_EQ(meta["tensors"].size(), w.size());  // model weights only
  EXPECT_FALSE(meta["tensors"].contains("optim.exp_avg.embedding.word_embeddings.weight"));
  EXPECT_EQ(meta["format"]["architecture"], "GPT2LMHeadModel");
  expect_identity(dir, w);

  std::string d_text = dir.string();
  EXPECT_TRUE(format->recognizes({d_text.data(), d_text.size()}));
  EXPECT_FALSE(env.format({{"impl", "sharded"}})->recognizes({d_text.data(), d_text.size()}));
  // Optimizer state is not there.
  std::vector<OwnedTensor> state = {
      request("optim.exp_avg.embedding.word_embeddings.weight", DType::kF32, {3}, {0}, {3})};
  o = load(format, dir, state);
  EXPECT_EQ(o.code, Code::kNotFound);
  EXPECT_NE(o.message.find("model weights only"), std::string::npos) << o.message;
  // A slice of the fused QKV weight (another TP layout) loads too.
  std::vector<OwnedTensor> half = {
      request("model.decoder.layers.1.self_attention.linear_qkv.weight", DType::kF32, {24, 8},
              {12, 0}, {12, 8})};
  ASSERT_EQ(load(format, dir, half).code, Code::kOk);
  EXPECT_EQ(half[0].bytes,
            slice_of(by_name(w, "model.decoder.layers.1.self_attention.linear_qkv.weight"), {12, 0},
                     {12, 8})
                .bytes);
}

TEST_F(HfExport, Gpt2Untied) {
  Tiny m;
  m.tied = false;
  m.l = 1;
  fs::path dir = fresh_dir("hf_gpt2_untied");
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF16, rng);
  ASSERT_EQ(export_to(dir, w, tiny_spec(m)).code, Code::kOk);
  SafetensorsReader file(dir / "model.safetensors");
  ASSERT_NE(file.find("lm_head.weight"), nullptr);
  EXPECT_EQ(file.find("lm_head.weight")->st_dtype, "F16");
  EXPECT_EQ(read_json(dir / "config.json")["tie_word_embeddings"], false);
  EXPECT_EQ(read_json(dir / "config.json")["torch_dtype"], "float16");
  EXPECT_EQ(read_json(dir / "config.json")["eos_token_id"], nullptr);
  EXPECT_FALSE(fs::exists(dir / "generation_config.json"));
  expect_identity(dir, w);
}

TEST_F(HfExport, LlamaGroupedQueryLayoutAndRoundTrip) {
  Tiny m;
  m.llama = true;
  m.c = 16, m.h = 4, m.g = 2, m.f = 24, m.v = 13, m.p = 32, m.tied = false;
  fs::path dir = fresh_dir("hf_llama");
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kBF16, rng);
  nlohmann::json spec = tiny_spec(m);
  spec["model"]["rotary"] = {
      {"base", 500000}, {"percent", 1.0}, {"scaling", {{"type", "linear"}, {"factor", 2}}}};
  Outcome o = export_to(dir, w, spec);
  ASSERT_EQ(o.code, Code::kOk) << o.message;

  nlohmann::json config = read_json(dir / "config.json");
  EXPECT_EQ(config["architectures"], nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(config["hidden_size"], 16);
  EXPECT_EQ(config["intermediate_size"], 24);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["max_position_embeddings"], 32);
  EXPECT_EQ(config["rope_theta"], 500000.0);
  EXPECT_EQ(config["rope_scaling"], (nlohmann::json{{"type", "linear"}, {"factor", 2.0}}));
  EXPECT_EQ(config["hidden_act"], "silu");
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_FALSE(config.contains("head_dim"));

  SafetensorsReader file(dir / "model.safetensors");
  EXPECT_EQ(file.tensors().size(), 3 + 2 * 9u);  // embed, norm, lm_head + 9 per layer
  ASSERT_NE(file.find("lm_head.weight"), nullptr);
  EXPECT_EQ(file.find("model.layers.0.self_attn.k_proj.weight")->shape,
            (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(file.find("model.layers.0.mlp.gate_proj.weight")->st_dtype, "BF16");
  // Grouped rows: per group g, [2 query heads | k_g | v_g], each head D = 4 rows.
  const int64_t c = 16, d = 4, per = 2;
  std::vector<float> qkv =
      by_name(w, "model.decoder.layers.1.self_attention.linear_qkv.weight").floats();
  std::vector<float> q = hf_floats(file, "model.layers.1.self_attn.q_proj.weight");
  std::vector<float> k = hf_floats(file, "model.layers.1.self_attn.k_proj.weight");
  std::vector<float> v = hf_floats(file, "model.layers.1.self_attn.v_proj.weight");
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t col = 0; col < c; ++col) {
      int64_t base = g * (per + 2) * d;
      for (int64_t j = 0; j < per * d; ++j)
        ASSERT_EQ(q[(g * per * d + j) * c + col], qkv[(base + j) * c + col]);
      for (int64_t j = 0; j < d; ++j) {
        ASSERT_EQ(k[(g * d + j) * c + col], qkv[(base + per * d + j) * c + col]);
        ASSERT_EQ(v[(g * d + j) * c + col], qkv[(base + (per + 1) * d + j) * c + col]);
      }
    }
  std::vector<float> fc1 = by_name(w, "model.decoder.layers.0.mlp.linear_fc1.weight").floats();
  std::vector<float> gate = hf_floats(file, "model.layers.0.mlp.gate_proj.weight");
  std::vector<float> up = hf_floats(file, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(std::vector<float>(fc1.begin(), fc1.begin() + 24 * 16), gate);
  EXPECT_EQ(std::vector<float>(fc1.begin() + 24 * 16, fc1.end()), up);
  expect_identity(dir, w);
}

TEST_F(HfExport, DamagedDataIsDetected) {
  Tiny m;
  m.l = 1;
  fs::path dir = fresh_dir("hf_damaged");
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  ASSERT_EQ(export_to(dir, w, tiny_spec(m)).code, Code::kOk);
  uint64_t at = 0;
  {
    SafetensorsReader file(dir / "model.safetensors");
    uint64_t data_size = 0;  // the data section ends the file
    for (const auto& [name, t] : file.tensors()) data_size = std::max(data_size, t.end);
    at = fs::file_size(dir / "model.safetensors") - data_size +
         file.find("transformer.h.0.mlp.c_fc.weight")->begin + 9;
  }
  std::string bytes;
  {
    std::ifstream in(dir / "model.safetensors", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[at] ^= 0x01;
  std::ofstream(dir / "model.safetensors", std::ios::binary | std::ios::trunc) << bytes;
  const OwnedTensor& fc1 = by_name(w, "model.decoder.layers.0.mlp.linear_fc1.weight");
  std::vector<OwnedTensor> back = {
      request(fc1.name, DType::kF32, fc1.global_shape, {0, 0}, fc1.shape)};
  Outcome o = load(format, dir, back);
  EXPECT_EQ(o.code, Code::kDataLoss);
  EXPECT_NE(o.message.find("model.safetensors: tensor 'transformer.h.0.mlp.c_fc.weight' (loom's "
                           "'model.decoder.layers.0.mlp.linear_fc1.weight') fails its CRC-32C"),
            std::string::npos)
      << o.message;
  std::vector<OwnedTensor> other = {
      request("model.decoder.final_layernorm.weight", DType::kF32, {8}, {0}, {8})};
  EXPECT_EQ(load(format, dir, other).code, Code::kOk);
}

TEST_F(HfExport, DtypeOptionCastsOnExport) {
  Tiny m;
  m.l = 1;
  fs::path dir = fresh_dir("hf_bf16");
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  Format bf16 = env.format({{"impl", "safetensors"}, {"dtype", "bf16"}});
  ASSERT_EQ(export_to(dir, w, tiny_spec(m), &bf16).code, Code::kOk);
  SafetensorsReader file(dir / "model.safetensors");
  for (const auto& [name, t] : file.tensors()) EXPECT_EQ(t.st_dtype, "BF16") << name;
  EXPECT_EQ(read_json(dir / "config.json")["torch_dtype"], "bfloat16");
  nlohmann::json meta;
  ASSERT_EQ(metadata(format, dir, &meta).code, Code::kOk);
  EXPECT_EQ(meta["tensors"]["model.embedding.word_embeddings.weight"]["dtype"], "bf16");
  const OwnedTensor& fc2 = by_name(w, "model.decoder.layers.0.mlp.linear_fc2.weight");
  std::vector<OwnedTensor> back = {
      request(fc2.name, DType::kF32, fc2.global_shape, {0, 0}, fc2.shape)};
  ASSERT_EQ(load(format, dir, back).code, Code::kOk);
  std::vector<float> got = back[0].floats(), want = fc2.floats();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], bf16_to_f32(f32_to_bf16(want[i])));
  EXPECT_THROW(env.format({{"impl", "safetensors"}, {"dtype", "fp8"}}), std::exception);
}

TEST_F(HfExport, RefusesWhatNeitherArchitectureExpresses) {
  Tiny gpt;
  gpt.l = 1;
  Tiny llama = gpt;
  llama.llama = true;
  struct Case {
    Tiny model;
    std::function<void(nlohmann::json&)> change;
    const char* field;
  };
  const Case cases[] = {
      {gpt, [](auto& s) { s["layer"]["mlp"]["activation"] = "swiglu"; }, "/layer/mlp/activation"},
      {llama,
       [](auto& s) {
         s["layer"]["norm"]["impl"] = "layernorm";
         s["final_norm"]["impl"] = "layernorm";
       },
       "/layer/norm/impl"},
      {llama, [](auto& s) { s["rotary"]["percent"] = 0.5; }, "/rotary/percent"},
      {llama, [](auto& s) { s["rotary"]["scaling"]["type"] = "yarn"; }, "/rotary/scaling/type"},
      {gpt,
       [](auto& s) {
         s["layer"]["mlp"] = {{"impl", "moe"}, {"num_experts", 4}};
       },
       "/layer/mlp"},
      {gpt, [](auto& s) { s["kv_channels"] = 8; }, "/kv_channels"},
      {gpt, [](auto& s) { s["position_embedding"] = "none"; }, "/position_embedding"},
      {gpt, [](auto& s) { s["num_query_groups"] = 1; }, "/num_query_groups"},
      {llama,  // q/k/v biases alone are Qwen2; with qk_layernorm (Qwen3) they are refused
       [](auto& s) {
         s["add_qkv_bias"] = true;
         s["qk_layernorm"] = true;
       },
       "/add_qkv_bias"},
      {gpt, [](auto& s) { s["layer"]["norm"]["zero_centered_gamma"] = true; },
       "/layer/norm/zero_centered_gamma"},
      {gpt, [](auto& s) { s["final_norm"]["eps"] = 1e-6; }, "/final_norm/eps"},
      {gpt, [](auto& s) { s["layer"]["qk_layernorm"] = true; }, "/layer/qk_layernorm"},
      {gpt, [](auto& s) { s["layer"]["attention"]["softmax_scale"] = 0.5; },
       "/layer/attention/softmax_scale"},
      {gpt, [](auto& s) { s["impl"] = "mamba_hybrid"; }, "/impl"},
  };
  for (const Case& c : cases) {
    nlohmann::json spec = tiny_spec(c.model);
    c.change(spec["model"]);
    Outcome o = export_to(fresh_dir("hf_refused"), tiny_weights(c.model, DType::kF32, rng), spec);
    EXPECT_EQ(o.code, Code::kUnimplemented) << c.field << ": " << o.message;
    EXPECT_NE(o.message.find(std::string("spec /model") + c.field), std::string::npos) << o.message;
  }
}

TEST_F(HfExport, RefusesWeightsThatDoNotFitTheSpec) {
  Tiny m;
  m.l = 1;
  nlohmann::json spec = tiny_spec(m);
  std::vector<OwnedTensor> w = tiny_weights(m, DType::kF32, rng);
  // A tensor-parallel slice.
  std::vector<OwnedTensor> sliced = w;
  sliced[0] = slice_of(w[0], {0, 0}, {5, 8});
  Outcome o = save(format, fresh_dir("hf_slice"), sliced, metadata_for(w, spec));
  EXPECT_EQ(o.code, Code::kUnimplemented);
  EXPECT_NE(o.message.find("whole on rank 0"), std::string::npos) << o.message;
  // A missing weight, an extra one, a wrong shape.
  std::vector<OwnedTensor> fewer(w.begin() + 1, w.end());
  o = save(format, fresh_dir("hf_fewer"), fewer, metadata_for(fewer, spec));
  EXPECT_EQ(o.code, Code::kNotFound);
  EXPECT_NE(o.message.find("'model.embedding.word_embeddings.weight'"), std::string::npos);
  std::vector<OwnedTensor> more = w;
  more.push_back(random_tensor("model.decoder.layers.0.self_attention.q_layernorm.weight",
                               DType::kF32, {4}, rng));
  o = save(format, fresh_dir("hf_more"), more, metadata_for(more, spec));
  EXPECT_EQ(o.code, Code::kUnimplemented);
  EXPECT_NE(o.message.find("q_layernorm"), std::string::npos) << o.message;
  spec["model"]["vocab_size"] = 12;
  o = save(format, fresh_dir("hf_shape"), w, metadata_for(w, spec));
  EXPECT_EQ(o.code, Code::kInvalidArgument);
  EXPECT_NE(o.message.find("[11, 8]"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("[12, 8]"), std::string::npos) << o.message;
  // Only rank 0 writes.
  fs::path rank1 = fresh_dir("hf_rank1");
  EXPECT_EQ(save(format, rank1, w, metadata_for(w, tiny_spec(m)), 1, 2).code, Code::kOk);
  EXPECT_TRUE(fs::is_empty(rank1));
}

}  // namespace
}  // namespace loom::testing
