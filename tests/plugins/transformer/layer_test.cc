// transformer_layer: backward against finite differences (GPT-2 style and LLaMA style with
// RoPE and GQA), recomputation policies none / selective / full giving the same gradients
// (dropout on), the fused core inside a layer matching the reference one, and parameters.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

json gpt2_layer() {
  return {{"impl", "transformer_layer"}, {"mlp", {{"impl", "mlp"}, {"activation", "gelu_tanh"}}}};
}

json llama_layer(const std::string& core = "dot_product") {
  return {{"impl", "transformer_layer"},
          {"norm", {{"impl", "rmsnorm"}}},
          {"attention", {{"impl", core}}},
          {"mlp", {{"impl", "mlp"}, {"activation", "swiglu"}}}};
}

json inherited(bool rope, double dropout = 0.0) {
  json o = {{"hidden_size", 8},
            {"num_attention_heads", 4},
            {"num_query_groups", rope ? 2 : 4},
            {"kv_channels", 2},
            {"ffn_hidden_size", 12},
            {"add_bias_linear", !rope},
            {"add_qkv_bias", !rope},
            {"init_std", 0.02},
            {"num_layers", 2},
            {"layer_number", 1},
            {"hidden_dropout", dropout},
            {"attention_dropout", dropout},
            {"position_embedding", rope ? "rope" : "learned"}};
  if (rope) o["rotary"] = {{"base", 100.0}, {"percent", 1.0}};
  return o;
}

Call layer_call(ModuleHarness& h, bool positions, uint64_t seed) {
  TensorView x = h.tensor(DType::kF32, {2, 5, 8});
  h.fill_random(x, seed);
  TensorView pos{};
  if (positions) {  // a packed batch: the second sequence restarts at 0 after three tokens
    pos = h.tensor(DType::kI32, {2, 5});
    int32_t ids[] = {0, 1, 2, 3, 4, 0, 1, 2, 0, 1};
    std::copy(ids, ids + 10, static_cast<int32_t*>(pos.data));
  }
  Call call;
  call.inputs = {x, pos};
  call.differentiable = {true, false};
  call.num_grad_inputs = 2;
  return call;
}

TEST(TransformerLayer, Gpt2StyleMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& layer = build_resolved(h, kinds::kLayer, gpt2_layer(), inherited(false));
  randomize_params(h, 3, 0.3f);
  ModuleCheck(h, layer, layer_call(h, false, 1)).check_gradients();
}

TEST(TransformerLayer, LlamaStyleWithRopeAndGqaMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& layer = build_resolved(h, kinds::kLayer, llama_layer(), inherited(true));
  randomize_params(h, 4, 0.3f);
  ModuleCheck(h, layer, layer_call(h, true, 2)).check_gradients();
}

// MHA with the fused core: q, k, v are views of the QKV projection's output (attention 1.2),
// rope turns them in place, and the core's gradients come back as views of one tensor that
// goes to the projection's backward without a merge.
TEST(TransformerLayer, LlamaStyleMhaOnQkvViewsMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  json options = inherited(true);
  options["num_query_groups"] = 4;
  IModule& layer = build_resolved(h, kinds::kLayer, llama_layer("fused"), options);
  randomize_params(h, 7, 0.3f);
  ModuleCheck(h, layer, layer_call(h, true, 5)).check_gradients();
}

TEST(TransformerLayer, DropoutMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& layer = build_resolved(h, kinds::kLayer, gpt2_layer(), inherited(false, 0.2));
  randomize_params(h, 5, 0.3f);
  ModuleCheck(h, layer, layer_call(h, false, 3)).check_gradients();
}

Result run_layer(const json& node, const json& options, RecomputePolicy policy) {
  ModuleHarness h(transformer_plugins());
  IModule& layer = build_resolved(h, kinds::kLayer, node, options);
  randomize_params(h, 6, 0.3f);
  Call call = layer_call(h, true, 4);
  call.policy = policy;
  return ModuleCheck(h, layer, call).run();
}

TEST(TransformerLayer, RecomputePoliciesGiveTheSameGradients) {
  for (bool rope : {false, true}) {
    json node = rope ? llama_layer() : gpt2_layer();
    Result none = run_layer(node, inherited(rope, 0.2), RecomputePolicy::kNone);
    Result selective = run_layer(node, inherited(rope, 0.2), RecomputePolicy::kSelective);
    Result full = run_layer(node, inherited(rope, 0.2), RecomputePolicy::kFull);
    EXPECT_EQ(none.outputs[0], full.outputs[0]);
    expect_same_grads(selective, none, 1e-6, "selective vs none");
    expect_same_grads(full, none, 1e-6, "full vs none");
  }
}

// The fused core reads the views in place; the reference core copies them (split_qkv) and
// returns packed gradients, which the layer merges: the same layer either way.
TEST(TransformerLayer, QkvViewsGiveTheSameLayerWithEitherCore) {
  json options = inherited(true, 0.2);
  options["num_query_groups"] = 4;
  Result dot = run_layer(llama_layer("dot_product"), options, RecomputePolicy::kNone);
  Result fused = run_layer(llama_layer("fused"), options, RecomputePolicy::kNone);
  EXPECT_LE(relative_diff(fused.outputs[0], dot.outputs[0]), 1e-5);
  expect_same_grads(fused, dot, 1e-5, "fused vs dot_product MHA layer");
  Result full = run_layer(llama_layer("fused"), options, RecomputePolicy::kFull);
  EXPECT_EQ(full.outputs[0], fused.outputs[0]);
  expect_same_grads(full, fused, 1e-6, "full recompute vs none, MHA layer on views");
  // And the same as the copies (split_qkv, merge_qkv), which LOOM_QKV_VIEWS=split forces: the
  // same numbers exactly, for both position embeddings.
  for (bool rope : {true, false}) {
    json o = inherited(rope, 0.2);
    o["num_query_groups"] = 4;
    const json node = rope ? llama_layer("fused") : gpt2_layer();
    Result views = run_layer(node, o, RecomputePolicy::kNone);
    setenv("LOOM_QKV_VIEWS", "split", 1);
    Result split = run_layer(node, o, RecomputePolicy::kNone);
    unsetenv("LOOM_QKV_VIEWS");
    EXPECT_EQ(views.outputs[0], split.outputs[0]) << (rope ? "rope" : "learned");
    expect_same_grads(views, split, 0.0, rope ? "views vs split, rope" : "views vs split");
  }
}

TEST(TransformerLayer, FusedCoreMatchesDotProductCore) {
  Result dot = run_layer(llama_layer("dot_product"), inherited(true, 0.2), RecomputePolicy::kNone);
  Result fused = run_layer(llama_layer("fused"), inherited(true, 0.2), RecomputePolicy::kNone);
  EXPECT_LE(relative_diff(fused.outputs[0], dot.outputs[0]), 1e-5);
  expect_same_grads(fused, dot, 1e-5, "fused vs dot_product layer");
}

TEST(TransformerLayer, DeclaresMegatronParameters) {
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kLayer, llama_layer(), inherited(true));
  std::vector<std::string> names;
  for (auto& p : h.params().all()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"self_attention.linear_qkv.weight",
                                             "self_attention.linear_proj.weight",
                                             "input_layernorm.weight", "pre_mlp_layernorm.weight",
                                             "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"}));
  core::Parameter* qkv = h.params().find("self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv->info.shape[0], (4 + 2 * 2) * 2);  // (H + 2G) * D
  EXPECT_EQ(qkv->info.shape[1], 8);
  EXPECT_EQ(qkv->info.tp_split_dim, 0);
  core::Parameter* proj = h.params().find("self_attention.linear_proj.weight");
  EXPECT_EQ(proj->info.tp_split_dim, 1);
  EXPECT_EQ(proj->info.init, ParamInit::kScaledNormal);
  EXPECT_FLOAT_EQ(proj->info.init_std, 0.01f);
}

TEST(TransformerLayer, QkvWeightHasMegatronsGroupedLayout) {
  // H = 4, G = 2, D = 2: the rows of linear_qkv are [q0 q1 k0 v0 | q2 q3 k1 v1], 2 rows each.
  // Keeping only the rows of v0 (6, 7) makes q = k = 0 and v non-zero: uniform attention
  // over v gives a non-zero output. Keeping only the rows of k0 (4, 5) makes v = 0: the
  // attention output is zero. (With the ungrouped [Q; K; V] layout it would be the reverse.)
  json options = inherited(true);
  options["add_bias_linear"] = false;
  options["add_qkv_bias"] = false;
  for (int64_t first_row : {4, 6}) {
    ModuleHarness h(transformer_plugins());
    IModule& layer = build_resolved(h, kinds::kLayer, llama_layer(), options);
    randomize_params(h, 8, 0.3f);
    core::Parameter* qkv = h.params().find("self_attention.linear_qkv.weight");
    std::vector<float> w = h.values(qkv->value);  // (16, 8)
    for (int64_t row = 0; row < 16; ++row)
      if (row != first_row && row != first_row + 1)
        for (int64_t c = 0; c < 8; ++c) w[static_cast<size_t>(row * 8 + c)] = 0.f;
    h.set_values(qkv->value, w);
    // No MLP: the output is x + attention.
    h.set_values(h.params().find("mlp.linear_fc2.weight")->value, std::vector<float>(8 * 12, 0.f));
    Call call = layer_call(h, false, 9);
    std::vector<float> x = h.values(call.inputs[0]);
    Result r = ModuleCheck(h, layer, call).run();
    double diff = relative_diff(r.outputs[0], x);
    if (first_row == 6)
      EXPECT_GT(diff, 1e-3) << "v0 rows did not reach the values";
    else
      EXPECT_EQ(diff, 0.0) << "k0 rows reached the queries or values";
  }
}

}  // namespace
}  // namespace loom::testing
