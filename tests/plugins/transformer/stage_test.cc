// The gpt model's 1.1 contract against the whole model as the oracle: built as pipeline
// stages (with and without virtual chunks) and chained by hand, the stages give the whole
// model's loss and, parameter by parameter, its gradients (a tied table's two copies summed,
// as the embedding group does); the split backward (backward with defer_weight_grads, then
// backward_weight) gives the joint backward's gradients bit for bit; the loss comes back as
// (sum, tokens) too; info and cost describe the stage; a layout that does not split is
// refused with the rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/component/builder.h"
#include "core/runtime/forward_context.h"
#include "core/runtime/parameters.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"
#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

json gpt(bool tied) {
  return {{"impl", "gpt"},
          {"num_layers", 4},
          {"hidden_size", 8},
          {"num_attention_heads", 2},
          {"vocab_size", 11},
          {"max_position_embeddings", 4},
          {"tie_embeddings", tied},
          {"hidden_dropout", 0.1},
          {"layer", {{"impl", "transformer_layer"}, {"mlp", {{"impl", "mlp"}}}}},
          {"final_norm", {{"impl", "layernorm"}}}};
}

json inherited(int32_t rank = 0, int32_t size = 1, int32_t chunk = 0, int32_t chunks = 1) {
  json o = {{"seq_length", 4}, {"micro_batch_size", 2}, {"params_dtype", "f32"}, {"device", "cpu"}};
  if (size > 1 || chunks > 1)
    o["pipeline"] = {{"rank", rank}, {"size", size}, {"chunk", chunk}, {"chunks", chunks}};
  return o;
}

// A model built from a resolved node, with its parameters.
struct Built {
  Built(ModuleHarness& h, const json& node, const json& from) {
    object = core::build_component(h.plugins(), node, kinds::kModel, "/model", from);
    model = interface_cast<IModel>(object.get());
    params = std::make_unique<core::ParameterSet>(h.plugins().host(), *model, kCpu);
  }
  ModelInfo info() const {
    ModelInfo i{};
    i.struct_size = sizeof(ModelInfo);
    throw_if_error(model->info(&i));
    return i;
  }
  ObjectPtr object;
  IModel* model = nullptr;
  std::unique_ptr<core::ParameterSet> params;
};

std::vector<float> values(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(numel(v)));
  core::load_floats(v, out.data());
  return out;
}

// The batch: tokens, labels, a mask with one token left out, no positions or segments.
struct Batch {
  explicit Batch(ModuleHarness& h) {
    tokens = h.tensor(DType::kI32, {2, 4});
    labels = h.tensor(DType::kI32, {2, 4});
    mask = h.tensor(DType::kF32, {2, 4});
    for (int32_t i = 0; i < 8; ++i) {
      static_cast<int32_t*>(tokens.data)[i] = (i * 7 + 3) % 11;
      static_cast<int32_t*>(labels.data)[i] = (i * 5 + 1) % 11;
      static_cast<float*>(mask.data)[i] = i == 6 ? 0.f : 1.f;
    }
  }
  std::vector<TensorView> inputs(const TensorView& hidden = TensorView{}) const {
    return {tokens, labels, mask, TensorView{}, TensorView{}, hidden};
  }
  TensorView tokens, labels, mask;
};

// Forward and backward of the whole model; returns the loss and fills `grads` by name.
double whole_pass(ModuleHarness& h, Built& m, const Batch& batch,
                  std::map<std::string, std::vector<float>>& grads, bool split = false,
                  RecomputePolicy policy = RecomputePolicy::kNone) {
  m.params->zero_grads();
  core::ForwardContext ctx(h.plugins().host(), true, policy, 0, 7, 1, &m.params->module_ids());
  std::vector<TensorView> in = batch.inputs();
  TensorView out[5] = {};
  throw_if_error(m.model->forward(&ctx, in.data(), 5, out, 5));
  double loss = values(out[0])[0];
  float one = 1.f;
  TensorView dloss = make_view(&one, DType::kF32, nullptr, 0);
  ctx.set_defer_weight_grads(split);
  throw_if_error(m.model->backward(&ctx, &dloss, 1, nullptr, 0));
  if (split) throw_if_error(m.model->backward_weight(&ctx));
  for (core::Parameter& p : m.params->all()) grads[p.name] = values(p.grad);
  return loss;
}

void copy_values(core::ParameterSet& from, core::ParameterSet& to) {
  for (core::Parameter& p : to.all()) {
    core::Parameter* src = from.find(p.name);
    ASSERT_NE(src, nullptr) << p.name;
    std::vector<float> v = values(src->value);
    core::store_floats(v.data(), p.value);
  }
}

class StageTest : public ::testing::TestWithParam<std::tuple<bool, int32_t, int32_t>> {};

TEST_P(StageTest, ChainedStagesGiveTheWholeModelsLossAndGradients) {
  auto [tied, pp, chunks] = GetParam();
  ModuleHarness h(transformer_plugins());
  json node = resolved(h, kinds::kModel, gpt(tied));
  Batch batch(h);
  Built whole(h, node, inherited());
  whole.params->initialize(5);
  std::map<std::string, std::vector<float>> want;
  double want_loss = whole_pass(h, whole, batch, want);

  // Every virtual stage v = chunk * pp + rank, built and chained in order.
  const int32_t stages = pp * chunks;
  std::vector<std::unique_ptr<Built>> chain;
  for (int32_t v = 0; v < stages; ++v) {
    chain.push_back(std::make_unique<Built>(h, node, inherited(v % pp, pp, v / pp, chunks)));
    copy_values(*whole.params, *chain.back()->params);
    chain.back()->params->zero_grads();
    ModelInfo info = chain.back()->info();
    EXPECT_EQ(info.layer_begin, v * 4 / stages);
    EXPECT_EQ(info.layer_end, (v + 1) * 4 / stages);
    EXPECT_EQ(info.first_stage, v == 0 ? 1 : 0);
    EXPECT_EQ(info.last_stage, v == stages - 1 ? 1 : 0);
    EXPECT_EQ(std::vector<int64_t>(info.hidden.shape, info.hidden.shape + info.hidden.ndim),
              (std::vector<int64_t>{2, 4, 8}));
  }
  // Forward down the chain, each stage in its own context (its micro-batch's, as the
  // schedule executor keeps one per stage).
  std::vector<std::unique_ptr<core::ForwardContext>> ctxs;
  TensorView hidden{};
  double loss = 0;
  for (int32_t v = 0; v < stages; ++v) {
    Built& s = *chain[static_cast<size_t>(v)];
    ctxs.push_back(std::make_unique<core::ForwardContext>(
        h.plugins().host(), true, RecomputePolicy::kNone, 0, 7, 1, &s.params->module_ids()));
    std::vector<TensorView> in = batch.inputs(hidden);
    TensorView out[5] = {};
    throw_if_error(s.model->forward(ctxs.back().get(), in.data(), v == 0 ? 5 : 6, out, 5));
    if (v + 1 < stages) {
      EXPECT_EQ(out[0].data, nullptr) << "a middle stage gave a loss";
      hidden = out[2];
    } else {
      loss = values(out[0])[0];
    }
  }
  EXPECT_EQ(loss, want_loss) << "the stages' loss differs from the whole model's";
  // Backward up the chain.
  TensorView grad{};
  float one = 1.f;
  for (int32_t v = stages - 1; v >= 0; --v) {
    Built& s = *chain[static_cast<size_t>(v)];
    TensorView gout[3] = {make_view(&one, DType::kF32, nullptr, 0), TensorView{}, grad};
    TensorView gin[6] = {};
    throw_if_error(s.model->backward(ctxs[static_cast<size_t>(v)].get(),
                                     v + 1 == stages ? gout : gout, v + 1 == stages ? 1 : 3, gin,
                                     v == 0 ? 0 : 6));
    grad = gin[5];
  }
  // Every parameter of the whole model once, from the stage that holds it (a tied table
  // from both ends, summed); layers keep their global numbers in their names.
  std::map<std::string, std::vector<float>> got;
  for (auto& s : chain)
    for (core::Parameter& p : s->params->all()) {
      std::vector<float> g = values(p.grad);
      auto [it, fresh] = got.emplace(p.name, g);
      if (!fresh)
        for (size_t i = 0; i < g.size(); ++i) it->second[i] += g[i];
    }
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, g] : want) {
    ASSERT_TRUE(got.count(name)) << name << " is on no stage";
    double diff = relative_diff(got[name], g);
    EXPECT_LE(diff, 1e-6) << name << ": achieved relative difference " << diff;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, StageTest,
                         ::testing::Values(std::make_tuple(false, 2, 1),
                                           std::make_tuple(true, 2, 1), std::make_tuple(true, 2, 2),
                                           std::make_tuple(false, 4, 1)));

TEST(Gpt11, SplitBackwardGivesTheJointBackwardsGradientsBitForBit) {
  for (RecomputePolicy policy : {RecomputePolicy::kNone, RecomputePolicy::kFull}) {
    for (bool tied : {true, false}) {
      ModuleHarness h(transformer_plugins());
      Built m(h, resolved(h, kinds::kModel, gpt(tied)), inherited());
      m.params->initialize(9);
      Batch batch(h);
      std::map<std::string, std::vector<float>> joint, split;
      double a = whole_pass(h, m, batch, joint, false, policy);
      double b = whole_pass(h, m, batch, split, true, policy);
      EXPECT_EQ(a, b);
      for (const auto& [name, g] : joint) EXPECT_EQ(split[name], g) << name;
    }
  }
}

TEST(Gpt11, DeferredWeightGradientsWaitForBackwardWeight) {
  ModuleHarness h(transformer_plugins());
  Built m(h, resolved(h, kinds::kModel, gpt(false)), inherited());
  m.params->initialize(3);
  Batch batch(h);
  m.params->zero_grads();
  core::ForwardContext ctx(h.plugins().host(), true, RecomputePolicy::kNone, 0, 7, 1,
                           &m.params->module_ids());
  std::vector<TensorView> in = batch.inputs();
  TensorView out[5] = {};
  throw_if_error(m.model->forward(&ctx, in.data(), 5, out, 5));
  float one = 1.f;
  TensorView dloss = make_view(&one, DType::kF32, nullptr, 0);
  ctx.set_defer_weight_grads(true);
  throw_if_error(m.model->backward(&ctx, &dloss, 1, nullptr, 0));
  auto norm2 = [&](const char* name) {
    double s = 0;
    for (float x : values(m.params->find(name)->grad)) s += static_cast<double>(x) * x;
    return s;
  };
  // The GEMMs' weights (and the embedding tables) wait; the norms do not.
  EXPECT_EQ(norm2("decoder.layers.0.self_attention.linear_qkv.weight"), 0.0);
  EXPECT_EQ(norm2("decoder.layers.3.mlp.linear_fc2.weight"), 0.0);
  EXPECT_EQ(norm2("output_layer.weight"), 0.0);
  EXPECT_EQ(norm2("embedding.word_embeddings.weight"), 0.0);
  EXPECT_GT(norm2("decoder.layers.0.input_layernorm.weight"), 0.0);
  throw_if_error(m.model->backward_weight(&ctx));
  EXPECT_GT(norm2("decoder.layers.0.self_attention.linear_qkv.weight"), 0.0);
  EXPECT_GT(norm2("embedding.word_embeddings.weight"), 0.0);
}

TEST(Gpt11, TheLossComesBackAsSumAndTokensTooAndCostCountsTheParameters) {
  ModuleHarness h(transformer_plugins());
  Built m(h, resolved(h, kinds::kModel, gpt(true)), inherited());
  m.params->initialize(4);
  Batch batch(h);
  core::ForwardContext ctx(h.plugins().host(), false, RecomputePolicy::kNone, 0, 7, 1,
                           &m.params->module_ids());
  std::vector<TensorView> in = batch.inputs();
  TensorView out[5] = {};
  throw_if_error(m.model->forward(&ctx, in.data(), 5, out, 5));
  double mean = values(out[0])[0], sum = values(out[3])[0], tokens = values(out[4])[0];
  EXPECT_EQ(tokens, 7.0);  // eight tokens, one masked
  EXPECT_NEAR(sum / tokens, mean, 1e-6 * mean) << "sum / tokens vs the mean";
  // 6 per parameter (tensor-parallel slices whole) plus 6 L T (H D) for attention.
  double n = 0;
  for (core::Parameter& p : m.params->all()) n += static_cast<double>(p.numel());
  CostQuery q{sizeof(CostQuery), 2, 4, RecomputePolicy::kNone, 0};
  ModelCost c{};
  c.struct_size = sizeof(ModelCost);
  throw_if_error(m.model->cost(&q, &c));
  EXPECT_DOUBLE_EQ(c.flops_per_token, 6 * n + 6.0 * 4 * 4 * 8);
  EXPECT_GT(c.activation_bytes, 0);
  ModelInfo info = m.info();
  EXPECT_EQ(info.vocab_size, 11);
  EXPECT_EQ(info.max_sequence, 4);
  EXPECT_EQ(info.positions_bounded, 1);
}

TEST(Gpt11, LayersThatDoNotSplitOverTheStagesAreRefused) {
  ModuleHarness h(transformer_plugins());
  json node = resolved(h, kinds::kModel, gpt(false));
  node["num_layers"] = 3;
  try {
    Built m(h, node, inherited(0, 2));
    ADD_FAILURE() << "3 layers over 2 stages were accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("spec /model/num_layers: 3 layers do not split "
                                               "evenly over 2 pipeline stages x 1 virtual chunks"));
  }
}

}  // namespace
}  // namespace loom::testing
