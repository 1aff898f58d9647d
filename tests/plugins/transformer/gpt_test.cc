// The gpt model: GPT-2 (tied, learned positions) and LLaMA-style (untied, RoPE with Llama 3
// scaling, GQA, RMSNorm, SwiGLU, no biases) configurations. Backward against finite
// differences of the loss (and of a projection of the logits), recomputation policies,
// parameter names and counts, grads_ready signals (final gradients, once, in backward
// order), and every configuration rule refused with its spec pointer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/optim/bucket_readiness.h"
#include "core/util/errors.h"
#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

json gpt2() {
  return {
      {"impl", "gpt"},
      {"num_layers", 2},
      {"hidden_size", 8},
      {"num_attention_heads", 2},
      {"vocab_size", 11},
      {"max_position_embeddings", 6},
      {"layer",
       {{"impl", "transformer_layer"}, {"mlp", {{"impl", "mlp"}, {"activation", "gelu_tanh"}}}}},
      {"final_norm", {{"impl", "layernorm"}}}};
}

json llama() {
  return {{"impl", "gpt"},
          {"num_layers", 2},
          {"hidden_size", 8},
          {"num_attention_heads", 4},
          {"num_query_groups", 2},
          {"ffn_hidden_size", 12},
          {"vocab_size", 11},
          {"position_embedding", "rope"},
          {"rotary",
           {{"base", 500000},
            {"scaling",
             {{"type", "llama3"}, {"factor", 8}, {"original_max_position_embeddings", 16}}}}},
          {"add_bias_linear", false},
          {"tie_embeddings", false},
          {"layer",
           {{"impl", "transformer_layer"},
            {"norm", {{"impl", "rmsnorm"}}},
            {"mlp", {{"impl", "mlp"}, {"activation", "swiglu"}}}}},
          {"final_norm", {{"impl", "rmsnorm"}}}};
}

json root(bool logits = false, int64_t seq = 4) {
  return {{"seq_length", seq},
          {"micro_batch_size", 2},
          {"params_dtype", "f32"},
          {"device", "cpu"},
          {"return_logits", logits}};
}

// tokens, labels, loss mask (one masked token), position ids (or empty).
Call model_call(ModuleHarness& h, bool positions, bool logits) {
  TensorView tokens = h.tensor(DType::kI32, {2, 4}), labels = h.tensor(DType::kI32, {2, 4});
  TensorView mask = h.tensor(DType::kF32, {2, 4});
  for (int32_t i = 0; i < 8; ++i) {
    static_cast<int32_t*>(tokens.data)[i] = (i * 7 + 3) % 11;
    static_cast<int32_t*>(labels.data)[i] = (i * 5 + 1) % 11;
    static_cast<float*>(mask.data)[i] = i == 6 ? 0.f : 1.f;
  }
  TensorView pos{};
  if (positions) {
    pos = h.tensor(DType::kI32, {2, 4});
    int32_t ids[] = {0, 1, 2, 3, 0, 1, 0, 1};
    std::copy(ids, ids + 8, static_cast<int32_t*>(pos.data));
  }
  Call call;
  call.inputs = {tokens, labels, mask, pos};
  call.differentiable = {false, false, false, false};
  call.num_outputs = logits ? 2 : 1;
  call.num_grad_inputs = 0;
  return call;
}

TEST(Gpt, Gpt2TiedMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& model = build_resolved(h, kinds::kModel, gpt2(), root(true));
  randomize_params(h, 12, 0.3f);
  ModuleCheck(h, model, model_call(h, false, true)).check_gradients(1e-2, 5e-3, 6);
}

TEST(Gpt, LlamaUntiedMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& model = build_resolved(h, kinds::kModel, llama(), root());
  randomize_params(h, 13, 0.3f);
  ModuleCheck(h, model, model_call(h, true, false)).check_gradients(1e-2, 5e-3, 6);
}

TEST(Gpt, LossIsTheMaskedMeanAndLogitsAreReturned) {
  ModuleHarness h(transformer_plugins());
  IModule& model = build_resolved(h, kinds::kModel, gpt2(), root(true));
  Result r = ModuleCheck(h, model, model_call(h, false, true)).run();
  ASSERT_EQ(r.outputs[0].size(), 1u);
  // The vocabulary of 11 padded to 128 columns (make_vocab_size_divisible_by's default): the
  // padding's logits are those of zero rows.
  ASSERT_EQ(r.outputs[1].size(), 2u * 4 * 128);
  for (size_t i = 0; i < r.outputs[1].size(); ++i)
    if (i % 128 >= 11) {
      ASSERT_EQ(r.outputs[1][i], 0.f) << "padding logit " << i;
    }
  // Recompute the masked mean cross entropy from the returned logits, over the vocabulary's
  // 11 columns: near log(11), not log(128), so the padding takes no part.
  double total = 0;
  int count = 0;
  for (int i = 0; i < 8; ++i) {
    if (i == 6) continue;
    const float* row = &r.outputs[1][static_cast<size_t>(i * 128)];
    double m = *std::max_element(row, row + 11), sum = 0;
    for (int v = 0; v < 11; ++v) sum += std::exp(row[v] - m);
    total += m + std::log(sum) - row[(i * 5 + 1) % 11];
    ++count;
  }
  EXPECT_NEAR(r.outputs[0][0], total / count, 1e-5);
  EXPECT_NEAR(r.outputs[0][0], std::log(11.0), 0.1);  // small init: near-uniform predictions
}

TEST(Gpt, RecomputePoliciesGiveTheSameGradients) {
  for (bool use_llama : {false, true}) {
    std::vector<Result> results;
    for (RecomputePolicy policy :
         {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
      ModuleHarness h(transformer_plugins());
      json node = use_llama ? llama() : gpt2();
      node["hidden_dropout"] = 0.1;
      node["attention_dropout"] = 0.1;
      IModule& model = build_resolved(h, kinds::kModel, node, root());
      randomize_params(h, 14, 0.3f);
      Call call = model_call(h, use_llama, false);
      call.policy = policy;
      results.push_back(ModuleCheck(h, model, call).run());
    }
    EXPECT_EQ(results[0].outputs[0], results[2].outputs[0]);
    expect_same_grads(results[1], results[0], 1e-6, "selective vs none");
    expect_same_grads(results[2], results[0], 1e-6, "full vs none");
  }
}

// grads_ready (forward_context 1.2), with which the trainer starts reducing gradient
// buckets during backward: every module that declares parameters signals once, after the
// last change to their gradients (the tied word embedding, which the output layer also
// accumulates into, included), under every recomputation policy; and the parameters'
// backward-order layout lets each bucket go as soon as its module signals.
TEST(Gpt, GradsReadySignalsFinalGradientsOnceInBackwardOrder) {
  for (bool use_llama : {false, true})
    for (RecomputePolicy policy :
         {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
      SCOPED_TRACE(std::string(use_llama ? "llama" : "gpt2") + ", recompute " +
                   std::to_string(static_cast<int>(policy)));
      ModuleHarness h(transformer_plugins());
      json node = use_llama ? llama() : gpt2();
      node["hidden_dropout"] = 0.1;
      IModule& model = build_resolved(h, kinds::kModel, node, root());
      randomize_params(h, 15, 0.3f);
      Call call = model_call(h, use_llama, false);
      std::vector<core::Parameter>& params = h.params().all();
      // One bucket per parameter, in backward order (the last declared first), as
      // ParameterSet lays them out: parameter i is in bucket n - 1 - i.
      size_t n = params.size();
      std::vector<const void*> owners;
      std::vector<std::vector<size_t>> buckets;
      for (const core::Parameter& p : params) owners.push_back(static_cast<IModule*>(p.module));
      for (size_t i = n; i-- > 0;) buckets.push_back({i});
      core::BucketReadiness readiness(owners, buckets);

      std::map<const void*, int> signals;
      std::map<std::string, std::vector<float>> at_signal;
      h.params().zero_grads();
      core::ForwardContext& ctx = h.new_context(true, policy);
      ctx.set_grads_ready([&](const void* owner) {
        ++signals[owner];
        readiness.mark(owner);
        for (size_t i = 0; i < n; ++i) {
          if (owners[i] != owner) continue;
          at_signal[params[i].name] = h.values(params[i].grad);
          EXPECT_LT(n - 1 - i, readiness.released()) << params[i].name << ": bucket held back";
        }
      });
      TensorView loss{};
      throw_if_error(model.forward(&ctx, call.inputs.data(), 4, &loss, 1));
      TensorView dloss = h.tensor(DType::kF32, {});
      h.set_values(dloss, {1.f});
      throw_if_error(model.backward(&ctx, &dloss, 1, nullptr, 0));
      ctx.rethrow_grads_ready_error();

      EXPECT_EQ(readiness.released(), n);
      for (const core::Parameter& p : params) {
        EXPECT_EQ(signals[static_cast<IModule*>(p.module)], 1) << p.name;
        ASSERT_EQ(at_signal.count(p.name), 1u) << p.name;
        EXPECT_EQ(at_signal[p.name], h.values(p.grad)) << p.name << " changed after its signal";
      }
      std::vector<float> word = h.values(h.params().find("embedding.word_embeddings.weight")->grad);
      EXPECT_NE(*std::max_element(word.begin(), word.end()), 0.f);
      EXPECT_EQ(signals.size(), std::set<const void*>(owners.begin(), owners.end()).size())
          << "a module without parameters signalled";
    }
}

// The loss in one pass (cross_entropy_fwd_bwd, when the context holds the loss's gradient
// during the forward, as the trainer's does): the loss and every gradient equal those of the
// two ops (the op pinned to "none") bit for bit, since the CPU kernels compute each row the
// same way; a seed other than 1 shows the kernel reads the context's value.
TEST(Gpt, LossInOnePassGivesTheTwoOpsResultsBitForBit) {
  for (bool use_llama : {false, true}) {
    Result results[2];
    for (int fused = 0; fused < 2; ++fused) {
      ModuleHarness h(transformer_plugins());
      if (!fused) h.plugins().host().set_pins({{"cross_entropy_fwd_bwd", "none"}});
      IModule& model = build_resolved(h, kinds::kModel, use_llama ? llama() : gpt2(), root());
      randomize_params(h, 15, 0.3f);
      Call call = model_call(h, use_llama, false);
      call.loss_grad_in_forward = 0.37f;
      results[fused] = ModuleCheck(h, model, call).run();
    }
    ASSERT_EQ(results[1].outputs[0], results[0].outputs[0]) << "the loss, llama " << use_llama;
    ASSERT_EQ(results[1].param_grads.size(), results[0].param_grads.size());
    for (const auto& [name, grad] : results[0].param_grads)
      EXPECT_EQ(results[1].param_grads.at(name), grad) << name << ", llama " << use_llama;
  }
}

// The forward that computed the logits' gradient from the context's loss_grad refuses a
// backward given another tensor as the loss's gradient (its value is already in the logits'
// gradient); with the op pinned to "none" the same calls run the two ops and succeed.
TEST(Gpt, LossInOnePassRefusesAnotherGradientTensor) {
  for (bool fused : {true, false}) {
    ModuleHarness h(transformer_plugins());
    if (!fused) h.plugins().host().set_pins({{"cross_entropy_fwd_bwd", "none"}});
    IModule& model = build_resolved(h, kinds::kModel, gpt2(), root());
    Call call = model_call(h, false, false);
    TensorView seed = h.tensor(DType::kF32, {}), other = h.tensor(DType::kF32, {});
    h.set_values(seed, {1.f});
    h.set_values(other, {1.f});
    core::ForwardContext& ctx = h.new_context(true);
    ctx.set_loss_grad(seed);
    TensorView loss{};
    throw_if_error(model.forward(&ctx, call.inputs.data(), 4, &loss, 1));
    Status s = model.backward(&ctx, &other, 1, nullptr, 0);
    std::string message = s.code == Code::kOk ? "" : take_message(&s);
    if (fused) {
      EXPECT_EQ(s.code, Code::kInvalidArgument);
      EXPECT_NE(message.find("grad_outputs[0] is another tensor; pass loss_grad() itself"),
                std::string::npos)
          << message;
    } else {
      EXPECT_EQ(s.code, Code::kOk) << message;
    }
  }
}

TEST(Gpt, EvaluationNeedsNoBackwardState) {
  ModuleHarness h(transformer_plugins());
  json node = gpt2();
  node["hidden_dropout"] = 0.5;  // off outside training
  IModule& model = build_resolved(h, kinds::kModel, node, root());
  Call call = model_call(h, false, false);
  std::vector<float> losses;
  for (int i = 0; i < 2; ++i) {
    IForwardContext& ctx = h.new_context(false);
    TensorView loss{};
    throw_if_error(model.forward(&ctx, call.inputs.data(), 4, &loss, 1));
    losses.push_back(h.values(loss)[0]);
  }
  EXPECT_EQ(losses[0], losses[1]);
}

std::vector<std::string> names(ModuleHarness& h) {
  std::vector<std::string> out;
  for (auto& p : h.params().all()) out.push_back(p.name);
  return out;
}

std::vector<std::string> layer_names(int i, bool biases, bool layernorm) {
  std::string l = "decoder.layers." + std::to_string(i) + ".";
  std::vector<std::string> out = {l + "self_attention.linear_qkv.weight"};
  if (biases) out.push_back(l + "self_attention.linear_qkv.bias");
  out.push_back(l + "self_attention.linear_proj.weight");
  if (biases) out.push_back(l + "self_attention.linear_proj.bias");
  out.push_back(l + "input_layernorm.weight");
  if (layernorm) out.push_back(l + "input_layernorm.bias");
  out.push_back(l + "pre_mlp_layernorm.weight");
  if (layernorm) out.push_back(l + "pre_mlp_layernorm.bias");
  out.push_back(l + "mlp.linear_fc1.weight");
  if (biases) out.push_back(l + "mlp.linear_fc1.bias");
  out.push_back(l + "mlp.linear_fc2.weight");
  if (biases) out.push_back(l + "mlp.linear_fc2.bias");
  return out;
}

TEST(Gpt, Gpt2ParameterNamesAndCount) {
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kModel, gpt2(), root());
  std::vector<std::string> want = {"embedding.word_embeddings.weight",
                                   "embedding.position_embeddings.weight"};
  for (int i = 0; i < 2; ++i)
    for (auto& n : layer_names(i, true, true)) want.push_back(n);
  want.push_back("decoder.final_layernorm.weight");
  want.push_back("decoder.final_layernorm.bias");
  EXPECT_EQ(names(h), want);
  // Vp*C + P*C + L * (qkv 3C*C + 3C, proj C*C + C, 2 norms 4C, fc1 4C*C + 4C, fc2 4C*C + C) +
  // 2C, with the vocabulary of 11 padded to Vp = 128 rows (11 valid)
  EXPECT_EQ(h.params().numel(),
            128 * 8 + 6 * 8 + 2 * (24 * 8 + 24 + 64 + 8 + 32 + 256 + 32 + 256 + 8) + 16);
  core::Parameter* word = h.params().find("embedding.word_embeddings.weight");
  EXPECT_TRUE(word->info.flags & kParamTiedEmbedding);
  EXPECT_EQ(word->info.tp_split_dim, 0);
  EXPECT_EQ(word->info.shape[0], 128);
  EXPECT_EQ(word->valid_rows(), 11);
  EXPECT_EQ(h.params().find("embedding.position_embeddings.weight")->info.shape[0], 6);
  EXPECT_TRUE(h.params().find("decoder.layers.1.mlp.linear_fc1.bias")->info.flags &
              kParamNoWeightDecay);
  EXPECT_FALSE(h.params().find("decoder.layers.1.mlp.linear_fc1.weight")->info.flags &
               kParamNoWeightDecay);
}

TEST(Gpt, LlamaParameterNamesAndCount) {
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kModel, llama(), root());
  std::vector<std::string> want = {"embedding.word_embeddings.weight"};
  for (int i = 0; i < 2; ++i)
    for (auto& n : layer_names(i, false, false)) want.push_back(n);
  want.push_back("decoder.final_layernorm.weight");
  want.push_back("output_layer.weight");
  EXPECT_EQ(names(h), want);
  // Vp*C + L * (qkv (H+2G)D*C, proj C*HD, 2 norms, fc1 2F*C, fc2 C*F) + C + Vp*C (Vp = 128,
  // the vocabulary of 11 padded)
  EXPECT_EQ(h.params().numel(), 1024 + 2 * (16 * 8 + 64 + 16 + 24 * 8 + 8 * 12) + 8 + 1024);
  EXPECT_EQ(h.params().find("output_layer.weight")->valid_rows(), 11);
  EXPECT_FALSE(h.params().find("embedding.word_embeddings.weight")->info.flags &
               kParamTiedEmbedding);
  EXPECT_EQ(h.params().find("output_layer.weight")->info.tp_split_dim, 0);
}

TEST(Gpt, BfloatRunsCloseToF32) {
  std::vector<float> losses;
  for (const char* dtype : {"f32", "bf16"}) {
    ModuleHarness h(transformer_plugins());
    json options = root();
    options["params_dtype"] = dtype;
    IModule& model = build_resolved(h, kinds::kModel, llama(), options);
    Call call = model_call(h, true, false);
    Result r = ModuleCheck(h, model, call).run();
    losses.push_back(r.outputs[0][0]);
    double norm = 0;
    for (auto& [name, g] : r.param_grads)
      for (float x : g) norm += static_cast<double>(x) * x;
    EXPECT_TRUE(std::isfinite(norm) && norm > 0) << dtype;
  }
  EXPECT_NEAR(losses[1], losses[0], 2e-2);
}

// A rule broken: the build fails with a spec error at `pointer`, mentioning `words`.
void expect_refused(json node, json options, const std::string& pointer, const std::string& words) {
  ModuleHarness h(transformer_plugins());
  try {
    build_resolved(h, kinds::kModel, node, options);
    ADD_FAILURE() << "built; expected a refusal at " << pointer;
  } catch (const core::SpecError& e) {
    EXPECT_EQ(e.pointer(), pointer) << e.what();
    EXPECT_NE(e.problem().find(words), std::string::npos) << e.what();
  }
}

TEST(GptRules, HeadsMustDivideHiddenSize) {
  json node = gpt2();
  node["num_attention_heads"] = 3;
  expect_refused(node, root(), "/test/num_attention_heads", "does not divide hidden_size 8");
  node["kv_channels"] = 4;  // an explicit head dimension lifts the rule (Megatron)
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kModel, node, root());
  EXPECT_EQ(h.params().find("decoder.layers.0.self_attention.linear_qkv.weight")->info.shape[0],
            3 * 3 * 4);
}

TEST(GptRules, GroupsMustDivideHeads) {
  json node = llama();
  node["num_query_groups"] = 3;
  expect_refused(node, root(), "/test/num_query_groups", "does not divide num_attention_heads 4");
}

TEST(GptRules, LearnedPositionsMustCoverTheSequence) {
  expect_refused(gpt2(), root(false, 7), "/train/seq_length", "max_position_embeddings 6");
  json rope = llama();  // rotary embeddings have no such limit
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kModel, rope, root(false, 4096));
}

TEST(GptRules, RotaryDimensionMustBeEven) {
  json node = llama();  // head dimension 2: half of it is one channel
  node["rotary"]["percent"] = 0.5;
  expect_refused(node, root(), "/test/rotary/percent", "must be even");
}

TEST(GptRules, Llama3FactorsMustBeOrdered) {
  json node = llama();
  node["rotary"]["scaling"]["low_freq_factor"] = 4;
  node["rotary"]["scaling"]["high_freq_factor"] = 2;
  expect_refused(node, root(), "/test/rotary/scaling/high_freq_factor", "must exceed");
}

TEST(GptRules, SchemaRefusesOutOfRangeValues) {
  json node = gpt2();
  node["hidden_dropout"] = 1.0;
  expect_refused(node, root(), "/test/hidden_dropout", "");
  node = gpt2();
  node["layer"]["mlp"]["activation"] = "relu";
  expect_refused(node, root(), "/test/layer/mlp/activation", "");
}

TEST(GptRules, AMissingLayerNodeIsNamed) {
  json node = gpt2();
  node.erase("layer");
  expect_refused(node, root(), "/test", "missing required key 'layer'");
}

}  // namespace
}  // namespace loom::testing
