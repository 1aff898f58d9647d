// The rules every pipeline plan keeps, checked without running anything (the executor
// checks a plan before it runs it; the simulator checks every rank's plan of a schedule):
//
//   - every (micro-batch, chunk) is forwarded once, then backwarded once, or split into
//     backward_input and then backward_weight;
//   - a chunk that is not the first virtual stage receives its input before its forward
//     and, after its backward (or backward_input), sends the input gradient back;
//   - a chunk that is not the last virtual stage sends its output after the forward and
//     receives the output gradient before the backward;
//   - micro-batches lie in [0, M), chunks in [0, V).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/kinds/pipeline_schedule.h"

namespace loom::core {

/// Where one of a rank's chunks sits.
struct ChunkPlace {
  bool first_stage = true;  ///< takes tokens: no activation to receive, no gradient to send
  bool last_stage = true;   ///< gives the loss: no activation to send, no gradient to receive
  bool can_split = true;    ///< its model has backward_weight (model 1.1)
};

/// "forward", "backward", "send_activation", ... (the op's name in messages and traces).
const char* pipeline_op_name(PipelineOp op);
/// A pass that computes (forward, backward or either half of a split backward).
bool is_pipeline_pass(PipelineOp op);
/// A receive (of an activation or a gradient), and a send.
bool is_pipeline_receive(PipelineOp op);
bool is_pipeline_send(PipelineOp op);

/// The places of rank `rank`'s `chunks` chunks in a pipeline of `stages` ranks (chunk c is
/// virtual stage c * stages + rank).
std::vector<ChunkPlace> chunk_places(int32_t stages, int32_t rank, int32_t chunks);

/// Checks `plan` for `micro_batches` micro-batches over `chunks` (one place per chunk);
/// throws InvalidArgument "pipeline schedule 'NAME': action I (OP of micro-batch M, chunk
/// C) RULE", or naming the missing pass of a (micro-batch, chunk).
void check_plan(const std::vector<PipelineAction>& plan, int32_t micro_batches,
                const std::vector<ChunkPlace>& chunks, const std::string& schedule);

}  // namespace loom::core
