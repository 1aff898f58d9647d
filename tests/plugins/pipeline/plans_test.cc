// The pipeline schedules (plugins/pipeline) as the core gets them: built from the loaded
// plugin, asked for every rank's plan, and the plans run against each other in the plan
// simulator (core/train/plan_simulator.h). For every schedule and (P, M, V) of a grid:
// every send has its receive on the right neighbour, no rank waits for ever, every forward
// precedes its backward and every split backward has its weight pass (the plan rules), and
// the simulated bubble (F = 1, B = 2, B_input = B_weight = 1) equals the published one:
//   1f1b, gpipe   (P - 1) / (M + P - 1)                 (Narayanan et al. 2021, eq. 1)
//   interleaved   (P - 1) / (V M + P - 1)               (the same paper, section 2.2)
//   zb_h1         (P - 1) / (3 M + P - 1), for M >= P   (Qi et al. 2023: (P-1)(F+B-W))
// and the memory bounds: 1f1b keeps at most P - r micro-batches in flight on rank r, zb_h1
// at most P on any rank (1f1b's first stage), gpipe all M.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/component/builder.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/spec.h"
#include "core/train/plan_simulator.h"
#include "loom/cpp/error.h"
#include "loom/cpp/object.h"
#include "loom/kinds.h"

namespace loom {
namespace {

class PlansTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    plugins_ = new core::PluginManager(
        core::Catalog({{std::filesystem::absolute("plugins/pipeline"), "test"}}));
    plugins_->load("pipeline");
  }
  static void TearDownTestSuite() {
    delete plugins_;
    plugins_ = nullptr;
  }

  // The schedule `node` as the core builds it (its options resolved against the schema).
  static ObjectPtr build(nlohmann::json node) {
    nlohmann::json spec = {{"parallel", {{"pipeline_schedule", node}}}};
    core::resolve_spec(spec, plugins_->catalog(), &plugins_->registry());
    return core::build_component(*plugins_, spec["parallel"]["pipeline_schedule"],
                                 kinds::kPipelineSchedule, "/parallel/pipeline_schedule", {});
  }

  // Every rank's plan from `schedule`.
  static std::vector<std::vector<PipelineAction>> plans(IPipelineSchedule& schedule, int32_t p,
                                                        int32_t m, int32_t v) {
    std::vector<std::vector<PipelineAction>> out;
    for (int32_t r = 0; r < p; ++r) {
      PipelineShape shape{sizeof(PipelineShape), p, r, m, v};
      int64_t count = 0;
      throw_if_error(schedule.plan(&shape, nullptr, &count), "plan size");
      std::vector<PipelineAction> plan(static_cast<size_t>(count));
      throw_if_error(schedule.plan(&shape, plan.data(), &count), "plan");
      out.push_back(plan);
    }
    return out;
  }

  static core::PluginManager* plugins_;
};

core::PluginManager* PlansTest::plugins_ = nullptr;

struct Case {
  std::string schedule;
  int32_t p, m, v;
};

TEST_F(PlansTest, EveryScheduleFitsTogetherAndMatchesItsBubble) {
  std::vector<Case> cases;
  for (int32_t p : {1, 2, 3, 4, 8})
    for (int32_t m : {1, 2, 3, 4, 5, 8, 12, 16}) {
      cases.push_back({"gpipe", p, m, 1});
      if (p > 1) cases.push_back({"gpipe", p, m, 2});  // virtual chunks too
      cases.push_back({"1f1b", p, m, 1});
      cases.push_back({"zb_h1", p, m, 1});
      for (int32_t v : {1, 2, 3})
        if (m >= p && (m % p == 0 || m % p >= p)) cases.push_back({"interleaved", p, m, v});
    }
  int checked = 0;
  double worst = 0;
  for (const Case& c : cases) {
    ObjectPtr object = build({{"impl", c.schedule}});
    auto& schedule = *interface_cast<IPipelineSchedule>(object.get());
    std::vector<std::vector<PipelineAction>> all;
    ASSERT_NO_THROW(all = plans(schedule, c.p, c.m, c.v)) << c.schedule;
    core::Simulation sim;
    try {
      sim = core::simulate_plans(all, c.m, c.v, core::PassCosts{}, c.schedule);
    } catch (const Error& e) {
      ADD_FAILURE() << c.schedule << " P " << c.p << " M " << c.m << " V " << c.v << ": "
                    << e.what();
      continue;
    }
    const double theory = core::theoretical_bubble(c.schedule, c.p, c.m, c.v);
    // The formulas: zb_h1's for M >= P, gpipe's without virtual chunks.
    if ((c.schedule != "zb_h1" || c.m >= c.p) && (c.schedule != "gpipe" || c.v == 1)) {
      EXPECT_NEAR(sim.bubble(), theory, 1e-12)
          << c.schedule << " P " << c.p << " M " << c.m << " V " << c.v;
      worst = std::max(worst, std::abs(sim.bubble() - theory));
    }
    for (int32_t r = 0; r < c.p; ++r) {
      const int32_t peak = sim.peak_in_flight[static_cast<size_t>(r)];
      if (c.schedule == "1f1b") {
        EXPECT_LE(peak, std::min(c.p - r, c.m)) << "1f1b rank " << r;
      } else if (c.schedule == "zb_h1") {
        EXPECT_LE(peak, std::min(c.p, c.m)) << "zb_h1 rank " << r;
      } else if (c.schedule == "gpipe") {
        EXPECT_EQ(peak, c.m * c.v) << "gpipe rank " << r;
      }
    }
    ++checked;
  }
  std::printf("%d schedule shapes simulated; worst |bubble - theory| %.3g\n", checked, worst);
}

TEST_F(PlansTest, ZeroBubbleBeatsOneFOneBAndInterleavingShrinksTheBubble) {
  ObjectPtr ofob = build({{"impl", "1f1b"}}), zb = build({{"impl", "zb_h1"}}),
            inter = build({{"impl", "interleaved"}});
  for (int32_t p : {2, 4, 8})
    for (int32_t m : {1, 2, 4, 8, 16}) {
      auto* a = interface_cast<IPipelineSchedule>(ofob.get());
      auto* b = interface_cast<IPipelineSchedule>(zb.get());
      double base = core::simulate_plans(plans(*a, p, m, 1), m, 1, {}, "1f1b").bubble();
      double zero = core::simulate_plans(plans(*b, p, m, 1), m, 1, {}, "zb_h1").bubble();
      EXPECT_LT(zero, base) << "P " << p << " M " << m;
      if (m % p != 0) continue;
      auto* c = interface_cast<IPipelineSchedule>(inter.get());
      double v2 = core::simulate_plans(plans(*c, p, m, 2), m, 2, {}, "interleaved").bubble();
      EXPECT_LT(v2, base) << "P " << p << " M " << m;
    }
}

// Megatron's own example (p 2, m 5, group 3: the last group of 2 is not smaller than p):
// the plans fit together, with a bubble above the formula's (which assumes full groups).
TEST_F(PlansTest, APartialLastGroupOfAtLeastPMicroBatchesFitsTogether) {
  ObjectPtr object = build({{"impl", "interleaved"}, {"microbatch_group_size", 3}});
  auto& schedule = *interface_cast<IPipelineSchedule>(object.get());
  for (int32_t v : {2, 3}) {
    core::Simulation sim = core::simulate_plans(plans(schedule, 2, 5, v), 5, v, {}, "interleaved");
    std::printf("interleaved p 2 m 5 group 3 v %d: bubble %.3f (formula %.3f)\n", v, sim.bubble(),
                core::theoretical_bubble("interleaved", 2, 5, v));
    EXPECT_GE(sim.bubble(), core::theoretical_bubble("interleaved", 2, 5, v) - 1e-12);
  }
}

TEST_F(PlansTest, ALargerMicroBatchGroupStillFitsTogether) {
  ObjectPtr object = build({{"impl", "interleaved"}, {"microbatch_group_size", 6}});
  auto& schedule = *interface_cast<IPipelineSchedule>(object.get());
  for (int32_t v : {2, 3}) {
    core::Simulation sim =
        core::simulate_plans(plans(schedule, 4, 12, v), 12, v, {}, "interleaved");
    EXPECT_NEAR(sim.bubble(), core::theoretical_bubble("interleaved", 4, 12, v), 1e-12);
  }
}

TEST_F(PlansTest, ShapesASheduleCannotRunAreRefusedWithTheFix) {
  auto message = [&](nlohmann::json node, int32_t p, int32_t m, int32_t v) -> std::string {
    try {
      ObjectPtr object = build(node);
      plans(*interface_cast<IPipelineSchedule>(object.get()), p, m, v);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string m = message({{"impl", "interleaved"}}, 4, 6, 2);
  std::printf("%s\n", m.c_str());
  EXPECT_NE(m.find("6 micro-batches per step leave 2 after groups of 4"), std::string::npos) << m;
  m = message({{"impl", "interleaved"}, {"microbatch_group_size", 2}}, 4, 8, 2);
  EXPECT_NE(m.find("smaller than the 4 pipeline stages"), std::string::npos) << m;
  m = message({{"impl", "1f1b"}}, 2, 4, 2);
  EXPECT_NE(m.find("interleaved"), std::string::npos) << m;
  m = message({{"impl", "zb_h1"}}, 2, 4, 2);
  EXPECT_NE(m.find("parallel.vpp 1"), std::string::npos) << m;
  m = message({{"impl", "gpipe"}}, 2, 0, 1);
  EXPECT_NE(m.find("at least one"), std::string::npos) << m;
}

// The simulator itself must catch what it is there to catch: plans that wait on each other
// for ever, and a rank whose plan breaks a rule (here: a stage that is not the first runs a
// forward without receiving its input). Each plan alone keeps the rules in the first case.
TEST(PlanSimulator, FindsDeadlocksAndBrokenRules) {
  using Op = PipelineOp;
  // Rank 0 waits for micro-batch 0's gradient before it sends the activation that rank 1
  // needs to make that gradient.
  std::vector<std::vector<PipelineAction>> deadlock = {
      {{Op::kForward, 0, 0}, {Op::kRecvGrad, 0, 0}, {Op::kSendActivation, 0, 0},
       {Op::kBackward, 0, 0}},
      {{Op::kRecvActivation, 0, 0}, {Op::kForward, 0, 0}, {Op::kBackward, 0, 0},
       {Op::kSendGrad, 0, 0}}};
  std::string message;
  try {
    core::simulate_plans(deadlock, 1, 1, {}, "bad");
  } catch (const Error& e) {
    message = e.what();
  }
  std::printf("%s\n", message.c_str());
  EXPECT_NE(message.find("deadlock"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 action 1 (recv_grad"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 action 0 (recv_activation"), std::string::npos) << message;

  std::vector<std::vector<PipelineAction>> broken = {
      {{Op::kForward, 0, 0}, {Op::kSendActivation, 0, 0}, {Op::kRecvGrad, 0, 0},
       {Op::kBackward, 0, 0}},
      {{Op::kForward, 0, 0}, {Op::kBackward, 0, 0}}};
  message.clear();
  try {
    core::simulate_plans(broken, 1, 1, {}, "bad");
  } catch (const Error& e) {
    message = e.what();
  }
  std::printf("%s\n", message.c_str());
  EXPECT_NE(message.find("rank 1 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("before its input was received"), std::string::npos) << message;
}

}  // namespace
}  // namespace loom
