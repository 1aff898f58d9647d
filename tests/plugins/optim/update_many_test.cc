// IOptimizer::update_many (optimizer 1.1) of the optim plugin's AdamW and SGD, loaded through
// the core with the CPU kernel library: over several steps, bit for bit what update() on
// each shard followed by a cast of its master into its param gives (AdamW through
// adamw_step_multi, or adamw_step per shard where a pin sends adamw_step to another kernel);
// shards with f32 and bf16 gradients in one call; a newer caller's larger OptimizerShard;
// and bad calls refused, naming the shard, before anything is written. And the step scalars
// (optimizer 1.3): the step's values read from them give the host values' bits, and their
// skip flag leaves every shard as it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loom/cpp/half.h"
#include "loom/cpp/tensor.h"
#include "loom/ops.h"
#include "tests/plugins/optim/optim_env.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr int kSteps = 3;
const double kLr[kSteps] = {1e-2, 3e-2, 5e-3};

// One parameter shard of n elements, as the core holds it: f32 master and states, a
// gradient per step (f32, or bf16 when the parameter is bf16 and gradients come in its
// dtype), and the parameter itself in bf16 (or none: an f32 parameter is its own master).
struct Shard {
  int64_t n;
  bool decay, bf16_grad, has_param;
  std::vector<float> master;
  std::vector<std::vector<float>> grads;  // [kSteps] (n)
  std::vector<std::vector<uint16_t>> bf16_grads;
  std::vector<std::vector<float>> states;
  std::vector<uint16_t> param;

  Shard(int64_t n, bool decay, bool bf16_grad, bool has_param, int32_t state_count, uint32_t seed)
      : n(n), decay(decay), bf16_grad(bf16_grad), has_param(has_param) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> w(-1.f, 1.f);
    std::normal_distribution<float> g(0.f, 1.f);
    for (int64_t i = 0; i < n; ++i) master.push_back(w(rng));
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> grad;
      std::vector<uint16_t> half;
      for (int64_t i = 0; i < n; ++i) {
        grad.push_back(g(rng) * std::pow(10.f, float(i % 5) - 3));
        half.push_back(f32_to_bf16(grad.back()));
      }
      grads.push_back(grad);
      bf16_grads.push_back(half);
    }
    states.assign(state_count, std::vector<float>(n, 0.25f));
    param.assign(n, 0xFFFF);  // garbage until the first step writes it
  }

  TensorView master_view() { return make_view(master.data(), DType::kF32, {n}); }
  TensorView grad_view(int t) {
    return bf16_grad ? make_view(bf16_grads[t].data(), DType::kBF16, {n})
                     : make_view(grads[t].data(), DType::kF32, {n});
  }
  std::vector<TensorView> state_views() {
    std::vector<TensorView> v;
    for (auto& s : states) v.push_back(make_view(s.data(), DType::kF32, {n}));
    return v;
  }
  TensorView param_view() {
    return has_param ? make_view(param.data(), DType::kBF16, {n}) : empty_view();
  }
};

// Lengths 1, odd ones and more than one chunk of the fast kernels; mixed decay, gradient
// dtypes (when the optimizer takes bf16 ones) and params.
std::vector<Shard> make_shards(int32_t state_count, bool bf16_grads) {
  std::vector<Shard> s;
  const int64_t lengths[] = {1, 37, 4099, 8, 2050, 3};
  uint32_t seed = 11;
  int k = 0;
  for (int64_t n : lengths) {
    s.emplace_back(n, k % 3 != 1, bf16_grads && k % 2 == 1, k != 3, state_count, seed++);
    ++k;
  }
  return s;
}

OptimizerStep step_hp(int t) {
  return OptimizerStep{sizeof(OptimizerStep), t + 1, kLr[t], 0.1, t == 1 ? 0.5 : 1.0, {}};
}

std::string failure(Status status, Code* code) {
  *code = status.code;
  return status.code == Code::kOk ? "" : take_message(&status);
}

// The old way: update() per shard, then the cast (the "cast" op rounds to nearest even, as
// f32_to_bf16 does).
void run_per_shard(IOptimizer& opt, std::vector<Shard>& shards) {
  for (int t = 0; t < kSteps; ++t) {
    OptimizerStep hp = step_hp(t);
    for (Shard& s : shards) {
      TensorView master = s.master_view(), grad = s.grad_view(t);
      std::vector<TensorView> states = s.state_views();
      Code code = Code::kOk;
      std::string message =
          failure(opt.update(&hp, s.decay, &master, &grad, states.data(), nullptr), &code);
      ASSERT_EQ(code, Code::kOk) << message;
      if (s.has_param)
        for (int64_t i = 0; i < s.n; ++i) s.param[i] = f32_to_bf16(s.master[i]);
    }
  }
}

// The new way: one update_many per step. `scalars`: the step's lr, step and gradient scale
// go in OptimizerStep::scalars (optimizer 1.3) and the host fields hold other values, which
// must not be read; `skip`: the scalars' skip flag is set.
void run_many(IOptimizer& opt, std::vector<Shard>& shards, bool scalars = false,
              bool skip = false) {
  ASSERT_TRUE(has_update_many(opt));
  for (int t = 0; t < kSteps; ++t) {
    OptimizerStep hp = step_hp(t);
    double s[ops::kStepScalarCount] = {};
    if (scalars) {
      ASSERT_TRUE(has_step_scalars(opt));
      s[ops::kStepLr] = hp.lr;
      s[ops::kStepIndex] = static_cast<double>(hp.step);
      s[ops::kStepGradScale] = hp.grad_scale;
      s[ops::kStepSkip] = skip ? 1.0 : 0.0;
      hp.scalars = make_view(s, DType::kF64, {ops::kStepScalarCount});
      hp.lr = 0.9;
      hp.step = 1;
      hp.grad_scale = 3.0;
    }
    std::vector<std::vector<TensorView>> states;
    std::vector<OptimizerShard> many;
    for (Shard& s : shards) states.push_back(s.state_views());
    for (size_t k = 0; k < shards.size(); ++k) {
      Shard& s = shards[k];
      many.push_back(OptimizerShard{sizeof(OptimizerShard), s.decay ? 1 : 0, s.master_view(),
                                    s.grad_view(t), states[k].data(), s.param_view()});
    }
    Code code = Code::kOk;
    std::string message = failure(
        opt.update_many(&hp, static_cast<int32_t>(many.size()), many.data(), nullptr), &code);
    ASSERT_EQ(code, Code::kOk) << message;
  }
}

void expect_same_bits(const std::vector<Shard>& a, const std::vector<Shard>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    SCOPED_TRACE("shard " + std::to_string(k) + " (n = " + std::to_string(a[k].n) + ")");
    EXPECT_EQ(0, std::memcmp(a[k].master.data(), b[k].master.data(), a[k].n * 4)) << "master";
    for (size_t s = 0; s < a[k].states.size(); ++s)
      EXPECT_EQ(0, std::memcmp(a[k].states[s].data(), b[k].states[s].data(), a[k].n * 4))
          << "state " << s;
    EXPECT_EQ(a[k].param, b[k].param) << "param";
  }
}

class UpdateManyTest : public ::testing::Test {
 protected:
  OptimEnv env_{true};

  IOptimizer& build(const json& node, const json& inherited = json::object()) {
    objects_.push_back(env_.build("optimizer", node, inherited));
    auto* o = interface_cast<IOptimizer>(objects_.back().get());
    EXPECT_NE(o, nullptr);
    return *o;
  }

  // update_many against update + cast, on the same shards from the same start.
  void check_equivalence(const json& node, const json& inherited, int32_t state_count,
                         bool bf16_grads) {
    IOptimizer& per_shard = build(node, inherited);
    IOptimizer& many = build(node, inherited);
    std::vector<Shard> a = make_shards(state_count, bf16_grads), b = a;
    run_per_shard(per_shard, a);
    run_many(many, b);
    expect_same_bits(a, b);
    // The step did something: the masters moved and the params hold them.
    EXPECT_NE(b[2].master, make_shards(state_count, bf16_grads)[2].master);
    EXPECT_EQ(b[2].param[5], f32_to_bf16(b[2].master[5]));
  }

 private:
  std::vector<ObjectPtr> objects_;
};

TEST_F(UpdateManyTest, AdamWEqualsUpdatePerShardAndCast) {
  check_equivalence({{"impl", "adamw"}}, json::object(), 2, false);
}

TEST_F(UpdateManyTest, AdamWWithF32AndBf16GradientsInOneCall) {
  check_equivalence({{"impl", "adamw"}, {"beta2", 0.95}}, {{"params_dtype", "bf16"}}, 2, true);
}

TEST_F(UpdateManyTest, AdamWWithAdamWStepPinnedToTheReferenceUsesItPerShard) {
  // adamw_step_multi still resolves to cpu.fast: update_many must not take it, or a pin of
  // adamw_step would stop deciding the math (cpu.fast contracts into FMAs, cpu.ref not).
  env_.plugins().host().set_pins({{"adamw_step", "cpu.ref"}});
  check_equivalence({{"impl", "adamw"}}, {{"params_dtype", "bf16"}}, 2, true);
  // Both pinned: the multi kernel serves again, and still gives the same bits.
  env_.plugins().host().set_pins({{"adamw_step", "cpu.ref"}, {"adamw_step_multi", "cpu.ref"}});
  check_equivalence({{"impl", "adamw"}}, {{"params_dtype", "bf16"}}, 2, true);
}

TEST_F(UpdateManyTest, SgdEqualsUpdatePerShardAndCast) {
  check_equivalence({{"impl", "sgd"}, {"weight_decay", 0.01}}, json::object(), 1, false);
  check_equivalence({{"impl", "sgd"}, {"nesterov", true}}, {{"params_dtype", "bf16"}}, 1, true);
  check_equivalence({{"impl", "sgd"}, {"momentum", 0.0}}, json::object(), 0, false);
}

// The step scalars give the host values' results bit for bit: AdamW through
// adamw_step_multi and through adamw_step per shard (pinned), SGD with momentum (whose
// first step starts the buffer: the step must come from the scalars too).
TEST_F(UpdateManyTest, StepScalarsGiveTheHostValuesBits) {
  struct Case {
    json node, inherited;
    int32_t states;
    bool bf16, pin;
  };
  const Case cases[] = {
      {{{"impl", "adamw"}}, {{"params_dtype", "bf16"}}, 2, true, false},
      {{{"impl", "adamw"}}, {{"params_dtype", "bf16"}}, 2, true, true},
      {{{"impl", "sgd"}, {"momentum", 0.9}}, json::object(), 1, false, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.node.dump() + (c.pin ? " adamw_step pinned" : ""));
    if (c.pin) env_.plugins().host().set_pins({{"adamw_step", "cpu.ref"}});
    IOptimizer& host = build(c.node, c.inherited);
    IOptimizer& device = build(c.node, c.inherited);
    std::vector<Shard> a = make_shards(c.states, c.bf16), b = a;
    run_many(host, a);
    run_many(device, b, /*scalars=*/true);
    expect_same_bits(a, b);
    EXPECT_NE(b[2].master, make_shards(c.states, c.bf16)[2].master);
    // Skipped: nothing written, not even the params' casts.
    IOptimizer& skipping = build(c.node, c.inherited);
    std::vector<Shard> d = make_shards(c.states, c.bf16);
    const std::vector<Shard> before = d;
    run_many(skipping, d, /*scalars=*/true, /*skip=*/true);
    expect_same_bits(before, d);
    env_.plugins().host().set_pins({});
  }
}

TEST_F(UpdateManyTest, BadStepScalarsAreRefusedWithTheirShape) {
  IOptimizer& opt = build({{"impl", "adamw"}});
  std::vector<Shard> shards = make_shards(2, false);
  std::vector<TensorView> states = shards[0].state_views();
  OptimizerShard one{sizeof(OptimizerShard),  1,
                     shards[0].master_view(), shards[0].grad_view(0),
                     states.data(),           shards[0].param_view()};
  OptimizerStep hp = step_hp(0);
  float wrong[ops::kStepScalarCount] = {};
  hp.scalars = make_view(wrong, DType::kF32, {ops::kStepScalarCount});
  Code code = Code::kOk;
  EXPECT_EQ(failure(opt.update_many(&hp, 1, &one, nullptr), &code),
            "adamw update: the step scalars must be f64 (6) on the cpu device "
            "(loom/ops/optim.h), got f32 (6) on cpu");
  EXPECT_EQ(code, Code::kInvalidArgument);
}

TEST_F(UpdateManyTest, ANewerCallersLargerShardsAreReadWithItsStride) {
  struct NewerShard {
    OptimizerShard shard;
    double appended;  // a field a newer core might add
  };
  IOptimizer& opt = build({{"impl", "adamw"}});
  std::vector<Shard> a = make_shards(2, false), b = a;
  run_many(opt, a);
  IOptimizer& fresh = build({{"impl", "adamw"}});
  for (int t = 0; t < kSteps; ++t) {
    OptimizerStep hp = step_hp(t);
    std::vector<std::vector<TensorView>> states;
    for (Shard& s : b) states.push_back(s.state_views());
    std::vector<NewerShard> many;
    for (size_t k = 0; k < b.size(); ++k)
      many.push_back(NewerShard{{sizeof(NewerShard), b[k].decay ? 1 : 0, b[k].master_view(),
                                 b[k].grad_view(t), states[k].data(), b[k].param_view()},
                                -1.0});
    Code code = Code::kOk;
    std::string message = failure(
        fresh.update_many(&hp, static_cast<int32_t>(many.size()), &many[0].shard, nullptr), &code);
    ASSERT_EQ(code, Code::kOk) << message;
  }
  expect_same_bits(a, b);
}

TEST_F(UpdateManyTest, BadCallsAreRefusedNamingTheShardBeforeAnythingIsWritten) {
  IOptimizer& opt = build({{"impl", "adamw"}});
  std::vector<Shard> shards = make_shards(2, false);
  const std::vector<Shard> before = shards;
  OptimizerStep hp = step_hp(0);
  std::vector<std::vector<TensorView>> states;
  std::vector<OptimizerShard> many;
  for (Shard& s : shards) states.push_back(s.state_views());
  for (size_t k = 0; k < shards.size(); ++k)
    many.push_back(OptimizerShard{sizeof(OptimizerShard), 1, shards[k].master_view(),
                                  shards[k].grad_view(0), states[k].data(),
                                  shards[k].param_view()});
  const int32_t count = static_cast<int32_t>(many.size());
  Code code = Code::kOk;

  std::vector<OptimizerShard> bad = many;
  bad[4].grad = make_view(shards[4].grads[0].data(), DType::kF32, {7});
  EXPECT_EQ(failure(opt.update_many(&hp, count, bad.data(), nullptr), &code),
            "adamw_step: shard 4: grad has 7 elements, master 2050");
  EXPECT_EQ(code, Code::kInvalidArgument);

  bad = many;
  bad[5].param = make_view(shards[5].param.data(), DType::kBF16, {2});
  EXPECT_EQ(failure(opt.update_many(&hp, count, bad.data(), nullptr), &code),
            "adamw_step: shard 5: param has 2 elements, master 3");

  bad = many;
  bad[1].grad = make_view(shards[1].bf16_grads[0].data(), DType::kBF16, {shards[1].n});
  EXPECT_THAT(failure(opt.update_many(&hp, count, bad.data(), nullptr), &code),
              HasSubstr("adamw_step: shard 1: gradient dtype bf16 is neither f32 nor the "
                        "parameter dtype f32"));

  bad = many;
  bad[0].struct_size = 8;
  EXPECT_THAT(failure(opt.update_many(&hp, count, bad.data(), nullptr), &code),
              HasSubstr("adamw update_many: OptimizerShard of 8 bytes is older than this "
                        "optimizer's"));

  EXPECT_EQ(failure(opt.update_many(&hp, -1, many.data(), nullptr), &code),
            "adamw update_many: count is -1");
  EXPECT_EQ(failure(opt.update_many(&hp, 2, nullptr, nullptr), &code),
            "adamw update_many: shards is null with count 2");
  OptimizerStep step0 = hp;
  step0.step = 0;
  EXPECT_THAT(failure(opt.update_many(&step0, count, many.data(), nullptr), &code),
              HasSubstr("steps are 1-based"));

  // None of the refused calls wrote anything, not even to the shards before the bad one.
  expect_same_bits(shards, before);
  // Nothing to update is fine.
  EXPECT_EQ(failure(opt.update_many(&hp, 0, nullptr, nullptr), &code), "");
  EXPECT_EQ(code, Code::kOk);
}

}  // namespace
}  // namespace loom::testing
