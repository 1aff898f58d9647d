// "gpipe": every micro-batch forward through this rank's chunks, then every backward
// (chunks in reverse). The simplest schedule; all M micro-batches are in flight at once.
#include "plugins/pipeline/plans.h"

namespace loom::pipeline {

Plan gpipe_plan(const PipelineShape& s) {
  check_shape(s, "gpipe");
  Plan plan;
  for (int32_t c = 0; c < s.chunks; ++c)
    for (int32_t m = 0; m < s.micro_batches; ++m) add_forward(plan, s, m, c);
  for (int32_t c = s.chunks - 1; c >= 0; --c)
    for (int32_t m = 0; m < s.micro_batches; ++m) add_backward(plan, s, m, c);
  return plan;
}

}  // namespace loom::pipeline
