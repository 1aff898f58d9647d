// nn::Linear's FP8 weights kept across the passes of one parameter version
// (IForwardContext::param_version, forward_context 1.9), on a swiglu MLP with delayed
// scaling (fc1 and fc2 are FP8 sites; fc2's input comes quantised from swiglu_fp8_fwd):
//   - a pass under the version of an earlier pass reads the weights that pass quantised:
//     after the weights are changed in place, its outputs, input gradient and weight
//     gradients are still the first pass's, to the bit (so it did not quantise again);
//   - a pass under a new version quantises the weights it sees: the bits of a pass that keeps
//     nothing (version 0), which differ from the first pass's;
//   - outside training the version is 0 whatever was set, and nothing kept is read;
//   - a kept weight is not the context's memory: the context of a pass that reads it holds
//     W^T's bytes less (one byte a weight of both sites), the kept copies live outside it.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/runtime/forward_context.h"
#include "loom/cpp/error.h"
#include "loom/cpp/object.h"
#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

// hidden 32, ffn 64 (fc1: 128 x 32, fc2: 32 x 64), bf16; 2 x 16 tokens.
constexpr int64_t kHidden = 32, kFfn = 64, kBatch = 2, kSeq = 16;

struct Pass {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> dw;
  uint64_t context_bytes = 0;  // what the context held after the forward
};

class Fp8WeightCacheTest : public ::testing::Test {
 protected:
  Fp8WeightCacheTest() : h_({"kernels/cpu", "plugins/transformer", "plugins/fp8"}) {
    json recipe = resolved(h_, kinds::kFp8Recipe, {{"impl", "delayed"}, {"amax_history_len", 4}});
    recipe_object_ = core::build_component(h_.plugins(), recipe, kinds::kFp8Recipe,
                                           "/precision/fp8", {{"device", "cpu"}});
    recipe_ = interface_cast<IFp8Recipe>(recipe_object_.get());
    mlp_ = &build_resolved(h_, kinds::kMlp, {{"impl", "mlp"}, {"activation", "swiglu"}},
                           {{"hidden_size", kHidden},
                            {"ffn_hidden_size", kFfn},
                            {"add_bias_linear", false},
                            {"init_std", 0.02},
                            {"num_layers", 2},
                            {"params_dtype", "bf16"}},
                           recipe_);
    randomize_params(h_, 11, 0.2f);
    x_ = h_.tensor(DType::kBF16, {kBatch, kSeq, kHidden});
    h_.fill_random(x_, 3);
    dy_ = h_.tensor(DType::kBF16, {kBatch, kSeq, kHidden});
    h_.fill_random(dy_, 4);
  }

  // Forward (and backward when training) on a fresh context under `version`, the parameter
  // gradients zeroed first.
  Pass run(uint64_t version, bool training = true) {
    h_.params().zero_grads();
    core::ForwardContext ctx(h_.plugins().host(), training, RecomputePolicy::kNone, 0, h_.seed(),
                             1);
    ctx.set_param_version(version);
    Pass out;
    TensorView y{};
    throw_if_error(mlp_->forward(&ctx, &x_, 1, &y, 1), "mlp forward");
    out.y = h_.values(y);
    out.context_bytes = ctx.bytes_allocated();
    if (!training) return out;
    TensorView dx{};
    throw_if_error(mlp_->backward(&ctx, &dy_, 1, &dx, 1), "mlp backward");
    out.dx = h_.values(dx);
    for (core::Parameter& p : h_.params().all()) out.dw[p.name] = h_.values(p.grad);
    return out;
  }
  // Every weight times `factor`, in place (the kept copies are not told).
  void scale_weights(float factor) {
    for (core::Parameter& p : h_.params().all()) {
      std::vector<float> v = h_.values(p.value);
      for (float& e : v) e *= factor;
      h_.set_values(p.value, v);
    }
  }

  ModuleHarness h_;
  ObjectPtr recipe_object_;
  IFp8Recipe* recipe_ = nullptr;
  IModule* mlp_ = nullptr;
  TensorView x_{}, dy_{};
};

void expect_same(const Pass& a, const Pass& b, const std::string& what) {
  EXPECT_EQ(a.y, b.y) << what << ": output";
  EXPECT_EQ(a.dx, b.dx) << what << ": input gradient";
  EXPECT_EQ(a.dw, b.dw) << what << ": weight gradients";
}

TEST_F(Fp8WeightCacheTest, APassReadsTheWeightsItsVersionQuantised) {
  const Pass first = run(7);
  ASSERT_EQ(first.dw.size(), 2u) << "fc1 and fc2";
  scale_weights(1.5f);
  // The same version: the kept copies of the weights before the change.
  const Pass again = run(7);
  expect_same(first, again, "the same version after the weights changed");
  // A new version quantises the changed weights, as a pass that keeps nothing does.
  const Pass next = run(8);
  const Pass plain = run(0);
  expect_same(next, plain, "a new version against version 0");
  EXPECT_NE(next.y, first.y) << "the changed weights give another output";
  // Version 8's copies are current: a second pass under it reads them.
  expect_same(run(8), plain, "version 8 again");
}

TEST_F(Fp8WeightCacheTest, EvaluationReadsNoKeptWeight) {
  run(7);
  scale_weights(0.5f);
  const Pass eval = run(7, false);
  const Pass plain = run(0, false);
  EXPECT_EQ(eval.y, plain.y) << "outside training the version is 0: the weights now";
  EXPECT_NE(eval.y, run(7).y) << "while a training pass of version 7 reads the kept copies";
}

TEST_F(Fp8WeightCacheTest, KeptWeightsAreNotTheContextsMemory) {
  const Pass plain = run(0);
  const Pass kept = run(7);
  // Version 0 saves W^T of fc1 (32 x 128) and fc2 (64 x 32), one byte an element, and each
  // weight's scale_inv (f32); a kept copy holds them outside the context.
  const uint64_t expected = (kHidden * 2 * kFfn + kFfn * kHidden) + 2 * sizeof(float);
  std::printf("context after the forward: %llu bytes keeping nothing, %llu with kept weights\n",
              static_cast<unsigned long long>(plain.context_bytes),
              static_cast<unsigned long long>(kept.context_bytes));
  EXPECT_EQ(plain.context_bytes - kept.context_bytes, expected);
  expect_same(plain, kept, "kept against not kept, the same weights");
}

}  // namespace
}  // namespace loom::testing
