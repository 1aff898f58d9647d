// kinds::kPipelineSchedule: the order in which one pipeline rank runs forward and backward
// passes of micro-batches, and the sends and receives between stages.
//
// A schedule is pure: it lists actions for (rank, stages, micro-batches, virtual chunks);
// the core executes them. GPipe, 1F1B and interleaved 1F1B are schedules; so is any new one
// a plugin brings, with no change to the core.
#pragma once

#include <stdint.h>

#include "loom/object.h"
#include "loom/status.h"

namespace loom {

enum class PipelineOp : int32_t {
  kForward = 0,         ///< run forward of (micro_batch, chunk)
  kBackward = 1,        ///< run backward of (micro_batch, chunk)
  kSendActivation = 2,  ///< send forward output to the next stage
  kRecvActivation = 3,  ///< receive forward input from the previous stage
  kSendGrad = 4,        ///< send input gradient to the previous stage
  kRecvGrad = 5,        ///< receive output gradient from the next stage
  kBackwardInput = 6,   ///< backward for the input gradient only (zero-bubble split)
  kBackwardWeight = 7,  ///< the deferred weight-gradient part
};

struct PipelineAction {
  PipelineOp op;
  int32_t micro_batch;  ///< 0-based
  int32_t chunk;        ///< virtual pipeline chunk on this rank, 0-based
};

/// The shape of the pipeline a schedule is asked about.
struct PipelineShape {
  uint32_t struct_size;
  int32_t stages;         ///< pipeline-parallel size
  int32_t rank;           ///< this rank's stage, 0-based
  int32_t micro_batches;  ///< per optimizer step
  int32_t chunks;         ///< virtual chunks per rank (1 without interleaving)
};

class IPipelineSchedule : public IObject {
 public:
  /// Writes the actions of `shape.rank` in order. Call with actions == null to get the
  /// count in *count; then again with a buffer of that size.
  /// \param shape         the pipeline
  /// \param[out] actions  [*count] or null
  /// \param[in,out] count capacity in, number written (or needed) out
  virtual Status plan(const PipelineShape* shape, PipelineAction* actions,
                      int64_t* count) noexcept = 0;

 protected:
  ~IPipelineSchedule() = default;
};

}  // namespace loom
