// The fp8 plugin's recipes, loaded through the core with the CPU kernel library: quantisers
// per (owner, role) with the format's dtypes; delayed scaling's scales over a ring of amax
// histories (max and most-recent), current scaling's per-tensor scales, the margin; the
// quantised values those scales give; and bad calls refused with the reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/component/builder.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/spec.h"
#include "loom/cpp/fp8.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

class RecipeTest : public ::testing::Test {
 protected:
  RecipeTest() {
    plugins_ = std::make_unique<core::PluginManager>(
        core::Catalog({{std::filesystem::absolute("plugins/fp8"), "test"},
                       {std::filesystem::absolute("kernels/cpu"), "test"}}));
    plugins_->load("fp8");
    plugins_->load("kernels_cpu");
  }
  // Builds /precision/fp8 = `node` with its schema defaults, as the core does.
  IFp8Recipe& build(const json& node) {
    json spec = {{"precision", {{"fp8", node}}}};
    core::resolve_spec(spec, plugins_->catalog(), &plugins_->registry());
    object_ = core::build_component(*plugins_, spec["precision"]["fp8"], kinds::kFp8Recipe,
                                    "/precision/fp8", {{"device", "cpu"}});
    IFp8Recipe* r = interface_cast<IFp8Recipe>(object_.get());
    EXPECT_NE(r, nullptr);
    return *r;
  }
  // Quantises x (rows of 8) with quantiser `id`; returns the scale_inv it wrote and the
  // quantised values (decoded) in `out`.
  static float quantize(IFp8Recipe& r, int32_t id, DType dtype, std::vector<float> x,
                        std::vector<float>* out = nullptr, uint32_t flags = 0) {
    int64_t m = static_cast<int64_t>(x.size()) / 8;
    std::vector<uint8_t> q(x.size()), qt(x.size());
    float scale_inv = -1;
    TensorView in = make_view(x.data(), DType::kF32, {m, 8});
    TensorView y = make_view(q.data(), dtype, {m, 8}), yt = make_view(qt.data(), dtype, {8, m});
    TensorView s = make_view(&scale_inv, DType::kF32, {1});
    Status st = r.quantize(id, &in, &y, &yt, &s, flags, nullptr);
    EXPECT_EQ(st.code, Code::kOk) << take_message(&st);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(q[i * 8 + j], qt[j * m + i]) << "transpose";
    if (out != nullptr) {
      out->clear();
      for (uint8_t c : q) out->push_back(fp8_to_f32(c, dtype));
    }
    return scale_inv;
  }
  // 16 values whose largest magnitude is `amax`.
  static std::vector<float> tensor(float amax) {
    std::vector<float> x(16);
    for (int i = 0; i < 16; ++i) x[i] = amax * static_cast<float>(i - 8) / 8.0f;  // -amax ..
    return x;
  }
  static void step_end(IFp8Recipe& r) {
    Status st = r.step_end(nullptr, nullptr);
    ASSERT_EQ(st.code, Code::kOk) << take_message(&st);
  }

  std::unique_ptr<core::PluginManager> plugins_;
  ObjectPtr object_;
};

TEST_F(RecipeTest, QuantisersPerOwnerAndRoleWithTheFormatsDtypes) {
  for (const char* format : {"hybrid", "e4m3"}) {
    IFp8Recipe& r = build({{"impl", "delayed"}, {"format", format}});
    int owner_a = 0, owner_b = 0;
    int32_t ids[4];
    Fp8QuantizerInfo info{};
    ASSERT_EQ(r.quantizer(&owner_a, Fp8Role::kActivation, &ids[0], &info).code, Code::kOk);
    EXPECT_EQ(info.dtype, DType::kF8E4M3);
    EXPECT_EQ(info.granularity, Fp8Granularity::kPerTensor);
    EXPECT_EQ(info.scale_dtype, DType::kF32);
    ASSERT_EQ(r.quantizer(&owner_a, Fp8Role::kWeight, &ids[1], &info).code, Code::kOk);
    EXPECT_EQ(info.dtype, DType::kF8E4M3);
    ASSERT_EQ(r.quantizer(&owner_a, Fp8Role::kGradOutput, &ids[2], &info).code, Code::kOk);
    EXPECT_EQ(info.dtype, std::string(format) == "hybrid" ? DType::kF8E5M2 : DType::kF8E4M3);
    ASSERT_EQ(r.quantizer(&owner_b, Fp8Role::kActivation, &ids[3], &info).code, Code::kOk);
    EXPECT_EQ(ids[0], 0);
    EXPECT_EQ(ids[1], 1);
    EXPECT_EQ(ids[2], 2);
    EXPECT_EQ(ids[3], 3);
    int32_t again = -1;
    ASSERT_EQ(r.quantizer(&owner_a, Fp8Role::kWeight, &again, &info).code, Code::kOk);
    EXPECT_EQ(again, 1) << "asking again returns the same quantiser";
  }
}

TEST_F(RecipeTest, DelayedScalingUsesTheMaxOfTheHistoryRing) {
  IFp8Recipe& r = build({{"impl", "delayed"}, {"amax_history_len", 3}});
  int owner = 0;
  int32_t act = -1, grad = -1;
  Fp8QuantizerInfo info{};
  ASSERT_EQ(r.quantizer(&owner, Fp8Role::kActivation, &act, &info).code, Code::kOk);
  ASSERT_EQ(r.quantizer(&owner, Fp8Role::kGradOutput, &grad, &info).code, Code::kOk);
  // Step 1: no history, scale 1. Two micro-batches: the step's amax is the larger, 2.
  std::vector<float> q;
  EXPECT_EQ(quantize(r, act, DType::kF8E4M3, tensor(1.0f), &q), 1.0f);
  EXPECT_EQ(q[0], -1.0f) << "scale 1: the values themselves";
  EXPECT_EQ(quantize(r, act, DType::kF8E4M3, tensor(2.0f)), 1.0f);
  EXPECT_EQ(quantize(r, grad, DType::kF8E5M2, tensor(1000.0f)), 1.0f);
  step_end(r);
  // Rows: [2, -, -]: scale 448 / 2, E5M2's 57344 / 1000.
  EXPECT_FLOAT_EQ(quantize(r, act, DType::kF8E4M3, tensor(4.0f), &q), 2.0f / 448.0f);
  EXPECT_EQ(q[0], -448.0f) << "-4 * 224 saturates at E4M3's largest value";
  EXPECT_FLOAT_EQ(quantize(r, grad, DType::kF8E5M2, tensor(1.0f)), 1000.0f / 57344.0f);
  step_end(r);
  // [2, 4, -]: max 4.
  EXPECT_FLOAT_EQ(quantize(r, act, DType::kF8E4M3, tensor(1.0f)), 4.0f / 448.0f);
  step_end(r);
  // [2, 4, 1] -> the ring wraps: row 0 is cleared for step 4.
  EXPECT_FLOAT_EQ(quantize(r, act, DType::kF8E4M3, tensor(0.5f)), 4.0f / 448.0f);
  step_end(r);
  // [0.5, 4, 1]: still 4; step 5 records into row 1.
  EXPECT_FLOAT_EQ(quantize(r, act, DType::kF8E4M3, tensor(0.5f)), 4.0f / 448.0f);
  step_end(r);
  // [0.5, 0.5, 1]: the 4 has left the window.
  EXPECT_FLOAT_EQ(quantize(r, act, DType::kF8E4M3, tensor(0.5f)), 1.0f / 448.0f);
  // The gradient quantiser saw nothing since step 2: [1000, 1, 0] then [0, 1, 0]...
  EXPECT_FLOAT_EQ(quantize(r, grad, DType::kF8E5M2, tensor(1.0f)), 1.0f / 57344.0f);
}

TEST_F(RecipeTest, DelayedMostRecentWithMargin) {
  IFp8Recipe& r = build({{"impl", "delayed"},
                         {"amax_compute_algo", "most_recent"},
                         {"margin", 2},
                         {"format", "e4m3"}});
  int owner = 0;
  int32_t id = -1;
  Fp8QuantizerInfo info{};
  ASSERT_EQ(r.quantizer(&owner, Fp8Role::kWeight, &id, &info).code, Code::kOk);
  quantize(r, id, DType::kF8E4M3, tensor(8.0f));
  step_end(r);
  // scale = 448 / 8 / 2^2 = 14.
  EXPECT_FLOAT_EQ(quantize(r, id, DType::kF8E4M3, tensor(1.0f)), 1.0f / 14.0f);
  step_end(r);
  EXPECT_FLOAT_EQ(quantize(r, id, DType::kF8E4M3, tensor(1.0f)), 4.0f / 448.0f);
  step_end(r);
  // An all-zero step keeps the scale.
  quantize(r, id, DType::kF8E4M3, std::vector<float>(16, 0.0f));
  step_end(r);
  EXPECT_FLOAT_EQ(quantize(r, id, DType::kF8E4M3, tensor(3.0f)), 4.0f / 448.0f);
}

TEST_F(RecipeTest, TensorwiseScalesEachTensorByItsOwnAmax) {
  IFp8Recipe& r = build({{"impl", "tensorwise"}});
  int owner = 0;
  int32_t act = -1, grad = -1;
  Fp8QuantizerInfo info{};
  ASSERT_EQ(r.quantizer(&owner, Fp8Role::kActivation, &act, &info).code, Code::kOk);
  ASSERT_EQ(r.quantizer(&owner, Fp8Role::kGradOutput, &grad, &info).code, Code::kOk);
  std::vector<float> q;
  EXPECT_FLOAT_EQ(quantize(r, act, DType::kF8E4M3, tensor(2.0f), &q), 2.0f / 448.0f);
  EXPECT_EQ(q[0], -448.0f) << "the largest value maps to the format's largest";
  EXPECT_FLOAT_EQ(quantize(r, act, DType::kF8E4M3, tensor(0.25f)), 0.25f / 448.0f);
  EXPECT_FLOAT_EQ(quantize(r, grad, DType::kF8E5M2, tensor(1e-3f)), 1e-3f / 57344.0f);
  step_end(r);  // nothing to update
  EXPECT_FLOAT_EQ(quantize(r, act, DType::kF8E4M3, tensor(7.0f)), 7.0f / 448.0f);
}

TEST_F(RecipeTest, EvaluationQuantisesWithoutRecordingAmaxes) {
  IFp8Recipe& r = build({{"impl", "delayed"}, {"amax_history_len", 2}});
  int owner = 0;
  int32_t id = -1;
  Fp8QuantizerInfo info{};
  ASSERT_EQ(r.quantizer(&owner, Fp8Role::kActivation, &id, &info).code, Code::kOk);
  quantize(r, id, DType::kF8E4M3, tensor(2.0f));
  step_end(r);
  std::vector<float> q;
  EXPECT_FLOAT_EQ(quantize(r, id, DType::kF8E4M3, tensor(100.0f), &q, kFp8NoAmaxRecord),
                  2.0f / 448.0f)
      << "the training scale";
  EXPECT_EQ(q[0], -448.0f);
  quantize(r, id, DType::kF8E4M3, tensor(1.0f));
  step_end(r);
  EXPECT_FLOAT_EQ(quantize(r, id, DType::kF8E4M3, tensor(1.0f)), 2.0f / 448.0f)
      << "history [2, 1]: the 100 seen in evaluation is not in it";
}

// fp8_recipe 1.1's producer: delayed scaling hands out the scale quantize would use and the
// slot its amax goes into, so a kernel that quantises its own result (swiglu_fp8_fwd) records
// into the same history; current scaling cannot (its scale needs the tensor).
TEST_F(RecipeTest, DelayedProducerGivesQuantizesScaleAndAmaxSlot) {
  IFp8Recipe& r = build({{"impl", "delayed"}, {"amax_history_len", 2}});
  EXPECT_GE(r.interface_info().minor, 1);
  int owner = 0;
  int32_t id = -1;
  Fp8QuantizerInfo info{};
  ASSERT_EQ(r.quantizer(&owner, Fp8Role::kActivation, &id, &info).code, Code::kOk);
  quantize(r, id, DType::kF8E4M3, tensor(2.0f));
  step_end(r);
  TensorView scale{}, amax{};
  float scale_inv = -1;
  TensorView sv = make_view(&scale_inv, DType::kF32, {1});
  Status st =
      r.producer(id, Device{DeviceType::kCpu, 0}, kFp8QuantizeDefault, &scale, &amax, &sv, nullptr);
  ASSERT_EQ(st.code, Code::kOk) << take_message(&st);
  ASSERT_NE(scale.data, nullptr);
  ASSERT_NE(amax.data, nullptr);
  EXPECT_FLOAT_EQ(*static_cast<float*>(scale.data), 448.0f / 2.0f);
  EXPECT_FLOAT_EQ(scale_inv, 2.0f / 448.0f) << "1 / scale, as quantize writes it";
  EXPECT_FLOAT_EQ(quantize(r, id, DType::kF8E4M3, tensor(1.0f)), 2.0f / 448.0f)
      << "the scale quantize uses";
  // A producer folds its tensor's amax, 8, into the slot: the next scale comes from it.
  float* slot = static_cast<float*>(amax.data);
  *slot = std::max(*slot, 8.0f);
  step_end(r);
  EXPECT_FLOAT_EQ(quantize(r, id, DType::kF8E4M3, tensor(1.0f)), 8.0f / 448.0f);
  // Evaluation: no slot. Asking with no scale_inv (the probe nn::Linear makes) writes none.
  TensorView none = empty_view();
  st = r.producer(id, Device{DeviceType::kCpu, 0}, kFp8NoAmaxRecord, &scale, &amax, &none, nullptr);
  ASSERT_EQ(st.code, Code::kOk) << take_message(&st);
  EXPECT_EQ(amax.data, nullptr) << "nothing is recorded in evaluation";
  st = r.producer(9, Device{DeviceType::kCpu, 0}, 0, &scale, &amax, &none, nullptr);
  EXPECT_EQ(st.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&st), HasSubstr("quantiser id 9 was not handed out"));

  IFp8Recipe& t = build({{"impl", "tensorwise"}});
  ASSERT_EQ(t.quantizer(&owner, Fp8Role::kActivation, &id, &info).code, Code::kOk);
  st = t.producer(id, Device{DeviceType::kCpu, 0}, 0, &scale, &amax, &none, nullptr);
  EXPECT_EQ(st.code, Code::kUnimplemented);
  EXPECT_THAT(take_message(&st), HasSubstr("quantise with `quantize`"));
}

// The state a checkpoint keeps: written into a fresh recipe, it continues exactly where the
// first one was (history position included).
// fp8_recipe 1.2: which dimension of each state tensor runs over the quantisers (a pipeline
// stage's checkpoint slice), checked against the shapes the state has: delayed scaling's
// amax_history (L, Q) along 1, scale and scale_inv (Q) along 0, history_position (1) none.
TEST_F(RecipeTest, StateTensorsSayTheirQuantiserDimension) {
  IFp8Recipe& r = build({{"impl", "delayed"}, {"amax_history_len", 3}});
  ASSERT_GE(r.interface_info().minor, 2);
  int owners[5] = {};
  int32_t id = -1;
  Fp8QuantizerInfo info{};
  for (int& owner : owners)
    ASSERT_EQ(r.quantizer(&owner, Fp8Role::kWeight, &id, &info).code, Code::kOk);
  ASSERT_EQ(r.state_count(), 4);
  const std::vector<std::pair<std::string, int32_t>> expected = {
      {"amax_history", 1}, {"scale", 0}, {"scale_inv", 0}, {"history_position", -1}};
  for (int32_t i = 0; i < r.state_count(); ++i) {
    const char* name = nullptr;
    TensorView view{};
    ASSERT_EQ(r.state(i, kCpu, &name, &view).code, Code::kOk);
    EXPECT_EQ(name, expected[static_cast<size_t>(i)].first);
    const int32_t dim = r.state_quantizer_dim(i);
    EXPECT_EQ(dim, expected[static_cast<size_t>(i)].second) << name;
    if (dim >= 0) {
      EXPECT_EQ(view.shape[dim], 5) << name << ": one entry per quantiser";
    }
  }
  EXPECT_EQ(build({{"impl", "tensorwise"}}).state_count(), 0) << "current scaling keeps none";
}

TEST_F(RecipeTest, DelayedStateRoundTripsIntoAFreshRecipe) {
  auto run = [&](IFp8Recipe& r, int steps, const std::vector<float>& amaxes, int32_t id) {
    for (int s = 0; s < steps; ++s) {
      quantize(r, id, DType::kF8E4M3, tensor(amaxes[static_cast<size_t>(s)]));
      step_end(r);
    }
  };
  const std::vector<float> amaxes = {3.0f, 1.0f, 0.5f, 0.25f, 8.0f, 0.125f, 0.5f};
  int owner = 0;
  int32_t id = -1;
  Fp8QuantizerInfo info{};
  json node = {{"impl", "delayed"}, {"amax_history_len", 3}};
  // The uninterrupted run: 7 steps, then the scale_inv it would use at step 8.
  IFp8Recipe& whole = build(node);
  ASSERT_EQ(whole.quantizer(&owner, Fp8Role::kActivation, &id, &info).code, Code::kOk);
  run(whole, 7, amaxes, id);
  const float want = quantize(whole, id, DType::kF8E4M3, tensor(1.0f));
  // 4 steps, its state copied out, a fresh recipe given it, 3 more steps.
  ObjectPtr keep;
  IFp8Recipe& first = build(node);
  keep = std::move(object_);
  ASSERT_EQ(first.quantizer(&owner, Fp8Role::kActivation, &id, &info).code, Code::kOk);
  run(first, 4, amaxes, id);
  ASSERT_EQ(first.state_count(), 4);
  std::vector<std::vector<float>> saved;
  std::vector<std::string> names;
  for (int32_t i = 0; i < first.state_count(); ++i) {
    const char* name = nullptr;
    TensorView v{};
    ASSERT_EQ(first.state(i, kCpu, &name, &v).code, Code::kOk);
    names.push_back(name);
    const float* p = static_cast<const float*>(v.data);
    saved.emplace_back(p, p + numel(v));
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"amax_history", "scale", "scale_inv", "history_position"}));
  EXPECT_EQ(saved[3][0], 1.0f) << "4 steps into a ring of 3: row 1 is next";
  IFp8Recipe& second = build(node);
  ASSERT_EQ(second.quantizer(&owner, Fp8Role::kActivation, &id, &info).code, Code::kOk);
  for (int32_t i = 0; i < second.state_count(); ++i) {
    const char* name = nullptr;
    TensorView v{};
    ASSERT_EQ(second.state(i, kCpu, &name, &v).code, Code::kOk);
    ASSERT_EQ(static_cast<size_t>(numel(v)), saved[static_cast<size_t>(i)].size());
    std::copy(saved[static_cast<size_t>(i)].begin(), saved[static_cast<size_t>(i)].end(),
              static_cast<float*>(v.data));
  }
  std::vector<float> rest(amaxes.begin() + 4, amaxes.end());
  run(second, 3, rest, id);
  EXPECT_EQ(quantize(second, id, DType::kF8E4M3, tensor(1.0f)), want);
  EXPECT_EQ(build({{"impl", "tensorwise"}}).state_count(), 0) << "current scaling keeps nothing";
}

TEST_F(RecipeTest, BadCallsAreRefusedWithTheReason) {
  IFp8Recipe& r = build({{"impl", "delayed"}});
  int owner = 0;
  int32_t id = -1;
  Fp8QuantizerInfo info{};
  ASSERT_EQ(r.quantizer(&owner, Fp8Role::kActivation, &id, &info).code, Code::kOk);
  std::vector<float> x(16, 1.0f);
  std::vector<uint8_t> q(16);
  float s = 0;
  TensorView in = make_view(x.data(), DType::kF32, {2, 8}), none = empty_view();
  TensorView e5 = make_view(q.data(), DType::kF8E5M2, {2, 8});
  TensorView sv = make_view(&s, DType::kF32, {1});
  Status st = r.quantize(7, &in, &e5, &none, &sv, 0, nullptr);
  EXPECT_EQ(st.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&st), HasSubstr("quantiser id 7 was not handed out"));
  st = r.quantize(id, &in, &e5, &none, &sv, 0, nullptr);
  EXPECT_EQ(st.code, Code::kInvalidArgument);
  EXPECT_THAT(take_message(&st), HasSubstr("fp8_e5m2 for a quantiser of fp8_e4m3"));
  quantize(r, id, DType::kF8E4M3, x);
  int late = 0;
  st = r.quantizer(&late, Fp8Role::kWeight, &id, &info);
  EXPECT_EQ(st.code, Code::kFailedPrecondition);
  EXPECT_THAT(take_message(&st), HasSubstr("after quantisation started"));
}

}  // namespace
}  // namespace loom::testing
