// Pipeline schedules as pure functions: the actions of one rank for one optimizer step
// (loom/kinds/pipeline_schedule.h), one schedule per file.
//
//   gpipe        every forward, then every backward (Huang et al. 2019)
//   1f1b         P - r - 1 warm-up forwards on rank r, then one forward and one backward in
//                turn, then the remaining backwards (Megatron's non-interleaved schedule,
//                PipeDream-Flush); at most P - r micro-batches in flight
//   interleaved  1f1b over V virtual chunks per rank: chunk c of rank r is virtual stage
//                c * P + r; micro-batches go in groups of `group` (Megatron's
//                microbatch_group_size_per_vp_stage, P by default) through chunk 0, then
//                the same group through chunk 1, ...; backwards in the same groups with the
//                chunks reversed; (P - r - 1) * 2 + (V - 1) * group warm-up forwards
//   zb_h1        1f1b with the backward split into input-gradient (B) and weight-gradient
//                (W) passes (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", ZB-H1):
//                rank r defers its W passes by up to P - r - 1 micro-batches and runs them
//                in the cool-down, where 1f1b waits for gradients; same activation memory
//                as 1f1b, a bubble of about a third of it when F, B and W take alike
//
// Every plan puts a receive right before the forward (or backward) that needs it and a
// send right after the pass that made it; the core's executor checks the rules
// (core/train/schedule_executor.h) and the simulator (core/train/plan_simulator.h) that the
// plans of all ranks fit together.
#pragma once

#include <loom/sdk.h>

#include <cstdint>
#include <vector>

namespace loom::pipeline {

using Plan = std::vector<PipelineAction>;

/// Checks a shape (stages >= 1, 0 <= rank < stages, micro_batches >= 1, chunks >= 1);
/// throws kInvalidArgument naming the field.
void check_shape(const PipelineShape& shape, const char* schedule);

/// Appends a forward of (m, chunk) with its receive (not the first virtual stage) and its
/// send (not the last).
void add_forward(Plan& plan, const PipelineShape& shape, int32_t m, int32_t chunk);
/// Appends a backward of (m, chunk) (kBackward, or kBackwardInput when `split`) with its
/// receive of the output gradient (not the last virtual stage) and its send of the input
/// gradient (not the first).
void add_backward(Plan& plan, const PipelineShape& shape, int32_t m, int32_t chunk,
                  bool split = false);

Plan gpipe_plan(const PipelineShape& shape);
Plan one_f_one_b_plan(const PipelineShape& shape);
/// \param group  micro-batches per group through each chunk (0: the number of stages)
Plan interleaved_plan(const PipelineShape& shape, int32_t group = 0);
Plan zb_h1_plan(const PipelineShape& shape);

}  // namespace loom::pipeline
