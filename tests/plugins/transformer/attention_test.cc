// The attention cores: dot_product (reference) and fused. Backward against finite
// differences (GQA, with and without dropout), the two cores against each other (dropout
// included: the same Philox mask), and selective recomputation.
#include <gtest/gtest.h>
#include <loom/cpp/nn/qkv_views.h>

#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

struct Shape {
  int64_t b, t, h, g, d;
};

Call attention_call(ModuleHarness& h, Shape s, uint64_t seed, bool segments = false) {
  TensorView q = h.tensor(DType::kF32, {s.b, s.t, s.h, s.d});
  TensorView k = h.tensor(DType::kF32, {s.b, s.t, s.g, s.d});
  TensorView v = h.tensor(DType::kF32, {s.b, s.t, s.g, s.d});
  h.fill_random(q, seed, 0.8f);
  h.fill_random(k, seed + 1, 0.8f);
  h.fill_random(v, seed + 2);
  TensorView seg{};
  if (segments) {  // two documents per sequence
    seg = h.tensor(DType::kI32, {s.b, s.t});
    for (int64_t i = 0; i < s.b * s.t; ++i)
      static_cast<int32_t*>(seg.data)[i] = (i % s.t) < s.t / 2 ? 0 : 1;
  }
  Call call;
  call.inputs = {q, k, v, seg, TensorView{}};
  call.differentiable = {true, true, true, false, false};
  call.num_grad_inputs = 3;
  return call;
}

struct CoreCase {
  std::string impl;
  float dropout;
};

class CoreTest : public ::testing::TestWithParam<CoreCase> {};

TEST_P(CoreTest, BackwardMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& core = build_resolved(h, kinds::kAttention, {{"impl", GetParam().impl}},
                                 {{"attention_dropout", GetParam().dropout}});
  ModuleCheck check(h, core, attention_call(h, {2, 5, 4, 2, 3}, 11));
  check.check_gradients();
}

TEST_P(CoreTest, NonCausalWithSegmentsMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& core =
      build_resolved(h, kinds::kAttention, {{"impl", GetParam().impl}, {"causal", false}},
                     {{"attention_dropout", GetParam().dropout}});
  ModuleCheck check(h, core, attention_call(h, {1, 6, 2, 1, 4}, 21, true));
  check.check_gradients();
}

INSTANTIATE_TEST_SUITE_P(Cores, CoreTest,
                         ::testing::Values(CoreCase{"dot_product", 0.f},
                                           CoreCase{"dot_product", 0.3f}, CoreCase{"fused", 0.f},
                                           CoreCase{"fused", 0.3f}),
                         [](const auto& info) {
                           return info.param.impl + (info.param.dropout > 0 ? "_dropout" : "");
                         });

struct Comparison {
  Shape shape;
  float dropout;
  bool causal, segments;
};

class DotVsFused : public ::testing::TestWithParam<Comparison> {};

Result run_core(const std::string& impl, const Comparison& c, RecomputePolicy policy) {
  ModuleHarness h(transformer_plugins());
  IModule& core = build_resolved(h, kinds::kAttention, {{"impl", impl}, {"causal", c.causal}},
                                 {{"attention_dropout", c.dropout}});
  Call call = attention_call(h, c.shape, 31, c.segments);
  call.policy = policy;
  return ModuleCheck(h, core, call).run();
}

TEST_P(DotVsFused, SameOutputsAndGradients) {
  Result dot = run_core("dot_product", GetParam(), RecomputePolicy::kNone);
  Result fused = run_core("fused", GetParam(), RecomputePolicy::kNone);
  EXPECT_LE(relative_diff(fused.outputs[0], dot.outputs[0]), 1e-5);
  expect_same_grads(fused, dot, 1e-5, "fused vs dot_product");
  if (GetParam().dropout > 0) {  // dropout really dropped something
    Result plain =
        run_core("dot_product", {GetParam().shape, 0.f, GetParam().causal, GetParam().segments},
                 RecomputePolicy::kNone);
    EXPECT_GT(relative_diff(plain.outputs[0], dot.outputs[0]), 1e-2);
  }
}

TEST_P(DotVsFused, SelectiveRecomputeGivesTheSameGradients) {
  for (const char* impl : {"dot_product", "fused"}) {
    Result none = run_core(impl, GetParam(), RecomputePolicy::kNone);
    Result selective = run_core(impl, GetParam(), RecomputePolicy::kSelective);
    expect_same_grads(selective, none, 1e-6, std::string(impl) + " selective vs none");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DotVsFused,
    ::testing::Values(Comparison{{2, 7, 4, 4, 8}, 0.f, true, false},    // MHA
                      Comparison{{2, 7, 4, 2, 8}, 0.f, true, false},    // GQA
                      Comparison{{1, 9, 6, 1, 4}, 0.f, false, true},    // MQA, segments
                      Comparison{{2, 7, 4, 2, 8}, 0.25f, true, false},  // GQA + dropout
                      Comparison{{1, 33, 2, 1, 16}, 0.1f, true, true}));

// Attention 1.2: q, k, v passed as the views of one fused QKV tensor (loom/cpp/nn/qkv_views.h)
// give the outputs and gradients of the same values passed packed; the fused core reads
// them in place and returns its gradients as the same views of one new tensor, the
// reference core copies them and returns packed gradients.
TEST(FusedQkvViews, SameResultsAsPackedInputs) {
  const Shape s{2, 7, 3, 3, 4};
  for (const char* impl : {"dot_product", "fused"})
    for (float dropout : {0.f, 0.2f}) {
      const std::string what = std::string(impl) + " dropout " + std::to_string(dropout);
      Comparison c{s, dropout, true, true};
      Result packed = run_core(impl, c, RecomputePolicy::kNone);

      ModuleHarness h(transformer_plugins());
      IModule& core = build_resolved(h, kinds::kAttention, {{"impl", impl}, {"causal", true}},
                                     {{"attention_dropout", dropout}});
      // The fused tensor holding attention_call's q, k, v values (same seeds).
      Call ref = attention_call(h, s, 31, true);
      TensorView x = h.tensor(DType::kF32, {s.b, s.t, s.h, 3 * s.d});
      nn::QkvViews views;
      ASSERT_TRUE(nn::fused_qkv_views(x, &views));
      std::vector<float> xv(static_cast<size_t>(numel(x)));
      for (int part = 0; part < 3; ++part) {
        std::vector<float> src = h.values(ref.inputs[part]);
        for (int64_t r = 0; r < s.b * s.t * s.h; ++r)
          for (int64_t i = 0; i < s.d; ++i) xv[r * 3 * s.d + part * s.d + i] = src[r * s.d + i];
      }
      h.set_values(x, xv);
      ASSERT_TRUE(present(nn::fused_qkv_of(views.q, views.k, views.v)));
      Call call = ref;
      call.inputs[0] = views.q, call.inputs[1] = views.k, call.inputs[2] = views.v;
      Result fused = ModuleCheck(h, core, call).run();
      ASSERT_EQ(fused.outputs.size(), packed.outputs.size());
      EXPECT_EQ(fused.outputs[0], packed.outputs[0]) << what;
      expect_same_grads(fused, packed, 0.0, what + ": views vs packed");
      // The gradients' layout, from one more forward and backward.
      IForwardContext& ctx = h.new_context(true);
      TensorView out{};
      throw_if_error(core.forward(&ctx, call.inputs.data(), 5, &out, 1));
      TensorView grads[3]{};
      throw_if_error(core.backward(&ctx, &out, 1, grads, 3));
      const bool fused_grads = present(nn::fused_qkv_of(grads[0], grads[1], grads[2]));
      EXPECT_EQ(fused_grads, std::string(impl) == "fused") << what;
    }
}

}  // namespace
}  // namespace loom::testing
