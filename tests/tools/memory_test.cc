// The analytic memory estimate (core/train/memory_estimate.h) against the measured peak of
// `loom bench`: within 10% for every layer flavour the formula covers (layernorm / rmsnorm,
// fused / dot_product attention, gelu / swiglu, GQA, f32 / bf16 parameters, dropout, each
// recomputation policy), on the CPU and on the fake CUDA device (whose figures come from
// loom's CUDA caching allocator). The sizes make activations the larger part of the peak,
// so a module that keeps a tensor it should hand back (ForwardContext::release) shows here.
// Mixture-of-experts layers too, in cases whose routed rows the estimate knows exactly: one
// rank without a capacity (every choice reaches a local expert whatever the routing) and a
// capacity every expert overflows (each keeps exactly its capacity).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/util/test_plugins.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using testing::run_loom;
using testing::write_file;

nlohmann::json gpt_spec() {
  return nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
              "vocab_size": 512, "max_position_embeddings": 128,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "attention": {"impl": "fused"}, "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.001},
    "data": {"mock": true},
    "train": {"micro_batch_size": 4, "global_batch_size": 8, "seq_length": 128, "steps": 4}
  })");
}

nlohmann::json llama_spec() {
  nlohmann::json s = gpt_spec();
  s["model"]["position_embedding"] = "rope";
  s["model"]["num_query_groups"] = 2;
  s["model"]["ffn_hidden_size"] = 176;
  s["model"]["add_bias_linear"] = false;
  s["model"]["tie_embeddings"] = false;
  s["model"]["layer"]["norm"] = {{"impl", "rmsnorm"}};
  s["model"]["layer"]["mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  s["model"]["final_norm"] = {{"impl", "rmsnorm"}};
  return s;
}

// llama_spec with Mixtral-like experts: 4 experts of width 128, top-2, both load-balancing
// terms. The experts' rows (N K = 1024 a layer) make the MoE layers most of the activations.
nlohmann::json mixtral_spec() {
  nlohmann::json s = llama_spec();
  s["model"]["layer"]["mlp"] = nlohmann::json::parse(R"({
    "impl": "moe", "num_experts": 4, "moe_ffn_hidden_size": 128, "activation": "swiglu",
    "router": {"impl": "topk", "topk": 2, "load_balancing_type": "aux_loss",
               "aux_loss_coeff": 0.01, "z_loss_coeff": 0.001},
    "dispatcher": {"impl": "alltoall"}})");
  return s;
}

class MemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("memory_test");
    testing::install_test_plugin(dir_ / "plugins", "fake_cuda", "testfakecuda");
  }
  // Benches `body` and checks peak / estimate; returns the bench JSON.
  nlohmann::json expect_within_10_percent(const std::string& name, nlohmann::json body,
                                          const std::string& device = "cpu") {
    body["train"]["device"] = device;
    if (device == "cuda") body["kernels"] = {{"libraries", {"testfakecuda"}}};
    fs::path spec = dir_ / (name + ".json");
    write_file(spec, body.dump(2));
    auto r = run_loom("bench '" + spec.string() + "' --steps 1 --warmup 1 --json",
                      "LOOM_PLUGIN_PATH='" + (dir_ / "plugins").string() + "'");
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.out << r.err;
    if (r.exit_code != 0) return nlohmann::json::object();
    nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
    double peak = j.at("peak_mem_bytes").get<double>();
    double estimate = j.at("estimated_mem_bytes").get<double>();
    std::string what = j.at("estimated_mem").get<std::string>();
    EXPECT_THAT(what, ::testing::Not(::testing::HasSubstr("not estimated"))) << name;
    std::printf("%s: peak %.0f bytes, estimate %.0f, peak / estimate %.4f\n", name.c_str(), peak,
                estimate, peak / estimate);
    EXPECT_LT(std::abs(peak / estimate - 1), 0.10)
        << name << ": peak " << peak << " bytes, estimate " << estimate << " (" << what << ")";
    return j;
  }
  fs::path dir_;
};

TEST_F(MemoryTest, GptWithLayerNormFusedAttentionAndGelu) {
  nlohmann::json s = gpt_spec();
  expect_within_10_percent("gpt", s);
  s["model"]["hidden_dropout"] = 0.1;
  s["model"]["attention_dropout"] = 0.1;
  expect_within_10_percent("gpt_dropout", s);
}

TEST_F(MemoryTest, Bf16ParametersWithMasterWeights) {
  nlohmann::json s = gpt_spec();
  s["precision"] = {{"params", "bf16"}};
  expect_within_10_percent("gpt_bf16", s);
}

TEST_F(MemoryTest, LlamaWithRmsNormSwigluAndGroupedQueries) {
  expect_within_10_percent("llama", llama_spec());
}

TEST_F(MemoryTest, DotProductAttentionUnderEachRecomputationPolicy) {
  nlohmann::json s = gpt_spec();
  s["model"]["layer"]["attention"] = {{"impl", "dot_product"}};
  for (const char* policy : {"none", "selective", "full"}) {
    s["train"]["recompute"] = policy;
    expect_within_10_percent(std::string("dot_product_") + policy, s);
  }
}

TEST_F(MemoryTest, FullRecomputationKeepsOnlyLayerInputs) {
  nlohmann::json s = llama_spec();
  nlohmann::json none = expect_within_10_percent("llama_none", s);
  s["train"]["recompute"] = "full";
  nlohmann::json full = expect_within_10_percent("llama_full", s);
  if (none.is_object() && full.is_object() && none.contains("peak_mem_bytes") &&
      full.contains("peak_mem_bytes")) {
    EXPECT_LT(full["peak_mem_bytes"].get<double>(), none["peak_mem_bytes"].get<double>());
  }
}

// FP8 GEMMs keep each linear site's input and weight transposes in FP8 instead of its bf16
// input: the estimate moves by what the peak moves by, and the peak is below bf16's.
TEST_F(MemoryTest, Fp8LayersKeepTheirOperandsTransposes) {
  for (const char* model : {"gpt", "llama"}) {
    SCOPED_TRACE(model);
    nlohmann::json s = std::string(model) == "gpt" ? gpt_spec() : llama_spec();
    s["precision"] = {{"params", "bf16"}};
    nlohmann::json bf16 = expect_within_10_percent(std::string(model) + "_bf16", s);
    s["precision"]["fp8"] = {{"impl", "delayed"}};
    nlohmann::json fp8 = expect_within_10_percent(std::string(model) + "_fp8", s);
    if (!bf16.contains("peak_mem_bytes") || !fp8.contains("peak_mem_bytes")) continue;
    double measured = bf16["peak_mem_bytes"].get<double>() - fp8["peak_mem_bytes"].get<double>();
    double estimated =
        bf16["estimated_mem_bytes"].get<double>() - fp8["estimated_mem_bytes"].get<double>();
    EXPECT_GT(measured, 0) << "FP8 activations take less memory than bf16's";
    EXPECT_NEAR(estimated, measured, 0.1 * measured) << "the FP8 saving in the estimate";
  }
  nlohmann::json s = llama_spec();
  s["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "tensorwise"}}}};
  expect_within_10_percent("llama_fp8_cuda", s, "cuda");
  s["model"]["num_layers_at_start_in_bf16"] = 1;  // a bf16 layer among FP8 ones
  s["model"]["layer"]["attention"] = {{"impl", "dot_product"}};
  expect_within_10_percent("llama_fp8_first_bf16", s);
}

// Dropless at one rank: all N K choices reach this rank's experts however the router
// balances them, so the estimate's rows are exact. What the experts add over the dense
// model's MLP is what the estimate adds.
TEST_F(MemoryTest, MixtureOfExpertsDroplessAtOneRank) {
  nlohmann::json dense = expect_within_10_percent("llama_dense", llama_spec());
  nlohmann::json s = mixtral_spec();
  nlohmann::json moe = expect_within_10_percent("mixtral", s);
  if (dense.contains("peak_mem_bytes") && moe.contains("peak_mem_bytes")) {
    double measured = moe["peak_mem_bytes"].get<double>() - dense["peak_mem_bytes"].get<double>();
    double estimated =
        moe["estimated_mem_bytes"].get<double>() - dense["estimated_mem_bytes"].get<double>();
    EXPECT_GT(measured, 0.2 * dense["peak_mem_bytes"].get<double>()) << "the experts' share";
    EXPECT_NEAR(estimated, measured, 0.1 * measured) << "the MoE layers in the estimate";
  }
  s["model"]["layer"]["mlp"]["dispatcher"] = {{"impl", "allgather"}};
  s["model"]["layer"]["mlp"]["activation"] = "gelu";
  s["precision"] = {{"params", "bf16"}};
  expect_within_10_percent("mixtral_allgather_gelu_bf16", s);
}

// A capacity factor of 0.5: each expert keeps ceil(N K / E x 0.5) = 128 of the ~256 choices
// it gets (an expert would need fewer than half its balanced share to stay under), so the
// bound the estimate takes is what the run holds. With a gated shared expert and a dense
// first layer (moe_layer_freq).
TEST_F(MemoryTest, MixtureOfExpertsAtTheCapacityBound) {
  nlohmann::json s = mixtral_spec();
  s["model"]["layer"]["mlp"]["expert_capacity_factor"] = 0.5;
  expect_within_10_percent("mixtral_capacity", s);
  s["model"]["moe_layer_freq"] = {0, 1, 1};
  s["model"]["layer"]["dense_mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  s["model"]["layer"]["mlp"]["shared_expert_intermediate_size"] = 128;
  s["model"]["layer"]["mlp"]["shared_expert_gate"] = true;
  s["model"]["layer"]["mlp"]["dispatcher"] = {{"impl", "allgather"}};
  expect_within_10_percent("mixtral_capacity_shared_dense_first", s);
}

TEST_F(MemoryTest, OnTheFakeCudaDeviceThroughTheCachingAllocator) {
  expect_within_10_percent("llama_cuda", llama_spec(), "cuda");
  nlohmann::json s = gpt_spec();
  s["precision"] = {{"params", "bf16"}};
  expect_within_10_percent("gpt_bf16_cuda", s, "cuda");
}

}  // namespace
}  // namespace loom
