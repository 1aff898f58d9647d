#include "core/train/plan_rules.h"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "core/util/errors.h"

namespace loom::core {
namespace {

// What has happened to one (micro-batch, chunk) while a plan is checked.
struct Progress {
  bool received = false, forwarded = false, sent = false;
  bool grad_received = false, backwarded = false, split = false, weighted = false;
  bool grad_sent = false;
};

}  // namespace

const char* pipeline_op_name(PipelineOp op) {
  switch (op) {
    case PipelineOp::kForward:
      return "forward";
    case PipelineOp::kBackward:
      return "backward";
    case PipelineOp::kSendActivation:
      return "send_activation";
    case PipelineOp::kRecvActivation:
      return "recv_activation";
    case PipelineOp::kSendGrad:
      return "send_grad";
    case PipelineOp::kRecvGrad:
      return "recv_grad";
    case PipelineOp::kBackwardInput:
      return "backward_input";
    case PipelineOp::kBackwardWeight:
      return "backward_weight";
  }
  return "unknown";
}

bool is_pipeline_pass(PipelineOp op) {
  return op == PipelineOp::kForward || op == PipelineOp::kBackward ||
         op == PipelineOp::kBackwardInput || op == PipelineOp::kBackwardWeight;
}

bool is_pipeline_receive(PipelineOp op) {
  return op == PipelineOp::kRecvActivation || op == PipelineOp::kRecvGrad;
}

bool is_pipeline_send(PipelineOp op) {
  return op == PipelineOp::kSendActivation || op == PipelineOp::kSendGrad;
}

std::vector<ChunkPlace> chunk_places(int32_t stages, int32_t rank, int32_t chunks) {
  std::vector<ChunkPlace> places(static_cast<size_t>(chunks));
  for (int32_t c = 0; c < chunks; ++c) {
    places[static_cast<size_t>(c)].first_stage = c == 0 && rank == 0;
    places[static_cast<size_t>(c)].last_stage = c == chunks - 1 && rank == stages - 1;
  }
  return places;
}

void check_plan(const std::vector<PipelineAction>& plan, int32_t micro_batches,
                const std::vector<ChunkPlace>& places, const std::string& schedule) {
  const int32_t chunks = static_cast<int32_t>(places.size());
  std::map<std::pair<int32_t, int32_t>, Progress> seen;
  auto refuse = [&](size_t index, const PipelineAction& a, const std::string& rule) {
    throw InvalidArgument(
        fmt::format("pipeline schedule '{}': action {} ({} of micro-batch {}, chunk {}) {}",
                    schedule, index, pipeline_op_name(a.op), a.micro_batch, a.chunk, rule));
  };
  for (size_t i = 0; i < plan.size(); ++i) {
    const PipelineAction& a = plan[i];
    if (a.micro_batch < 0 || a.micro_batch >= micro_batches)
      refuse(i, a, fmt::format("names a micro-batch outside [0, {})", micro_batches));
    if (a.chunk < 0 || a.chunk >= chunks)
      refuse(i, a, fmt::format("names a chunk outside [0, {}) (this rank's chunks)", chunks));
    const ChunkPlace& place = places[static_cast<size_t>(a.chunk)];
    const bool first = place.first_stage, last = place.last_stage;
    Progress& p = seen[{a.micro_batch, a.chunk}];
    switch (a.op) {
      case PipelineOp::kRecvActivation:
        if (first) refuse(i, a, "is on the first stage, which takes tokens, not activations");
        if (p.received || p.forwarded) refuse(i, a, "comes twice or after the forward");
        p.received = true;
        break;
      case PipelineOp::kForward:
        if (p.forwarded) refuse(i, a, "comes twice");
        if (!first && !p.received) refuse(i, a, "comes before its input was received");
        p.forwarded = true;
        break;
      case PipelineOp::kSendActivation:
        if (last) refuse(i, a, "is on the last stage, which gives the loss, not activations");
        if (!p.forwarded || p.sent) refuse(i, a, "comes before the forward or twice");
        p.sent = true;
        break;
      case PipelineOp::kRecvGrad:
        if (last) refuse(i, a, "is on the last stage, whose gradient is the loss's");
        if (!p.forwarded || p.grad_received) refuse(i, a, "comes before the forward or twice");
        p.grad_received = true;
        break;
      case PipelineOp::kBackward:
      case PipelineOp::kBackwardInput:
        if (!p.forwarded) refuse(i, a, "comes before its forward");
        if (p.backwarded) refuse(i, a, "comes twice");
        if (!last && !p.grad_received) refuse(i, a, "comes before its output gradient arrived");
        if (a.op == PipelineOp::kBackwardInput && !place.can_split)
          refuse(i, a,
                 "splits the backward, which the model cannot (it was built against SDK 1.4 "
                 "or older: model 1.1 has backward_weight)");
        p.backwarded = true;
        p.split = a.op == PipelineOp::kBackwardInput;
        break;
      case PipelineOp::kBackwardWeight:
        if (!p.backwarded || !p.split || p.weighted)
          refuse(i, a, "needs a backward_input before it, once");
        p.weighted = true;
        break;
      case PipelineOp::kSendGrad:
        if (first) refuse(i, a, "is on the first stage, which has no input gradient to send");
        if (!p.backwarded || p.grad_sent) refuse(i, a, "comes before the backward or twice");
        p.grad_sent = true;
        break;
      default:
        refuse(i, a, "is not a pipeline op");
    }
  }
  for (int32_t m = 0; m < micro_batches; ++m)
    for (int32_t c = 0; c < chunks; ++c) {
      const Progress& p = seen[{m, c}];
      const ChunkPlace& place = places[static_cast<size_t>(c)];
      const char* missing = !p.forwarded                            ? "forward"
                            : !p.backwarded                         ? "backward"
                            : p.split && !p.weighted                ? "backward_weight"
                            : !place.last_stage && !p.sent       ? "send_activation"
                            : !place.first_stage && !p.grad_sent ? "send_grad"
                                                                    : nullptr;
      if (missing != nullptr)
        throw InvalidArgument(
            fmt::format("pipeline schedule '{}': micro-batch {} of chunk {} has no {} in the plan",
                        schedule, m, c, missing));
    }
}

}  // namespace loom::core
