// What every schedule shares: shape checks and a pass with its transfers.
#include "plugins/pipeline/plans.h"

#include <string>

namespace loom::pipeline {

void check_shape(const PipelineShape& s, const char* schedule) {
  auto bad = [&](const std::string& what) {
    fail(Code::kInvalidArgument, std::string("pipeline schedule '") + schedule + "': " + what);
  };
  if (s.stages < 1) bad("stages " + std::to_string(s.stages) + " < 1");
  if (s.rank < 0 || s.rank >= s.stages)
    bad("rank " + std::to_string(s.rank) + " is not a stage of " + std::to_string(s.stages));
  if (s.micro_batches < 1)
    bad(std::to_string(s.micro_batches) + " micro-batches: a step needs at least one");
  if (s.chunks < 1) bad(std::to_string(s.chunks) + " virtual chunks: need at least one");
}

namespace {

bool first_virtual(const PipelineShape& s, int32_t chunk) { return chunk == 0 && s.rank == 0; }
bool last_virtual(const PipelineShape& s, int32_t chunk) {
  return chunk == s.chunks - 1 && s.rank == s.stages - 1;
}

}  // namespace

void add_forward(Plan& plan, const PipelineShape& s, int32_t m, int32_t chunk) {
  if (!first_virtual(s, chunk)) plan.push_back({PipelineOp::kRecvActivation, m, chunk});
  plan.push_back({PipelineOp::kForward, m, chunk});
  if (!last_virtual(s, chunk)) plan.push_back({PipelineOp::kSendActivation, m, chunk});
}

void add_backward(Plan& plan, const PipelineShape& s, int32_t m, int32_t chunk, bool split) {
  if (!last_virtual(s, chunk)) plan.push_back({PipelineOp::kRecvGrad, m, chunk});
  plan.push_back({split ? PipelineOp::kBackwardInput : PipelineOp::kBackward, m, chunk});
  if (!first_virtual(s, chunk)) plan.push_back({PipelineOp::kSendGrad, m, chunk});
}

}  // namespace loom::pipeline
