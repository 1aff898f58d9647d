// `loom train` and `loom bench` end to end with the shipped plugins and the CPU kernels:
// a tiny model learns, logs and writes metrics; bad shapes are refused with the pointer
// and the rule broken before anything runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/version.h"
#include "tests/util/test_plugins.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::read_file;
using testing::run_loom;
using testing::write_file;

constexpr int kOk = 0, kSpec = 3;

nlohmann::json tiny_spec() {
  return nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "vocab_size": 64, "max_position_embeddings": 32,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.01},
    "lr_schedule": {"impl": "cosine", "warmup_steps": 5},
    "data": {"mock": true},
    "train": {"steps": 40, "micro_batch_size": 4, "seq_length": 16, "log_interval": 10,
              "eval_interval": 20, "eval_steps": 2}
  })");
}

class TrainTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fresh_dir("train_test"); }
  fs::path spec(const std::string& name, const nlohmann::json& body) {
    fs::path p = dir_ / name;
    write_file(p, body.dump(2));
    return p;
  }
  static std::string q(const fs::path& p) { return "'" + p.string() + "'"; }
  // Trains `s` into dir_/NAME (with the plugins under `plugins` too, when given) and returns
  // the metrics lines that carry a loss; its standard output into `out` when not null.
  std::vector<nlohmann::json> train_steps(const nlohmann::json& s, const std::string& name,
                                          const fs::path& plugins = {}, std::string* out = nullptr);
  fs::path dir_;
};

std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::stringstream lines(read_file(path));
  std::string line;
  while (std::getline(lines, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<nlohmann::json> TrainTest::train_steps(const nlohmann::json& s, const std::string& name,
                                                   const fs::path& plugins, std::string* out) {
  fs::path run = dir_ / name;
  auto r = run_loom("train " + q(spec(name + ".json", s)) + " --run-dir " + q(run),
                    plugins.empty() ? std::string() : "LOOM_PLUGIN_PATH=" + q(plugins));
  EXPECT_EQ(r.exit_code, kOk) << name << "\n" << r.out << r.err;
  if (out != nullptr) *out = r.out;
  std::vector<nlohmann::json> steps;
  if (fs::exists(run / "metrics.jsonl"))
    for (const auto& m : read_jsonl(run / "metrics.jsonl"))
      if (m.contains("loss")) steps.push_back(m);
  return steps;
}

// Two runs logged the same losses and gradient norms at each of `n` steps, to the last bit.
void expect_same_steps(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b,
                       size_t n) {
  ASSERT_EQ(a.size(), n);
  ASSERT_EQ(b.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << i;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << i;
  }
}

TEST_F(TrainTest, TinyGptLearnsAndLogs) {
  fs::path run = dir_ / "run";
  auto r = run_loom("train " + q(spec("tiny.json", tiny_spec())) + " --run-dir " + q(run));
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("model: gpt, "));
  EXPECT_THAT(r.out, HasSubstr("kernels: "));
  EXPECT_THAT(r.out, HasSubstr("gemm:f32=cpu."));
  EXPECT_THAT(r.out, HasSubstr("iter     40/40 | loss "));
  EXPECT_THAT(r.out, HasSubstr("MFU"));
  EXPECT_THAT(r.out, HasSubstr("validation at iter 40"));
  auto metrics = read_jsonl(run / "metrics.jsonl");
  std::vector<double> losses, valid;
  for (const auto& m : metrics) {
    if (m.contains("loss")) losses.push_back(m["loss"].get<double>());
    if (m.contains("valid_loss")) valid.push_back(m["valid_loss"].get<double>());
    if (m.contains("loss")) {
      EXPECT_GT(m["tokens_per_s"].get<double>(), 0);
      EXPECT_GT(m["mfu"].get<double>(), 0);
      EXPECT_GT(m["peak_mem_bytes"].get<double>(), 0);
    }
  }
  ASSERT_EQ(losses.size(), 4u);
  ASSERT_EQ(valid.size(), 2u);
  // From ln(64) = 4.16 at the start, the Markov tokens (4 successors each) are learnable.
  EXPECT_LT(losses.back(), losses.front() - 0.3);
  EXPECT_LT(valid.back(), 4.0);
  EXPECT_TRUE(fs::exists(run / "spec.resolved.json"));
}

// FP8 training (spec /precision/fp8): the transformer layers' four GEMMs run through
// fp8_gemm on operands quantised by the recipe. Every recipe and format learns, and its loss
// stays near the bf16 run's at every logged step (FP8's error is a few percent per GEMM,
// which training absorbs). Full recomputation reruns the quantisation in backward.
TEST_F(TrainTest, Fp8RecipesTrackTheBf16Run) {
  auto losses_of = [&](const std::string& name, const nlohmann::json& precision,
                       const std::string& recompute = "none") {
    nlohmann::json s = tiny_spec();
    s["precision"] = precision;
    s["train"]["recompute"] = recompute;
    s["train"]["log_interval"] = 5;
    fs::path run = dir_ / name;
    auto r = run_loom("train " + q(spec(name + ".json", s)) + " --run-dir " + q(run));
    EXPECT_EQ(r.exit_code, kOk) << name << "\n" << r.out << r.err;
    if (precision.contains("fp8")) {
      EXPECT_THAT(r.out, HasSubstr("fp8: {")) << name;
      EXPECT_THAT(r.out, HasSubstr("fp8_gemm:fp8_e4m3=cpu.")) << name;
    }
    std::vector<double> losses;
    for (const auto& m : read_jsonl(run / "metrics.jsonl"))
      if (m.contains("loss")) losses.push_back(m["loss"].get<double>());
    return losses;
  };
  std::vector<double> bf16 = losses_of("bf16", {{"params", "bf16"}});
  ASSERT_EQ(bf16.size(), 8u);
  struct Case {
    std::string name;
    nlohmann::json fp8;
    std::string recompute = "none";
  };
  std::vector<Case> cases = {
      {"delayed_hybrid", {{"impl", "delayed"}}},
      {"delayed_e4m3_recent",
       {{"impl", "delayed"},
        {"format", "e4m3"},
        {"amax_history_len", 4},
        {"amax_compute_algo", "most_recent"}}},
      {"tensorwise", {{"impl", "tensorwise"}, {"margin", 1}}},
      {"delayed_full_recompute", {{"impl", "delayed"}}, "full"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<double> fp8 = losses_of(c.name, {{"params", "bf16"}, {"fp8", c.fp8}}, c.recompute);
    ASSERT_EQ(fp8.size(), bf16.size());
    EXPECT_LT(fp8.back(), fp8.front() - 0.3) << "learns";
    // Measured: within 0.7% of bf16 (bf16 itself is within 0.05% of f32).
    double largest = 0;
    for (size_t i = 0; i < fp8.size(); ++i) {
      EXPECT_NEAR(fp8[i], bf16[i], 0.015 * bf16[i]) << "logged step " << i;
      largest = std::max(largest, std::fabs(fp8[i] - bf16[i]));
    }
    EXPECT_GT(largest, 1e-3) << "the FP8 GEMMs ran (the losses are not bf16's)";
  }
}

// Under delayed scaling a swiglu MLP quantises fc2's input and fc1's output gradient in
// swiglu's own kernels (swiglu_fp8_fwd / _bwd), and a rope layer turns its QKV output gradient
// back inside the quantisation (rope_fp8_bwd): the same bits as the unfused ops, so the run is
// the pinned-off run's to the last bit: every step's loss and gradient norm, and the saved
// checkpoint (every parameter, the optimizer's moments and the amax history). With q, k, v as
// views of one tensor (MHA) and with merged copies (GQA).
// Two run directories hold the same checkpoint tensors, file by file (their JSON metadata may
// carry times); returns how many files were compared.
size_t expect_same_checkpoints(const fs::path& a, const fs::path& b) {
  size_t compared = 0;
  for (const auto& e : fs::recursive_directory_iterator(a)) {
    if (!e.is_regular_file() || e.path().extension() == ".json" ||
        e.path().extension() == ".jsonl" || e.path().extension() == ".log")
      continue;
    const fs::path rel = fs::relative(e.path(), a);
    if (rel.begin()->string().rfind("checkpoint", 0) != 0) continue;
    EXPECT_TRUE(fs::exists(b / rel)) << rel;
    if (!fs::exists(b / rel)) continue;
    EXPECT_EQ(read_file(e.path()), read_file(b / rel)) << rel << " differs";
    ++compared;
  }
  EXPECT_GT(compared, 0u) << "no checkpoint tensors found under " << a;
  return compared;
}

// The tiny model as a LLaMA (rmsnorm, swiglu, rope, no biases) in bf16 with the FP8 recipe
// `fp8`: 6 steps, each logged, validation at steps 3 and 6.
nlohmann::json llama_fp8_spec(const nlohmann::json& fp8) {
  nlohmann::json s = tiny_spec();
  s["model"]["layer"]["norm"] = {{"impl", "rmsnorm"}};
  s["model"]["final_norm"] = {{"impl", "rmsnorm"}};
  s["model"]["layer"]["mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  s["model"]["add_bias_linear"] = false;
  s["model"]["position_embedding"] = "rope";
  s["precision"] = {{"params", "bf16"}, {"fp8", fp8}};
  s["train"]["steps"] = 6;
  s["train"]["log_interval"] = 1;
  s["train"]["eval_interval"] = 3;
  return s;
}

TEST_F(TrainTest, Fp8FusedQuantisationsGiveTheUnfusedKernelsBits) {
  for (int groups : {4, 2}) {
    SCOPED_TRACE("query groups " + std::to_string(groups));
    const std::string tag = "g" + std::to_string(groups) + "_";
    auto train = [&](const std::string& name, bool pinned, std::string* out) {
      nlohmann::json s = llama_fp8_spec({{"impl", "delayed"}, {"amax_history_len", 4}});
      s["model"]["num_query_groups"] = groups;
      if (pinned)
        s["kernels"] = {
            {"pin",
             {{"swiglu_fp8_fwd", "none"}, {"swiglu_fp8_bwd", "none"}, {"rope_fp8_bwd", "none"}}}};
      return train_steps(s, tag + name, {}, out);
    };
    std::string fused_out, pinned_out;
    std::vector<nlohmann::json> fused = train("fused", false, &fused_out);
    std::vector<nlohmann::json> pinned = train("pinned", true, &pinned_out);
    for (const char* op : {"swiglu_fp8_fwd", "swiglu_fp8_bwd", "rope_fp8_bwd"}) {
      EXPECT_THAT(fused_out, HasSubstr(std::string(op) + ":bf16=cpu."));
      EXPECT_THAT(pinned_out, Not(HasSubstr(std::string(op) + ":bf16=cpu.")));
    }
    expect_same_steps(fused, pinned, 6);
    const size_t compared =
        expect_same_checkpoints(dir_ / (tag + "fused"), dir_ / (tag + "pinned"));
    std::printf(
        "fp8 swiglu and rope, %d query groups: 6 steps and %zu checkpoint files bit-identical "
        "with the ops pinned off\n",
        groups, compared);
  }
}

// FP8 weights kept across micro-batches (/precision/fp8_weight_cache, on by default;
// IForwardContext::param_version): with 4 micro-batches a step each FP8 weight is quantised
// in the step's first forward and read from its copy by the rest. The parameters and the
// scales do not change within a step, so the run is the run that quantises in every
// micro-batch, to the last bit: every step's loss and gradient norm, the validation between
// steps (which quantises the weights of the moment, keeping nothing) and the saved checkpoint
// (parameters, moments, amax history). With delayed and current (tensorwise) scaling, and
// under full recomputation (whose reruns in backward read the copies too). The module test
// tests/plugins/transformer:fp8_weight_cache_test shows that the copies are read.
TEST_F(TrainTest, Fp8WeightsKeptAcrossMicroBatchesGiveTheSameBits) {
  struct Case {
    std::string name;
    nlohmann::json fp8;
    std::string recompute;
  };
  const std::vector<Case> cases = {
      {"delayed", {{"impl", "delayed"}, {"amax_history_len", 4}}, "none"},
      {"delayed_full", {{"impl", "delayed"}, {"amax_history_len", 4}}, "full"},
      {"tensorwise", {{"impl", "tensorwise"}}, "none"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto train = [&](bool cache, std::string* out) {
      nlohmann::json s = llama_fp8_spec(c.fp8);  // evaluation between steps reads no kept weight
      s["precision"]["fp8_weight_cache"] = cache;
      s["train"]["micro_batch_size"] = 2;
      s["train"]["global_batch_size"] = 8;
      s["train"]["recompute"] = c.recompute;
      return train_steps(s, c.name + (cache ? "_kept" : "_each"), {}, out);
    };
    std::string kept_out, each_out;
    std::vector<nlohmann::json> kept = train(true, &kept_out);
    std::vector<nlohmann::json> each = train(false, &each_out);
    const std::string banner = "weights quantised once a step, kept for its 4 micro-batches";
    EXPECT_THAT(kept_out, HasSubstr(banner));
    EXPECT_THAT(each_out, Not(HasSubstr(banner)));
    expect_same_steps(kept, each, 6);
    auto valid_losses = [&](const std::string& name) {
      std::vector<double> v;
      for (const auto& m : read_jsonl(dir_ / name / "metrics.jsonl"))
        if (m.contains("valid_loss")) v.push_back(m["valid_loss"].get<double>());
      return v;
    };
    const std::vector<double> valid = valid_losses(c.name + "_kept");
    EXPECT_EQ(valid.size(), 2u) << "validation at steps 3 and 6";
    EXPECT_EQ(valid, valid_losses(c.name + "_each"));
    const size_t compared =
        expect_same_checkpoints(dir_ / (c.name + "_kept"), dir_ / (c.name + "_each"));
    std::printf(
        "fp8 %s, recompute %s: 6 steps of 4 micro-batches and %zu checkpoint files "
        "bit-identical with the weights quantised in every micro-batch\n",
        c.name.c_str(), c.recompute.c_str(), compared);
  }
}

// The projections' and the MLP's weight gradients (kParamGradOverwrite) are overwritten by
// their first write of a step (grad_first_write: a GEMM with beta 0) instead of added to the
// zero fill. Over two micro-batches a step, a run gives the bits of the run where every write
// adds (LOOM_GRAD_FIRST_WRITE=off), and keeps them when those gradients hold NaN instead of
// zeros before each step (LOOM_TEST_FAULT=poison_overwrite): so each first write overwrote,
// and no later one did. The poisoned run with every write adding does not keep them (the
// check can fail). Five models: GELU with biases in f32 (the bias-gradient GEMM epilogue; an
// untied output layer whose gradient multi-token prediction writes first); a bf16 swiglu /
// rope model with delayed FP8 (the FP8 weight-gradient GEMMs); a Mamba-2 hybrid (the mixer's
// in and out projections); multi-latent attention with a mixture of experts and shared
// experts (MLA's five projections, one of them written by two GEMMs, the shared experts'
// fc1 and fc2, the routed experts' grouped GEMMs); and the experts' GEMMs one by one.
TEST_F(TrainTest, WeightGradientsFirstWriteOfAStepOverwritesThem) {
  for (const std::string model : {"f32", "fp8", "mamba", "mla", "moe"}) {
    SCOPED_TRACE(model);
    nlohmann::json s = tiny_spec();
    s["train"]["steps"] = 4;
    s["train"]["log_interval"] = 1;
    s["train"]["eval_interval"] = 2;
    s["train"]["micro_batch_size"] = 2;
    s["train"]["global_batch_size"] = 4;
    s["lr_schedule"]["warmup_steps"] = 1;
    const bool fp8 = model == "fp8";
    if (fp8) {
      s["model"]["layer"]["norm"] = {{"impl", "rmsnorm"}};
      s["model"]["final_norm"] = {{"impl", "rmsnorm"}};
      s["model"]["layer"]["mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
      s["model"]["add_bias_linear"] = false;
      s["model"]["position_embedding"] = "rope";
      s["precision"] = {{"params", "bf16"},
                        {"fp8", {{"impl", "delayed"}, {"amax_history_len", 4}}}};
    } else if (model == "f32") {  // an output layer of its own, whose gradient MTP writes first
      s["model"]["tie_embeddings"] = false;
      s["model"]["position_embedding"] = "rope";  // as multi-token prediction needs
      s["model"]["mtp_num_layers"] = 1;
    } else if (model == "mamba") {  // a Mamba-2 layer, then an MLP layer
      s["model"]["hybrid_layer_pattern"] = "M-";
      s["model"]["position_embedding"] = "none";
      s["model"]["mamba_layer"] = nlohmann::json::parse(R"({
        "impl": "mamba_layer", "norm": {"impl": "rmsnorm"},
        "mixer": {"impl": "mamba2", "state_dim": 8, "head_dim": 8, "num_groups": 2,
                  "expand": 2, "d_conv": 4, "chunk_size": 8}})");
    } else {  // the second layer's MLP a mixture of 4 experts (and shared experts)
      s["model"]["position_embedding"] = "rope";
      s["model"]["add_bias_linear"] = false;
      s["model"]["moe_layer_freq"] = {0, 1};
      s["model"]["layer"]["dense_mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
      s["model"]["layer"]["mlp"] = nlohmann::json::parse(R"({
        "impl": "moe", "num_experts": 4, "moe_ffn_hidden_size": 16, "activation": "swiglu",
        "shared_expert_intermediate_size": 16,
        "router": {"impl": "topk", "topk": 2}, "dispatcher": {"impl": "alltoall"}})");
      if (model == "mla")  // MLA in both layers; experts in one grouped GEMM per projection
        s["model"]["multi_latent_attention"] = {{"q_lora_rank", 16},
                                                {"kv_lora_rank", 8},
                                                {"qk_head_dim", 8},
                                                {"qk_pos_emb_head_dim", 4},
                                                {"v_head_dim", 8}};
      if (model == "moe") {  // plain attention; one GEMM per expert with rows, top-1 of 4
        s["model"]["layer"]["mlp"]["grouped_gemm"] = false;
        s["model"]["layer"]["mlp"]["router"]["topk"] = 1;
        s["model"]["layer"]["mlp"]["router"]["pre_softmax"] = true;
      }
    }
    const std::string tag = model + "_";
    auto train = [&](const std::string& name, const std::string& env, int* exit_code) {
      fs::path run = dir_ / (tag + name);
      auto r = run_loom("train " + q(spec(tag + name + ".json", s)) + " --run-dir " + q(run), env);
      *exit_code = r.exit_code;
      std::vector<nlohmann::json> steps;
      if (fs::exists(run / "metrics.jsonl"))
        for (const auto& m : read_jsonl(run / "metrics.jsonl"))
          if (m.contains("loss")) steps.push_back(m);
      if (r.exit_code != kOk)
        std::printf("%s: exit %d\n%s", name.c_str(), r.exit_code, r.err.c_str());
      return steps;
    };
    int code = 0;
    const auto adds = train("adds", "LOOM_GRAD_FIRST_WRITE=off", &code);
    EXPECT_EQ(code, kOk);
    const auto overwrites = train("overwrites", "", &code);
    EXPECT_EQ(code, kOk);
    const auto poisoned = train("poisoned", "LOOM_TEST_FAULT=poison_overwrite:0:1", &code);
    EXPECT_EQ(code, kOk);
    expect_same_steps(adds, overwrites, 4);
    expect_same_steps(adds, poisoned, 4);
    const size_t files = expect_same_checkpoints(dir_ / (tag + "adds"), dir_ / (tag + "poisoned"));
    // The poison reaches the run where every write adds.
    const auto control =
        train("control", "LOOM_GRAD_FIRST_WRITE=off LOOM_TEST_FAULT=poison_overwrite:0:1", &code);
    const bool kept =
        code == kOk && control.size() == adds.size() &&
        std::equal(control.begin(), control.end(), adds.begin(),
                   [](const nlohmann::json& a, const nlohmann::json& b) {
                     return a["loss"] == b["loss"] && a["grad_norm"] == b["grad_norm"];
                   });
    EXPECT_FALSE(kept) << "NaN in the gradients before each step did not reach a run whose "
                          "writes all add: the poison is not applied";
    std::printf(
        "%s: 4 steps of 2 micro-batches bit-identical overwriting, adding and over NaN "
        "(%zu checkpoint files); adding over NaN: exit %d, %zu steps logged\n",
        model.c_str(), files, code, control.size());
  }
}

TEST_F(TrainTest, ABadGradFirstWriteModeNamesTheVariable) {
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 1;
  auto r = run_loom(
      "train " + q(spec("bad_first_write.json", s)) + " --run-dir " + q(dir_ / "bad_first_write"),
      "LOOM_GRAD_FIRST_WRITE=maybe");
  EXPECT_NE(r.exit_code, kOk);
  EXPECT_THAT(r.out + r.err, HasSubstr("LOOM_GRAD_FIRST_WRITE='maybe' is not one of on, off"));
}

// Megatron's --num-layers-at-{start,end}-in-bf16: those layers' GEMMs stay in bf16. With
// both ends covering the whole 2-layer model nothing runs in FP8: the bf16 run's bits.
TEST_F(TrainTest, Fp8LayersAtTheEndsStayInBf16) {
  auto losses_of = [&](const std::string& name, const nlohmann::json& precision, int64_t start,
                       int64_t end) {
    nlohmann::json s = tiny_spec();
    s["train"]["steps"] = 6;
    s["train"]["log_interval"] = 1;
    s["precision"] = precision;
    s["model"]["num_layers_at_start_in_bf16"] = start;
    s["model"]["num_layers_at_end_in_bf16"] = end;
    fs::path run = dir_ / name;
    auto r = run_loom("train " + q(spec(name + ".json", s)) + " --run-dir " + q(run));
    EXPECT_EQ(r.exit_code, kOk) << name << "\n" << r.out << r.err;
    std::vector<double> losses;
    for (const auto& m : read_jsonl(run / "metrics.jsonl"))
      if (m.contains("loss")) losses.push_back(m["loss"].get<double>());
    return losses;
  };
  nlohmann::json bf16 = {{"params", "bf16"}};
  nlohmann::json fp8 = {{"params", "bf16"}, {"fp8", {{"impl", "delayed"}}}};
  std::vector<double> plain = losses_of("plain", bf16, 0, 0);
  std::vector<double> none_fp8 = losses_of("ends", fp8, 1, 1);
  std::vector<double> first_bf16 = losses_of("first", fp8, 1, 0);
  std::vector<double> all_fp8 = losses_of("all", fp8, 0, 0);
  ASSERT_EQ(plain.size(), 6u);
  EXPECT_EQ(none_fp8, plain) << "both layers in bf16: the bf16 run, bit for bit";
  EXPECT_NE(first_bf16, plain) << "layer 2 runs in FP8";
  EXPECT_NE(first_bf16, all_fp8) << "layer 1 does not";
  nlohmann::json s = tiny_spec();
  s["model"]["num_layers_at_end_in_bf16"] = 3;
  auto r = run_loom("train " + q(spec("too_many.json", s)) + " --run-dir " + q(dir_ / "bad"));
  EXPECT_EQ(r.exit_code, kSpec);
  EXPECT_THAT(r.err,
              HasSubstr("/model/num_layers_at_end_in_bf16: 3 is outside [0, num_layers = 2]"));
}

TEST_F(TrainTest, Fp8SpecMistakesNameThePlace) {
  nlohmann::json s = tiny_spec();
  s["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "mxfp8"}}}};
  auto r = run_loom("train " + q(spec("bad.json", s)) + " --run-dir " + q(dir_ / "bad"));
  EXPECT_EQ(r.exit_code, kSpec) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/precision/fp8"));
  EXPECT_THAT(r.err, HasSubstr("mxfp8"));
  s["precision"]["fp8"] = {{"impl", "delayed"}, {"format", "e5m2"}};
  r = run_loom("train " + q(spec("bad.json", s)) + " --run-dir " + q(dir_ / "bad"));
  EXPECT_EQ(r.exit_code, kSpec) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/precision/fp8/format"));
}

TEST_F(TrainTest, MixedPrecisionAndRecomputeRun) {
  for (const char* setting : {"precision.params=\"bf16\"", "precision.params=\"f16\"",
                              "train.recompute=\"full\"", "train.recompute=\"selective\""}) {
    nlohmann::json s = tiny_spec();
    s["train"]["steps"] = 10;
    s["model"]["layer"]["attention"]["impl"] = "dot_product";
    auto r = run_loom("train " + q(spec("mp.json", s)) + " --set '" + setting + "' --run-dir " +
                      q(dir_ / "mp"));
    ASSERT_EQ(r.exit_code, kOk) << setting << "\n" << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("iter     10/10 | loss ")) << setting;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("loss nan"))) << setting;
  }
}

// An optimizer built against optimizer 1.0 has no update_many: the trainer updates it shard
// by shard and casts the bf16 parameters with the cast op, where update_many fuses the casts
// into adamw_step_multi. Both paths give the same losses and gradient norms to the last bit.
TEST_F(TrainTest, AnOptimizerWithoutUpdateManyTrainsToTheSameBits) {
  fs::path plugins = dir_ / "plugins";
  testing::install_test_plugin(plugins, "legacy_optim", "testlegacyoptim");
  std::vector<std::vector<nlohmann::json>> runs;
  for (bool legacy : {false, true}) {
    nlohmann::json s = tiny_spec();
    s["train"]["steps"] = 6;
    s["train"]["log_interval"] = 1;
    s["precision"] = {{"params", "bf16"}};
    s["optimizer"] = {{"impl", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}};
    if (legacy)
      s["optimizer"] = {{"impl", "legacy_optimizer"},
                        {"lr", 0.01},
                        {"weight_decay", 0.1},
                        {"inner", s["optimizer"]}};
    runs.push_back(train_steps(s, legacy ? "legacy" : "many", plugins));
  }
  expect_same_steps(runs[0], runs[1], 6);
  ASSERT_EQ(runs[0].size(), 6u);
  // The parameters moved: a step changes the loss.
  EXPECT_NE(runs[0][0]["loss"].get<double>(), runs[0][5]["loss"].get<double>());
}

// An optimizer whose update_many forgets to cast the masters into the bf16 parameters would
// train a model that never changes; the first step reads one shard back and refuses it, by
// name, pointing at the contract.
TEST_F(TrainTest, AnOptimizerThatSkipsTheBf16CastIsRefusedAtTheFirstStep) {
  fs::path plugins = dir_ / "plugins";
  testing::install_test_plugin(plugins, "legacy_optim", "testlegacyoptim");
  nlohmann::json s = tiny_spec();
  s["train"]["steps"] = 6;
  s["train"]["log_interval"] = 1;
  s["precision"] = {{"params", "bf16"}};
  s["optimizer"] = {{"impl", "castless_optimizer"},
                    {"inner", {{"impl", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}}}};
  fs::path run = dir_ / "castless";
  auto r = run_loom("train " + q(spec("castless.json", s)) + " --run-dir " + q(run),
                    "LOOM_PLUGIN_PATH=" + q(plugins));
  EXPECT_NE(r.exit_code, kOk) << r.out << r.err;
  std::cout << "refused with: " << r.err;
  EXPECT_THAT(r.err, HasSubstr("after update_many, parameter "));
  EXPECT_THAT(r.err, HasSubstr("OptimizerShard::param"));
  // Stopped inside step 1's update, before its log line.
  if (fs::exists(run / "metrics.jsonl")) {
    for (const auto& m : read_jsonl(run / "metrics.jsonl")) EXPECT_FALSE(m.contains("loss")) << m;
  }
}

// `spec validate` checks the spec against the schemas; with --load it also builds every
// component, so a rule only the plugin knows (heads that do not divide the width) is
// refused with its pointer, as `loom train` would refuse it.
TEST_F(TrainTest, SpecValidateLoadRunsThePluginsOwnChecks) {
  nlohmann::json s = tiny_spec();
  s["model"]["num_attention_heads"] = 5;  // does not divide hidden_size 32
  fs::path p = spec("heads.json", s);
  auto r = run_loom("spec validate " + q(p));
  EXPECT_EQ(r.exit_code, kOk) << r.out << r.err;
  r = run_loom("spec validate --load " + q(p));
  EXPECT_EQ(r.exit_code, kSpec) << r.out << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("spec /model/num_attention_heads: 5 does not divide hidden_size 32"));
  r = run_loom("spec validate --load " + q(spec("good.json", tiny_spec())));
  EXPECT_EQ(r.exit_code, kOk) << r.out << r.err;
}

// A plugin built against the previous ABI minor loads, and its model and norm,
// which lack every method of module kinds 1.1, train to the same bits as the current ones:
// nothing calls a method the older objects do not have (the test plugin aborts if anything
// does). The model does not tell its vocabulary (model 1.1's info), so the data says it.
// The layers' norms are legacy too: a norm 1.0 gets the layer's unfused residual adds
// (norm 1.2 fuses them into the norms), which on the CPU give the fused path's bits.
TEST_F(TrainTest, APluginBuiltAgainstThePreviousAbiMinorTrainsToTheSameBits) {
  fs::path plugins = dir_ / "plugins";
  testing::install_test_plugin(plugins, "legacy_modules", "testlegacymodules");
  auto check = run_loom("plugins check testlegacymodules", "LOOM_PLUGIN_PATH=" + q(plugins));
  ASSERT_EQ(check.exit_code, kOk) << check.out << check.err;
  EXPECT_THAT(check.out, HasSubstr("ABI 1." + std::to_string(LOOM_ABI_MINOR - 1)));
  std::vector<std::vector<nlohmann::json>> runs;
  for (bool legacy : {false, true}) {
    nlohmann::json s = tiny_spec();
    s["train"]["steps"] = 6;
    s["train"]["log_interval"] = 1;
    s["data"]["vocab_size"] = 64;
    if (legacy) {
      s["model"]["final_norm"] = {{"impl", "legacy_norm"}, {"inner", s["model"]["final_norm"]}};
      s["model"]["layer"]["norm"] = {{"impl", "legacy_norm"},
                                     {"inner", s["model"]["layer"]["norm"]}};
      s["model"] = {{"impl", "legacy_model"}, {"inner", s["model"]}};
    }
    runs.push_back(train_steps(s, legacy ? "legacy" : "current", plugins));
  }
  expect_same_steps(runs[0], runs[1], 6);
}

// Gradient accumulation: two micro-batches of 2 sequences make the same step as one of 4
// (the mock stream hands out the same 4 samples either way).
TEST_F(TrainTest, GradientAccumulationMatchesOneLargeMicroBatch) {
  std::vector<std::vector<nlohmann::json>> runs;
  for (int mbs : {4, 2}) {
    nlohmann::json s = tiny_spec();
    s["train"]["steps"] = 3;
    s["train"]["log_interval"] = 1;
    s["lr_schedule"]["warmup_steps"] = 1;
    s["train"]["micro_batch_size"] = mbs;
    s["train"]["global_batch_size"] = 4;
    fs::path run = dir_ / ("acc" + std::to_string(mbs));
    auto r = run_loom("train " + q(spec("acc.json", s)) + " --run-dir " + q(run));
    ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
    if (mbs == 2) {
      EXPECT_THAT(r.out, HasSubstr("batch: 2 micro-batches of 2 x 16 tokens"));
    }
    std::vector<nlohmann::json> steps;
    for (const auto& m : read_jsonl(run / "metrics.jsonl"))
      if (m.contains("loss")) steps.push_back(m);
    runs.push_back(steps);
  }
  ASSERT_EQ(runs[0].size(), 3u);
  ASSERT_EQ(runs[1].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(runs[0][i]["loss"].get<double>(), runs[1][i]["loss"].get<double>(), 1e-5) << i;
    EXPECT_NEAR(runs[0][i]["grad_norm"].get<double>(), runs[1][i]["grad_norm"].get<double>(),
                1e-5 * runs[0][i]["grad_norm"].get<double>())
        << i;
  }
}

TEST_F(TrainTest, ShapesThatDoNotFitAreRefusedWithThePointer) {
  struct Case {
    const char* setting;
    const char* pointer;
  };
  for (const Case& c : {Case{"model.num_attention_heads=5", "/model/num_attention_heads"},
                        Case{"model.num_query_groups=3", "/model/num_query_groups"},
                        Case{"train.seq_length=64", "/train/seq_length"}}) {
    auto r = run_loom("train " + q(spec("bad.json", tiny_spec())) + " --set " + c.setting +
                      " --run-dir " + q(dir_ / "bad"));
    EXPECT_EQ(r.exit_code, kSpec) << c.setting << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.pointer)) << c.setting;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("iter "))) << c.setting;
  }
}

// f16 dynamic loss scaling end to end. The oracle: Megatron's DynamicGradScaler rules
// (megatron/core/optimizer/grad_scaler.py), written out here on their own: an overflow resets
// the clean-step count and spends one hysteresis; once none is left, that overflow and every
// later one halves the scale (not below the minimum) until the scale grows again; `window`
// clean steps in a row double the scale and restore the hysteresis. (A clean step between
// overflows does not restore it: Megatron's code counts overflows since the last growth.)
struct ScaleRules {
  double initial, min;
  int64_t window, hysteresis;
  bool restore_hysteresis_on_backoff = false;  // a wrong variant, to show the test can tell
};

// The scale used by each step (index 0: step 1) and the scale after it, from the overflow
// of each step.
struct ScaleTrace {
  std::vector<double> used, after;
};

ScaleTrace expected_scales(const ScaleRules& rules, const std::vector<bool>& overflow) {
  ScaleTrace t;
  double scale = rules.initial;
  int64_t clean = 0, hysteresis = rules.hysteresis;
  for (bool o : overflow) {
    t.used.push_back(scale);
    if (o) {
      clean = 0;
      hysteresis = std::max<int64_t>(hysteresis - 1, 0);
      if (hysteresis == 0) {
        scale = std::max(scale / 2, rules.min);
        if (rules.restore_hysteresis_on_backoff) hysteresis = rules.hysteresis;
      }
    } else if (++clean == rules.window) {
      scale *= 2;
      clean = 0;
      hysteresis = rules.hysteresis;
    }
    t.after.push_back(scale);
  }
  return t;
}

// The line a skipped step prints, with the scale it used.
std::string skip_line(size_t step, double scale) {
  char line[128];
  std::snprintf(line, sizeof line, "step %zu skipped: non-finite gradients (loss scale %g)\n", step,
                scale);
  return line;
}

// A huge initial scale (2^30) overflows f16 at once: the loss gradient's largest element
// per token is (1 - p_target) x scale / 64 tokens, above f16's 65504 for any scale >= 2^23
// while the untrained model's p_target is near 1/64. So the first steps are skipped (no
// update: the validation loss stays the untrained model's, to the bit), the scale halves
// as the rules say, and once the steps are clean it grows again after each window; later
// overflows (near 2^20 for this model) follow the same rules. Every step is logged
// (log_interval 1) with its `skipped` count and the scale after it, and validated
// (eval_interval 1) on the same batch. The run's own overflows drive the oracle; the scales
// must match it at every step, and the variants with the hysteresis or the window off by
// one, or the hysteresis restored on each backoff, must not.
TEST_F(TrainTest, F16LossScalingSkipsOverflowsHalvesWithHysteresisAndRegrows) {
  const ScaleRules rules{std::ldexp(1.0, 30), 1, 3, 2};
  const int64_t steps = 60;
  nlohmann::json s = tiny_spec();
  s["precision"] = {{"params", "f16"},
                    {"initial_loss_scale", rules.initial},
                    {"min_loss_scale", rules.min},
                    {"loss_scale_window", rules.window},
                    {"hysteresis", rules.hysteresis}};
  s["lr_schedule"] = {{"impl", "constant"}};
  s["train"]["steps"] = steps;
  s["train"]["log_interval"] = 1;
  s["train"]["eval_interval"] = 1;
  s["train"]["eval_steps"] = 1;
  s["checkpoint"] = {{"save_at_end", false}};
  struct Run {
    std::string out;
    std::vector<nlohmann::json> lines;  // the step lines, step 1..steps
    std::vector<double> valid;          // validation loss after each step
  };
  auto train = [&](const std::string& name, const nlohmann::json& body) {
    Run run;
    fs::path dir = dir_ / name;
    auto r = run_loom("train " + q(spec(name + ".json", body)) + " --run-dir " + q(dir));
    EXPECT_EQ(r.exit_code, kOk) << name << "\n" << r.out << r.err;
    run.out = r.out;
    if (!fs::exists(dir / "metrics.jsonl")) return run;
    for (const auto& m : read_jsonl(dir / "metrics.jsonl")) {
      if (m.contains("skipped")) run.lines.push_back(m);
      if (m.contains("valid_loss")) run.valid.push_back(m["valid_loss"].get<double>());
    }
    return run;
  };
  Run run = train("f16", s);
  ASSERT_EQ(run.lines.size(), static_cast<size_t>(steps)) << run.out;
  ASSERT_EQ(run.valid.size(), static_cast<size_t>(steps)) << run.out;
  // The untrained model's validation loss: the same run with lr 0 never changes a weight.
  nlohmann::json frozen = s;
  frozen["optimizer"]["lr"] = 0.0;
  Run still = train("f16_lr0", frozen);
  ASSERT_EQ(still.valid.size(), static_cast<size_t>(steps)) << still.out;
  const double untrained = still.valid[0];
  for (double v : still.valid) ASSERT_EQ(v, untrained) << "lr 0 changed the weights";

  std::vector<bool> overflow;
  for (int64_t i = 0; i < steps; ++i) {
    const nlohmann::json& m = run.lines[static_cast<size_t>(i)];
    ASSERT_EQ(m["step"].get<int64_t>(), i + 1);
    const int64_t skipped = m["skipped"].get<int64_t>();
    ASSERT_TRUE(skipped == 0 || skipped == 1) << m;
    overflow.push_back(skipped == 1);
    // A skipped step has no loss to average into its line.
    EXPECT_EQ(m["loss"].is_null(), skipped == 1) << m;
  }
  const ScaleTrace want = expected_scales(rules, overflow);
  std::printf("step  overflow  scale used   scale after (logged)  expected  valid loss\n");
  int growths = 0, clean = 0, leading = 0;
  for (size_t i = 0; i < overflow.size(); ++i) {
    const double logged = run.lines[i]["loss_scale"].get<double>();
    std::printf("%4zu  %8s  %10.0f  %20.0f  %8.0f  %.9g\n", i + 1, overflow[i] ? "yes" : "no",
                want.used[i], logged, want.after[i], run.valid[i]);
    EXPECT_EQ(logged, want.after[i]) << "step " << i + 1;
    // Forced by f16's range while the weights are the untrained ones (see above).
    if (clean == 0 && want.used[i] >= std::ldexp(1.0, 23)) {
      EXPECT_TRUE(overflow[i]) << "step " << i + 1;
    }
    if (want.after[i] > want.used[i]) ++growths;
    if (overflow[i] && leading == static_cast<int>(i)) ++leading;
    const double before = i == 0 ? untrained : run.valid[i - 1];  // validation loss
    if (overflow[i]) {
      EXPECT_THAT(run.out, HasSubstr(skip_line(i + 1, want.used[i]))) << "step " << i + 1;
      // No update: the weights (and so the validation loss) are those before the step.
      EXPECT_EQ(run.valid[i], before) << "skipped step " << i + 1 << " changed the weights";
    } else {
      EXPECT_NE(run.valid[i], before) << "clean step " << i + 1 << " left the weights alone";
      ++clean;
    }
  }
  std::printf("%d leading overflows, %d clean steps, %d growths\n", leading, clean, growths);
  // 2^30 halves from the second overflow on (hysteresis 2): steps 1 to 9 use >= 2^23.
  EXPECT_GE(leading, 9);
  EXPECT_GE(clean, 10);
  ASSERT_GE(growths, 1) << "no window of " << rules.window << " clean steps: the test cannot "
                        << "tell the window";
  // The log tells these rules from their neighbours.
  std::vector<std::pair<std::string, ScaleRules>> variants = {
      {"hysteresis 1", {rules.initial, rules.min, rules.window, rules.hysteresis - 1}},
      {"hysteresis 3", {rules.initial, rules.min, rules.window, rules.hysteresis + 1}},
      {"window 2", {rules.initial, rules.min, rules.window - 1, rules.hysteresis}},
      {"window 4", {rules.initial, rules.min, rules.window + 1, rules.hysteresis}},
      {"hysteresis restored on backoff",
       {rules.initial, rules.min, rules.window, rules.hysteresis, true}}};
  for (const auto& [name, variant] : variants) {
    const std::vector<double> other = expected_scales(variant, overflow).after;
    size_t first = 0;
    while (first < other.size() && other[first] == want.after[first]) ++first;
    std::printf("%s: first differs at step %zu\n", name.c_str(), first + 1);
    EXPECT_LT(first, other.size()) << name << " gives the same scales";
  }
}

TEST_F(TrainTest, BenchPrintsThroughput) {
  auto r = run_loom("bench " + q(spec("tiny.json", tiny_spec())) + " --steps 2 --warmup 1 --json");
  ASSERT_EQ(r.exit_code, kOk) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["steps"], 2);
  EXPECT_EQ(j["tokens_per_step"], 64);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["mfu"].get<double>(), 0);
  EXPECT_GT(j["gemm_peak_flops"].get<double>(), 0);
}

}  // namespace
}  // namespace loom
