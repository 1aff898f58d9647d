// "zb_h1": the zero-bubble schedule ZB-H1 of Qi et al. 2023 ("Zero Bubble Pipeline
// Parallelism", arXiv 2401.10241). The backward splits into B (the input gradient, which the
// previous stage waits for) and W (the weight gradient, which nobody waits for). Rank r runs
// 1f1b's w = min(P - r - 1, M) warm-up forwards, then M - w times F, B and, once more than r
// W passes are pending, the oldest W; in the cool-down each B is followed by one pending W
// (filling the wait for the next gradient), and the rest of the W passes end the step.
//
// With F, B and W of equal length the step takes 3M + P - 1 units against 1f1b's
// 3(M + P - 1): the bubble is (P - 1) / (3M + P - 1) instead of (P - 1) / (M + P - 1),
// the paper's (P - 1)(T_F + T_B - T_W). No rank holds more than P micro-batches whose W has
// not run, 1f1b's peak on its first stage.
#include <algorithm>
#include <deque>
#include <string>

#include "plugins/pipeline/plans.h"

namespace loom::pipeline {

Plan zb_h1_plan(const PipelineShape& s) {
  check_shape(s, "zb_h1");
  if (s.chunks != 1)
    fail(Code::kInvalidArgument, "pipeline schedule 'zb_h1': " + std::to_string(s.chunks) +
                                     " virtual chunks per rank: zb_h1 runs one chunk per rank; "
                                     "set parallel.vpp 1");
  const int32_t warmup = std::min(s.stages - s.rank - 1, s.micro_batches);
  const size_t deferred = static_cast<size_t>(s.rank);  // W passes a rank may keep pending
  Plan plan;
  std::deque<int32_t> pending;
  auto weight = [&] {
    plan.push_back({PipelineOp::kBackwardWeight, pending.front(), 0});
    pending.pop_front();
  };
  for (int32_t m = 0; m < warmup; ++m) add_forward(plan, s, m, 0);
  for (int32_t i = 0; i < s.micro_batches - warmup; ++i) {
    add_forward(plan, s, warmup + i, 0);
    add_backward(plan, s, i, 0, /*split=*/true);
    pending.push_back(i);
    if (pending.size() > deferred) weight();
  }
  for (int32_t m = s.micro_batches - warmup; m < s.micro_batches; ++m) {
    add_backward(plan, s, m, 0, /*split=*/true);
    pending.push_back(m);
    if (m < s.micro_batches - 1) weight();
  }
  while (!pending.empty()) weight();
  return plan;
}

}  // namespace loom::pipeline
