// The built-in plan of a run without pipeline parallelism: each micro-batch's forward, then
// its backward, in order (the gradient-accumulation loop of a single stage). Pipeline
// schedules for several stages are pipeline_schedule plugins; this one is the core's so a
// run needs no plugin to train.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/kinds/pipeline_schedule.h"

namespace loom::core {

/// [forward 0, backward 0, forward 1, backward 1, ...] for `micro_batches` micro-batches of
/// chunk 0.
std::vector<PipelineAction> no_pipelining_plan(int32_t micro_batches);

}  // namespace loom::core
