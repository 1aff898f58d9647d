// "1f1b": Megatron's non-interleaved schedule (forward_backward_pipelining_without_
// interleaving). Rank r of P runs w = min(P - r - 1, M) warm-up forwards, then M - w
// times a forward and the oldest backward, then the w remaining backwards. At most
// w + 1 micro-batches are in flight; the bubble is (P - 1) / (M + P - 1) of the step when
// a backward takes twice a forward.
#include <algorithm>
#include <string>

#include "plugins/pipeline/plans.h"

namespace loom::pipeline {

Plan one_f_one_b_plan(const PipelineShape& s) {
  check_shape(s, "1f1b");
  if (s.chunks != 1)
    fail(Code::kInvalidArgument,
         "pipeline schedule '1f1b': " + std::to_string(s.chunks) +
             " virtual chunks per rank need the interleaved schedule (parallel."
             "pipeline_schedule {\"impl\": \"interleaved\"}) or parallel.vpp 1");
  const int32_t warmup = std::min(s.stages - s.rank - 1, s.micro_batches);
  Plan plan;
  for (int32_t m = 0; m < warmup; ++m) add_forward(plan, s, m, 0);
  for (int32_t i = 0; i < s.micro_batches - warmup; ++i) {
    add_forward(plan, s, warmup + i, 0);
    add_backward(plan, s, i, 0);
  }
  for (int32_t m = s.micro_batches - warmup; m < s.micro_batches; ++m) add_backward(plan, s, m, 0);
  return plan;
}

}  // namespace loom::pipeline
