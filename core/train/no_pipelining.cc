#include "core/train/no_pipelining.h"

namespace loom::core {

std::vector<PipelineAction> no_pipelining_plan(int32_t micro_batches) {
  std::vector<PipelineAction> plan;
  plan.reserve(static_cast<size_t>(micro_batches) * 2);
  for (int32_t m = 0; m < micro_batches; ++m) {
    plan.push_back({PipelineOp::kForward, m, 0});
    plan.push_back({PipelineOp::kBackward, m, 0});
  }
  return plan;
}

}  // namespace loom::core
