#include "core/train/memory_estimate.h"

#include <fmt/format.h>

namespace loom::core {

uint64_t MemoryEstimate::total() const {
  return weights + grads + master + optimizer + fp8 + shard_buffers + activations.value_or(0);
}

std::string MemoryEstimate::describe() const {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  auto g = [&](uint64_t b) { return static_cast<double>(b) / kGiB; };
  return fmt::format(
      "{:.3g} GiB: weights {:.3g}, grads {:.3g}, master {:.3g}, optimizer {:.3g}, {}{}"
      "activations {}",
      g(total()), g(weights), g(grads), g(master), g(optimizer),
      shard_buffers > 0 ? fmt::format("zero-1 buffers {:.3g}, ", g(shard_buffers)) : std::string(),
      fp8 > 0 ? fmt::format("fp8 state {:.3g}, ", g(fp8)) : std::string(),
      activations ? fmt::format("{:.3g} GiB{}", g(*activations),
                                routed ? " (MoE rows as if balanced, or at capacity)" : "")
                  : std::string("not estimated (a module the model cannot size)"));
}

}  // namespace loom::core
