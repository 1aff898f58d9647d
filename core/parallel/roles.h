// Process groups by role (loom::ParallelRole, loom/host.h): which dimensions of the process
// grid each role spans. Components ask for groups by role, never by dimension names, so a
// new dimension (context or expert parallelism) changes this table only (DESIGN.md
// section 5).
//
//   world         every rank
//   tensor        tp                 context   cp                pipeline   pp
//   data          cp, ep, dp: the replicas of the dense parameters (their gradients are
//                 averaged over it; Megatron's data-parallel-with-context-parallel group)
//   expert        the experts' ep    expert-tensor  etp          expert-data  edp
//   embedding     the first and the last stage of this rank's pipeline
//   grad-norm     the ranks whose gradient pieces make up the model once: tp and pp, and
//                 with the distributed optimizer also the data dimensions its shards
//                 split (cp, ep, dp), i.e. every rank
//   amax          tp, cp, ep, dp: the ranks that quantise the same tensors in FP8
#pragma once

#include <string>

#include "core/parallel/grid.h"
#include "loom/host.h"
#include "loom/kinds/comm_backend.h"

namespace loom::core {

/// What the role table needs besides the grid.
struct RoleOptions {
  /// The distributed optimizer shards gradients over the data dimensions, which then belong
  /// to the grad-norm group.
  bool distributed_optimizer = false;
};

/// The group of this rank (grid.rank()) for `role`.
GridGroup role_group(const ProcessGrid& grid, ParallelRole role, const RoleOptions& options);

/// Where a multi-process run's communicators come from (ParallelState), for the host's
/// IHost::communicator and IHost::group.
class GroupSource {
 public:
  virtual ~GroupSource() = default;
  /// The communicator of this rank's group over grid dimensions ("tp", "tp,dp", "world").
  virtual ICommunicator& comm(const std::string& dims) = 0;
  /// The communicator of this rank's group for `role`.
  virtual ICommunicator& group(ParallelRole role) = 0;
};

}  // namespace loom::core
