#include "core/parallel/roles.h"

#include <fmt/format.h>

#include "core/util/errors.h"

namespace loom::core {

GridGroup role_group(const ProcessGrid& grid, ParallelRole role, const RoleOptions& options) {
  switch (role) {
    case ParallelRole::kWorld:
      return grid.group("world");
    case ParallelRole::kTensor:
      return grid.group("tp");
    case ParallelRole::kContext:
      return grid.group("cp");
    case ParallelRole::kPipeline:
      return grid.group("pp");
    case ParallelRole::kData:
      return grid.group("cp,ep,dp");
    case ParallelRole::kExpert:
      return grid.expert_group("ep");
    case ParallelRole::kExpertTensor:
      return grid.expert_group("etp");
    case ParallelRole::kExpertData:
      return grid.expert_group("edp");
    case ParallelRole::kEmbedding:
      return grid.embedding_group();
    case ParallelRole::kGradNorm:
      return grid.group(options.distributed_optimizer ? "tp,cp,ep,dp,pp" : "tp,pp");
    case ParallelRole::kAmax:
      return grid.group("tp,cp,ep,dp");
  }
  throw InvalidArgument(
      fmt::format("unknown parallel role {} (loom/host.h lists them)", static_cast<int32_t>(role)));
}

}  // namespace loom::core
