// The analytic memory estimate (core/train/memory_estimate.h) against the measured peak of
// `loom bench`: within 1% (kTolerance) for every layer flavour the formula covers (layernorm /
// rmsnorm, fused / dot_product attention, gelu / swiglu, GQA, f32 / bf16 parameters, FP8,
// dropout, each recomputation policy), on the CPU and on the fake CUDA device (whose figures
// come from loom's CUDA caching allocator); each case prints its ratio (most are 1.0000 to
// 1.0060). The sizes make activations the larger part of the peak, so a module that keeps a
// tensor it should hand back (ForwardContext::release) shows here. Mixture-of-experts layers
// too, in cases whose routed rows the estimate knows exactly: one rank without a capacity
// (every choice reaches a local expert whatever the routing) and a capacity every expert
// overflows (each keeps exactly its capacity). And the distributed optimizer's per-rank
// memory at dp 2.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
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

// |peak / estimate - 1| for every case.
constexpr double kTolerance = 0.01;

class MemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("memory_test");
    testing::install_test_plugin(dir_ / "plugins", "fake_cuda", "testfakecuda");
  }
  // Benches `body` and checks |peak / estimate - 1| < kTolerance; returns the bench JSON.
  nlohmann::json expect_near_estimate(const std::string& name, nlohmann::json body,
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
    std::printf("%s: peak %.0f bytes, estimate %.0f, peak / estimate %.4f (bound 1 +- %.2f)\n",
                name.c_str(), peak, estimate, peak / estimate, kTolerance);
    EXPECT_LT(std::abs(peak / estimate - 1), kTolerance)
        << name << ": peak " << peak << " bytes, estimate " << estimate << " (" << what << ")";
    return j;
  }
  fs::path dir_;
  // The bench runs of the ASan build crash LeakSanitizer's exit-time tracer in the sandbox
  // after clean runs (an FP8 LLaMA with a bf16 first layer, 2026-11-28; test_plugins.h says
  // why): they keep every other check.
  testing::WithoutLeakCheck no_leak_scan_;
};

TEST_F(MemoryTest, GptWithLayerNormFusedAttentionAndGelu) {
  nlohmann::json s = gpt_spec();
  expect_near_estimate("gpt", s);
  s["model"]["hidden_dropout"] = 0.1;
  s["model"]["attention_dropout"] = 0.1;
  expect_near_estimate("gpt_dropout", s);
}

TEST_F(MemoryTest, Bf16ParametersWithMasterWeights) {
  nlohmann::json s = gpt_spec();
  s["precision"] = {{"params", "bf16"}};
  expect_near_estimate("gpt_bf16", s);
}

// AdamW's moments in bf16 (Megatron's precision-aware optimizer): the optimizer part of the
// estimate is 4 bytes a parameter (two bf16 moments), half the f32 moments', and the measured
// peak is still where the estimate puts it.
TEST_F(MemoryTest, Bf16MomentsHalveTheOptimizerStates) {
  nlohmann::json s = gpt_spec();
  s["precision"] = {{"params", "bf16"}};
  nlohmann::json f32 = expect_near_estimate("gpt_bf16_f32_moments", s);
  s["optimizer"]["exp_avg_dtype"] = "bf16";
  s["optimizer"]["exp_avg_sq_dtype"] = "bf16";
  nlohmann::json bf16 = expect_near_estimate("gpt_bf16_bf16_moments", s);
  ASSERT_TRUE(f32.contains("estimated_mem_parts") && bf16.contains("estimated_mem_parts"));
  auto part = [](const nlohmann::json& j, const char* key) {
    return j.at("estimated_mem_parts").at(key).get<uint64_t>();
  };
  const uint64_t n = part(f32, "weights") / 2;  // bf16 parameters
  EXPECT_EQ(part(f32, "optimizer"), 8 * n);
  EXPECT_EQ(part(bf16, "optimizer"), 4 * n);
  EXPECT_EQ(part(bf16, "master"), part(f32, "master"));
  EXPECT_LT(bf16.at("peak_mem_bytes").get<double>(), f32.at("peak_mem_bytes").get<double>());
}

TEST_F(MemoryTest, LlamaWithRmsNormSwigluAndGroupedQueries) {
  expect_near_estimate("llama", llama_spec());
}

// The peak is where the estimate puts it: with the logits' gradient (vocabulary 512, no
// recomputation), or at the end of the top layer's dot_product core backward, which holds
// three (B, H, T, T) buffers at once under "selective" (the recomputed probabilities, their
// gradient, the scores' gradient) and two beside the saved probabilities under "full" and,
// with a vocabulary of 128, under "none" too.
TEST_F(MemoryTest, DotProductAttentionUnderEachRecomputationPolicy) {
  nlohmann::json s = gpt_spec();
  s["model"]["layer"]["attention"] = {{"impl", "dot_product"}};
  for (const char* policy : {"none", "selective", "full"}) {
    s["train"]["recompute"] = policy;
    expect_near_estimate(std::string("dot_product_") + policy, s);
  }
  s["train"]["recompute"] = "none";
  s["model"]["vocab_size"] = 128;
  expect_near_estimate("dot_product_none_vocab_128", s);
}

// Under "full" the top layer's backward reruns its forward, saving this time: the peak is
// inside its MLP's backward, with the layers' inputs and the rerun's saves (the layer's
// input among them, counted once) beside it.
TEST_F(MemoryTest, FullRecomputationKeepsOnlyLayerInputs) {
  nlohmann::json s = llama_spec();
  nlohmann::json none = expect_near_estimate("llama_none", s);
  s["train"]["recompute"] = "full";
  nlohmann::json full = expect_near_estimate("llama_full", s);
  if (none.is_object() && full.is_object() && none.contains("peak_mem_bytes") &&
      full.contains("peak_mem_bytes")) {
    EXPECT_LT(full["peak_mem_bytes"].get<double>(), none["peak_mem_bytes"].get<double>());
  }
}

// FP8 GEMMs keep each linear site's input and weight transposes in FP8 instead of its bf16
// input: the estimate moves by what the peak moves by, and the peak is below bf16's. That is
// measured with the loss in two ops (cross_entropy_fwd_bwd pinned to "none"), whose peak is
// at the start of backward, beside the logits' gradient, where every layer's saves are
// there. With the loss in one pass (the default) these small models peak in the top layer's
// MLP backward instead, where an FP8 layer also holds d(fc1 out) quantized and transposed:
// the estimate follows it there too. These runs have two micro-batches a step, so by default
// the FP8 weights are kept across them (/precision/fp8_weight_cache): W and W^T of every FP8
// site held once, for the run, and no W^T in a micro-batch's saves; the estimate counts them
// so. The activations' saving against bf16 is measured with the weights quantised in every
// micro-batch (the cache off), where W^T is a micro-batch's.
TEST_F(MemoryTest, Fp8LayersKeepTheirOperandsTransposes) {
  for (const char* model : {"gpt", "llama"}) {
    SCOPED_TRACE(model);
    nlohmann::json s = std::string(model) == "gpt" ? gpt_spec() : llama_spec();
    s["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "delayed"}}}};
    expect_near_estimate(std::string(model) + "_fp8", s);
    s["precision"]["fp8_weight_cache"] = false;
    expect_near_estimate(std::string(model) + "_fp8_each_micro_batch", s);
    s["kernels"] = {{"pin", {{"cross_entropy_fwd_bwd", "none"}}}};
    nlohmann::json fp8 = expect_near_estimate(std::string(model) + "_fp8_two_op_loss", s);
    s["precision"].erase("fp8");
    nlohmann::json bf16 = expect_near_estimate(std::string(model) + "_bf16_two_op_loss", s);
    if (!bf16.contains("peak_mem_bytes") || !fp8.contains("peak_mem_bytes")) continue;
    double measured = bf16["peak_mem_bytes"].get<double>() - fp8["peak_mem_bytes"].get<double>();
    double estimated =
        bf16["estimated_mem_bytes"].get<double>() - fp8["estimated_mem_bytes"].get<double>();
    EXPECT_GT(measured, 0) << "FP8 activations take less memory than bf16's";
    // A difference of two peaks 80 to 190 KiB apart: the estimate's saving exceeds the
    // measured one by the same 1884 bytes for both models, 1.0% of gpt's and 2.3% of llama's.
    std::printf("%s: FP8 saving measured %.0f bytes, estimated %.0f (%.4f)\n", model, measured,
                estimated, estimated / measured);
    EXPECT_NEAR(estimated, measured, 0.03 * measured) << "the FP8 saving in the estimate";
  }
  nlohmann::json s = llama_spec();
  s["precision"] = {{"params", "bf16"}, {"fp8", {{"impl", "tensorwise"}}}};
  expect_near_estimate("llama_fp8_cuda", s, "cuda");
  s["model"]["num_layers_at_start_in_bf16"] = 1;  // a bf16 layer among FP8 ones
  s["model"]["layer"]["attention"] = {{"impl", "dot_product"}};
  expect_near_estimate("llama_fp8_first_bf16", s);
}

// What the host allocator adds to the flat weights and gradients (one block each,
// core/runtime/parameters.cc), which the estimate counts as asked for: a block of 1 MiB or
// more is rounded up to 64 KiB (core/plugin/host.cc).
double flat_rounding(const nlohmann::json& bench) {
  double bytes = 0;
  for (const char* part : {"weights", "grads"}) {
    const uint64_t asked = bench.at("estimated_mem_parts").at(part).get<uint64_t>();
    if (asked >= (uint64_t{1} << 20))
      bytes += static_cast<double>((asked + 65535) / 65536 * 65536 - asked);
  }
  return bytes;
}

// Dropless at one rank: all N K choices reach this rank's experts however the router
// balances them, so the estimate's rows are exact. What the experts add over the dense
// model's MLP is what the estimate adds, with the allocator's rounding of the flat weights
// and gradients (the MoE model's 1.6 MB each take 43 KiB more, the dense model's are under
// 1 MiB).
TEST_F(MemoryTest, MixtureOfExpertsDroplessAtOneRank) {
  nlohmann::json dense = expect_near_estimate("llama_dense", llama_spec());
  nlohmann::json s = mixtral_spec();
  nlohmann::json moe = expect_near_estimate("mixtral", s);
  if (dense.contains("peak_mem_bytes") && moe.contains("peak_mem_bytes")) {
    double measured = moe["peak_mem_bytes"].get<double>() - dense["peak_mem_bytes"].get<double>();
    double estimated = moe["estimated_mem_bytes"].get<double>() -
                       dense["estimated_mem_bytes"].get<double>() + flat_rounding(moe) -
                       flat_rounding(dense);
    EXPECT_GT(measured, 0.2 * dense["peak_mem_bytes"].get<double>()) << "the experts' share";
    std::printf("MoE layers: measured %.0f bytes, estimated %.0f (%.4f)\n", measured, estimated,
                estimated / measured);
    EXPECT_NEAR(estimated, measured, 0.01 * measured) << "the MoE layers in the estimate";
  }
  s["model"]["layer"]["mlp"]["dispatcher"] = {{"impl", "allgather"}};
  s["model"]["layer"]["mlp"]["activation"] = "gelu";
  s["precision"] = {{"params", "bf16"}};
  expect_near_estimate("mixtral_allgather_gelu_bf16", s);
}

// A capacity factor of 0.5: each expert keeps ceil(N K / E x 0.5) = 128 of the ~256 choices
// it gets (an expert would need fewer than half its balanced share to stay under), so the
// bound the estimate takes is what the run holds. With a gated shared expert and a dense
// first layer (moe_layer_freq).
TEST_F(MemoryTest, MixtureOfExpertsAtTheCapacityBound) {
  nlohmann::json s = mixtral_spec();
  s["model"]["layer"]["mlp"]["expert_capacity_factor"] = 0.5;
  expect_near_estimate("mixtral_capacity", s);
  s["model"]["moe_layer_freq"] = {0, 1, 1};
  s["model"]["layer"]["dense_mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  s["model"]["layer"]["mlp"]["shared_expert_intermediate_size"] = 128;
  s["model"]["layer"]["mlp"]["shared_expert_gate"] = true;
  s["model"]["layer"]["mlp"]["dispatcher"] = {{"impl", "allgather"}};
  expect_near_estimate("mixtral_capacity_shared_dense_first", s);
}

TEST_F(MemoryTest, OnTheFakeCudaDeviceThroughTheCachingAllocator) {
  expect_near_estimate("llama_cuda", llama_spec(), "cuda");
  nlohmann::json s = gpt_spec();
  s["precision"] = {{"params", "bf16"}};
  expect_near_estimate("gpt_bf16_cuda", s, "cuda");
}

// The distributed optimizer (ZeRO-1) at dp 2, two processes: each rank keeps the f32 master
// weights and the AdamW moments of its chunk of every bucket. Every parameter of this model
// has a multiple of 16 elements, so its one bucket (parameters 16-aligned, padded to a
// multiple of dp) has no gap and no padding: rank 0's chunk is exactly half of the N
// parameters (rank 1's the other half: chunks are equal). The figures are what rank 0's
// optimizer allocated (`loom bench --json`, estimated_mem_parts; only rank 0 prints),
// checked against the parameter count; rank 0's measured peak moves by that saving less the
// two buffers ZeRO-1 adds (core/optim/grad_sync.cc): the f32 gradient shard (N / 2) and the
// all-gather input, the largest bucket's chunk in the parameters' dtype (bf16, N / 2 here).
TEST_F(MemoryTest, DistributedOptimizerHalvesOptimizerMemoryPerRank) {
  nlohmann::json s = gpt_spec();
  s["model"]["num_layers"] = 2;
  s["precision"] = {{"params", "bf16"}};
  s["train"]["micro_batch_size"] = 2;
  s["train"]["global_batch_size"] = 4;
  s["train"]["seq_length"] = 32;
  fs::path spec = dir_ / "zero1.json";
  write_file(spec, s.dump(2));
  // Rank 0's JSON, each line of which the launcher prefixes with "[rank 0] ".
  auto bench = [&](bool sharded) {
    auto r = run_loom("bench '" + spec.string() +
                      "' --nproc 2 --steps 1 --warmup 1 --json --set parallel.dp=2"
                      " --set parallel.distributed_optimizer=" +
                      (sharded ? "true" : "false"));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string prefix = "[rank 0] ";
    std::string text;
    for (size_t at = 0; at < r.out.size();) {
      size_t end = std::min(r.out.find('\n', at), r.out.size());
      if (r.out.compare(at, prefix.size(), prefix) == 0)
        text += r.out.substr(at + prefix.size(), end - at - prefix.size()) + "\n";
      at = end + 1;
    }
    size_t brace = text.find('{');
    if (brace == std::string::npos) {
      ADD_FAILURE() << "no JSON from rank 0:\n" << r.out << r.err;
      return nlohmann::json::object();
    }
    return nlohmann::json::parse(text.substr(brace));
  };
  nlohmann::json whole = bench(false), zero1 = bench(true);
  ASSERT_TRUE(whole.contains("estimated_mem_parts") && zero1.contains("estimated_mem_parts"));
  auto part = [](const nlohmann::json& j, const char* key) {
    return j.at("estimated_mem_parts").at(key).get<uint64_t>();
  };
  const uint64_t n = part(whole, "weights") / 2;  // bf16 parameters
  ASSERT_EQ(n % 16, 0u);
  // Without sharding: f32 master weights and two f32 moments for every parameter.
  EXPECT_EQ(part(whole, "master"), 4 * n);
  EXPECT_EQ(part(whole, "optimizer"), 8 * n);
  EXPECT_EQ(part(whole, "shard_buffers"), 0u);
  // ZeRO-1: exactly half of each, and the two buffers.
  EXPECT_EQ(part(zero1, "master"), 4 * (n / 2));
  EXPECT_EQ(part(zero1, "optimizer"), 8 * (n / 2));
  EXPECT_EQ(part(zero1, "shard_buffers"), 4 * (n / 2) + 2 * (n / 2));
  EXPECT_EQ(part(zero1, "weights"), part(whole, "weights"));
  EXPECT_EQ(part(zero1, "grads"), part(whole, "grads"));
  const double sharded = static_cast<double>(part(zero1, "master") + part(zero1, "optimizer"));
  const double unsharded = static_cast<double>(part(whole, "master") + part(whole, "optimizer"));
  const double peak_whole = whole.at("peak_mem_bytes").get<double>();
  const double peak_zero1 = zero1.at("peak_mem_bytes").get<double>();
  // Saved: 12 bytes (master and moments) for each of the other rank's N / 2 elements;
  // added: 4 (f32 gradient shard) + 2 (bf16 gather input) for N / 2.
  const double expected_saving = static_cast<double>((12 - 4 - 2) * (n / 2));
  const double ratio_whole = peak_whole / whole.at("estimated_mem_bytes").get<double>();
  const double ratio_zero1 = peak_zero1 / zero1.at("estimated_mem_bytes").get<double>();
  std::printf(
      "zero1 (rank 0 of dp 2): %llu parameters; master + moments %.0f bytes, without %.0f "
      "(ratio %.4f); peak %.0f bytes, without %.0f: saving %.0f (expected %.0f); peak / "
      "estimate %.4f, without %.4f\n",
      static_cast<unsigned long long>(n), sharded, unsharded, sharded / unsharded, peak_zero1,
      peak_whole, peak_whole - peak_zero1, expected_saving, ratio_zero1, ratio_whole);
  EXPECT_EQ(peak_whole - peak_zero1, expected_saving);
  EXPECT_LT(std::abs(ratio_whole - 1), 0.01);
  EXPECT_LT(std::abs(ratio_zero1 - 1), 0.01);
}

}  // namespace
}  // namespace loom
