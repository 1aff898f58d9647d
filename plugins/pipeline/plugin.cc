// The pipeline plugin: the pipeline schedules gpipe, 1f1b, interleaved and zb_h1 (plans.h),
// kind pipeline_schedule. Each is a pure plan; the core runs it (ScheduleExecutor).
#include <loom/sdk.h>

#include <nlohmann/json.hpp>

#include "plugins/pipeline/plans.h"

namespace loom::pipeline {
namespace {

// One schedule object over a plan function.
class Schedule : public Object<IPipelineSchedule> {
 public:
  using PlanFn = Plan (*)(const PipelineShape&, int32_t option);

  Schedule(PlanFn fn, int32_t option) : fn_(fn), option_(option) {}

  Status plan(const PipelineShape* shape, PipelineAction* actions,
              int64_t* count) noexcept override {
    return guard([&] {
      if (shape == nullptr || count == nullptr)
        fail(Code::kInvalidArgument, "plan: shape and count must not be null");
      Plan p = fn_(*shape, option_);
      const int64_t n = static_cast<int64_t>(p.size());
      if (actions != nullptr) {
        if (*count < n)
          fail(Code::kInvalidArgument, "plan: a buffer of " + std::to_string(*count) +
                                           " actions for a plan of " + std::to_string(n));
        std::copy(p.begin(), p.end(), actions);
      }
      *count = n;
    });
  }

 private:
  PlanFn fn_;
  int32_t option_;
};

class Gpipe final : public Schedule {
 public:
  Gpipe(const nlohmann::json&, IBuildContext&)
      : Schedule([](const PipelineShape& s, int32_t) { return gpipe_plan(s); }, 0) {}
};

class OneFOneB final : public Schedule {
 public:
  OneFOneB(const nlohmann::json&, IBuildContext&)
      : Schedule([](const PipelineShape& s, int32_t) { return one_f_one_b_plan(s); }, 0) {}
};

class Interleaved final : public Schedule {
 public:
  Interleaved(const nlohmann::json& options, IBuildContext&)
      : Schedule([](const PipelineShape& s, int32_t g) { return interleaved_plan(s, g); },
                 options.value("microbatch_group_size", 0)) {}
};

class ZbH1 final : public Schedule {
 public:
  ZbH1(const nlohmann::json&, IBuildContext&)
      : Schedule([](const PipelineShape& s, int32_t) { return zb_h1_plan(s); }, 0) {}
};

class Pipeline final : public Plugin {
 public:
  void register_components(Registrar& r) override {
    r.factory<Gpipe>("gpipe");
    r.factory<OneFOneB>("1f1b");
    r.factory<Interleaved>("interleaved");
    r.factory<ZbH1>("zb_h1");
  }
};

}  // namespace
}  // namespace loom::pipeline

LOOM_PLUGIN(loom::pipeline::Pipeline)
