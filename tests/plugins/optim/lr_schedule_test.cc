// The optim plugin's LR schedules, loaded through the core, against an independent
// piecewise reference (Megatron-Core's OptimizerParamScheduler.get_lr at num_steps ==
// step) at every step from 1 to past the horizon, against hand-computed anchor values, and
// with bad options.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "tests/plugins/optim/optim_env.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// The reference, written from Megatron's definitions, one branch per phase.
struct Ref {
  std::string style;  // constant, linear, cosine, inverse_square_root, wsd
  double peak, min_lr, init;
  int64_t warmup, decay;  // decay == 0: no horizon
  int64_t wsd;
  std::string wsd_style;

  Ref(std::string style, double peak, double min_lr, double init, int64_t warmup, int64_t decay,
      int64_t wsd = 0, std::string wsd_style = "")
      : style(std::move(style)),
        peak(peak),
        min_lr(min_lr),
        init(init),
        warmup(warmup),
        decay(decay),
        wsd(wsd),
        wsd_style(std::move(wsd_style)) {}

  double operator()(int64_t s) const {
    const double pi = std::numbers::pi;
    if (warmup > 0 && s <= warmup) return init + (peak - init) * double(s) / double(warmup);
    if (style == "constant") return peak;
    if (decay > 0 && s > decay) return min_lr;
    if (style == "inverse_square_root") {
      double lr = peak * std::sqrt(double(std::max<int64_t>(warmup, 1))) /
                  std::sqrt(double(std::max<int64_t>(s, 1)));
      return std::max(min_lr, lr);
    }
    double ratio = double(s - warmup) / double(decay - warmup);
    double coeff = 0;
    if (style == "linear") coeff = 1 - ratio;
    if (style == "cosine") coeff = 0.5 * (std::cos(pi * ratio) + 1);
    if (style == "wsd") {
      int64_t start = decay - wsd;
      if (s <= start) {
        coeff = 1;
      } else {
        double q = double(s - start) / double(wsd);
        if (wsd_style == "linear") coeff = 1 - q;
        if (wsd_style == "cosine") coeff = 0.5 * (std::cos(pi * q) + 1);
        if (wsd_style == "exponential") coeff = 2 * std::pow(0.5, q) - 1;
        if (wsd_style == "minus_sqrt") coeff = 1 - std::sqrt(q);
      }
    }
    return min_lr + coeff * (peak - min_lr);
  }
};

class LrScheduleTest : public ::testing::Test {
 protected:
  OptimEnv env_{false};

  // Builds `node` (as the spec's lr_schedule) with `inherited` and returns the schedule.
  ObjectPtr build(const json& node, const json& inherited = json::object()) {
    return env_.build("lr_schedule", node, inherited);
  }
  static const ILrSchedule& schedule(const ObjectPtr& object) {
    auto* s = interface_cast<ILrSchedule>(object.get());
    EXPECT_NE(s, nullptr);
    return *s;
  }
  // Every step from 1 to `last` against the reference.
  static void expect_matches(const ILrSchedule& s, const Ref& ref, int64_t last) {
    for (int64_t step = 1; step <= last; ++step)
      ASSERT_NEAR(s.lr(step), ref(step), 1e-12 * std::max(1.0, ref.peak))
          << ref.style << " " << ref.wsd_style << " at step " << step;
  }
  // The message of the SpecError that building `node` throws (kInvalidArgument).
  std::string build_error(const json& node, const json& inherited = json::object()) {
    Code code = Code::kOk;
    std::string message = error_of([&] { build(node, inherited); }, &code);
    EXPECT_EQ(code, Code::kInvalidArgument) << message;
    return message;
  }
};

TEST_F(LrScheduleTest, EveryScheduleMatchesTheReferenceAtEveryStep) {
  struct Case {
    json node;
    Ref ref;
  };
  const double peak = 3e-4, min_lr = 3e-5;
  std::vector<Case> cases = {
      {{{"impl", "constant"}, {"lr", peak}, {"warmup_steps", 10}}, {"constant", peak, 0, 0, 10, 0}},
      {{{"impl", "constant"}, {"lr", peak}}, {"constant", peak, 0, 0, 0, 0}},
      {{{"impl", "linear"},
        {"lr", peak},
        {"min_lr", min_lr},
        {"warmup_steps", 10},
        {"decay_steps", 100}},
       {"linear", peak, min_lr, 0, 10, 100}},
      {{{"impl", "linear"}, {"lr", peak}, {"decay_steps", 50}}, {"linear", peak, 0, 0, 0, 50}},
      {{{"impl", "cosine"},
        {"lr", peak},
        {"min_lr", min_lr},
        {"warmup_steps", 7},
        {"warmup_init_lr", 1e-5},
        {"decay_steps", 93}},
       {"cosine", peak, min_lr, 1e-5, 7, 93}},
      {{{"impl", "inverse_square_root"},
        {"lr", peak},
        {"min_lr", min_lr},
        {"warmup_steps", 16},
        {"decay_steps", 400}},
       {"inverse_square_root", peak, min_lr, 0, 16, 400}},
      {{{"impl", "inverse_square_root"}, {"lr", peak}}, {"inverse_square_root", peak, 0, 0, 0, 0}},
  };
  for (const char* style : {"linear", "cosine", "exponential", "minus_sqrt"})
    cases.push_back({{{"impl", "wsd"},
                      {"lr", peak},
                      {"min_lr", min_lr},
                      {"warmup_steps", 10},
                      {"decay_steps", 120},
                      {"wsd_decay_steps", 30},
                      {"wsd_decay_style", style}},
                     {"wsd", peak, min_lr, 0, 10, 120, 30, style}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.node.dump());
    ObjectPtr object = build(c.node);
    int64_t horizon = c.ref.decay > 0 ? c.ref.decay : 500;
    expect_matches(schedule(object), c.ref, horizon + 25);
  }
}

TEST_F(LrScheduleTest, WarmupRampsToThePeakAtWarmupStepsCountingFromStepOne) {
  ObjectPtr object = build(
      {{"impl", "cosine"}, {"lr", 1.0}, {"warmup_steps", 4}, {"decay_steps", 14}, {"min_lr", 0.1}});
  const ILrSchedule& s = schedule(object);
  EXPECT_DOUBLE_EQ(s.lr(1), 0.25);
  EXPECT_DOUBLE_EQ(s.lr(2), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(4), 1.0);     // the peak, at the end of the warmup
  EXPECT_DOUBLE_EQ(s.lr(9), 0.55);    // halfway: (peak + min) / 2
  EXPECT_NEAR(s.lr(14), 0.1, 1e-15);  // the horizon
  EXPECT_DOUBLE_EQ(s.lr(15), 0.1);    // after it: min_lr
  EXPECT_DOUBLE_EQ(s.lr(1000000), 0.1);
}

TEST_F(LrScheduleTest, AnchorValuesOfEachDecay) {
  // linear: 1.0 -> 0 over steps 0..10 without warmup.
  ObjectPtr linear = build({{"impl", "linear"}, {"lr", 1.0}, {"decay_steps", 10}});
  EXPECT_DOUBLE_EQ(schedule(linear).lr(1), 0.9);
  EXPECT_DOUBLE_EQ(schedule(linear).lr(5), 0.5);
  EXPECT_DOUBLE_EQ(schedule(linear).lr(10), 0.0);
  // inverse square root: lr * sqrt(4 / s) after a 4-step warmup, floored at 0.2.
  ObjectPtr isr =
      build({{"impl", "inverse_square_root"}, {"lr", 1.0}, {"warmup_steps", 4}, {"min_lr", 0.2}});
  EXPECT_DOUBLE_EQ(schedule(isr).lr(16), 0.5);
  EXPECT_DOUBLE_EQ(schedule(isr).lr(64), 0.25);
  EXPECT_DOUBLE_EQ(schedule(isr).lr(10000), 0.2);
  // wsd linear: stable at 1.0 through step 80, then down to 0 at step 100.
  ObjectPtr wsd = build({{"impl", "wsd"},
                         {"lr", 1.0},
                         {"decay_steps", 100},
                         {"wsd_decay_steps", 20},
                         {"wsd_decay_style", "linear"}});
  EXPECT_DOUBLE_EQ(schedule(wsd).lr(80), 1.0);
  EXPECT_DOUBLE_EQ(schedule(wsd).lr(90), 0.5);
  EXPECT_NEAR(schedule(wsd).lr(100), 0.0, 1e-15);
  // wsd exponential (Megatron's default style): 2 * 0.5^(1/2) - 1 halfway.
  ObjectPtr exp =
      build({{"impl", "wsd"}, {"lr", 1.0}, {"decay_steps", 100}, {"wsd_decay_steps", 20}});
  EXPECT_DOUBLE_EQ(schedule(exp).lr(90), std::sqrt(2.0) - 1.0);
}

TEST_F(LrScheduleTest, InheritsThePeakFromTheOptimizerAndTheHorizonFromTrainSteps) {
  // What the core hands down: the optimizer's lr and train.steps.
  json inherited = {{"lr", 0.5}, {"train_steps", 20}};
  ObjectPtr object = build({{"impl", "linear"}, {"warmup_steps", 10}, {"min_lr", 0.0}}, inherited);
  const ILrSchedule& s = schedule(object);
  EXPECT_DOUBLE_EQ(s.lr(10), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(15), 0.25);
  EXPECT_DOUBLE_EQ(s.lr(21), 0.0);
  // decay_steps, when given, wins over train_steps.
  ObjectPtr shorter = build({{"impl", "linear"}, {"decay_steps", 10}}, inherited);
  EXPECT_DOUBLE_EQ(schedule(shorter).lr(5), 0.25);
  EXPECT_DOUBLE_EQ(schedule(shorter).lr(11), 0.0);
  // A node that repeats the optimizer's lr agrees with it; one that differs is refused.
  EXPECT_NO_THROW(build({{"impl", "constant"}, {"lr", 0.5}}, inherited));
  EXPECT_THAT(build_error({{"impl", "constant"}, {"lr", 0.4}}, inherited),
              HasSubstr("spec /lr_schedule/lr"));
}

TEST_F(LrScheduleTest, BadOptionsNameTheOptionAndTheFix) {
  // Missing peak (nothing inherited).
  EXPECT_THAT(build_error({{"impl", "cosine"}, {"decay_steps", 10}}),
              HasSubstr("option 'lr' is missing"));
  // Missing horizon for a decaying schedule.
  EXPECT_THAT(build_error({{"impl", "cosine"}, {"lr", 1.0}}),
              HasSubstr("option 'decay_steps' is missing"));
  // Warmup not shorter than the horizon.
  std::string warmup =
      build_error({{"impl", "linear"}, {"lr", 1.0}, {"warmup_steps", 20}, {"decay_steps", 20}});
  EXPECT_THAT(warmup, HasSubstr("spec /lr_schedule: option 'warmup_steps' (20) must be less than "
                                "decay_steps (20)"));
  EXPECT_THAT(
      build_error({{"impl", "linear"}, {"lr", 1.0}, {"warmup_steps", 30}}, {{"train_steps", 20}}),
      HasSubstr("less than decay_steps (20, from train.steps)"));
  // min_lr and warmup_init_lr above the peak.
  EXPECT_THAT(build_error({{"impl", "linear"}, {"lr", 1.0}, {"min_lr", 2.0}, {"decay_steps", 9}}),
              HasSubstr("option 'min_lr' (2.0) is above the peak lr (1.0)"));
  EXPECT_THAT(build_error({{"impl", "constant"}, {"lr", 1.0}, {"warmup_init_lr", 2.0}}),
              HasSubstr("option 'warmup_init_lr'"));
  // Negative lr: the schema refuses it in the node, the plugin when it is inherited.
  EXPECT_THAT(build_error({{"impl", "constant"}, {"lr", -1.0}}), HasSubstr("/lr_schedule/lr"));
  EXPECT_THAT(build_error({{"impl", "constant"}}, {{"lr", -1.0}}),
              HasSubstr("option 'lr' must be >= 0"));
  EXPECT_THAT(build_error({{"impl", "constant"}}, {{"lr", "fast"}}),
              HasSubstr("option 'lr' must be a number"));
  // wsd: the decay phase must fit after the warmup; the style must be known.
  EXPECT_THAT(build_error({{"impl", "wsd"},
                           {"lr", 1.0},
                           {"warmup_steps", 10},
                           {"decay_steps", 20},
                           {"wsd_decay_steps", 11}}),
              HasSubstr("option 'wsd_decay_steps' must be in [1, decay_steps - warmup_steps] = "
                        "[1, 10], got 11"));
  EXPECT_THAT(build_error({{"impl", "wsd"}, {"lr", 1.0}, {"decay_steps", 20}}),
              HasSubstr("wsd_decay_steps"));
  EXPECT_THAT(build_error({{"impl", "wsd"},
                           {"lr", 1.0},
                           {"decay_steps", 20},
                           {"wsd_decay_steps", 5},
                           {"wsd_decay_style", "step"}}),
              HasSubstr("/lr_schedule/wsd_decay_style"));
  Code code = Code::kOk;
  std::string unchecked = error_of(
      [&] {
        env_.build_unchecked("lr_schedule", {{"impl", "wsd"},
                                             {"lr", 1.0},
                                             {"min_lr", 0.0},
                                             {"warmup_steps", 0},
                                             {"warmup_init_lr", 0.0},
                                             {"decay_steps", 20},
                                             {"wsd_decay_steps", 5},
                                             {"wsd_decay_style", "step"}});
      },
      &code);
  EXPECT_EQ(code, Code::kInvalidArgument);
  EXPECT_THAT(unchecked, HasSubstr("option 'wsd_decay_style' must be one of"));
}

}  // namespace
}  // namespace loom::testing
