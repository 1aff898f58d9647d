// "interleaved": Megatron's interleaved 1F1B (forward_backward_pipelining_with_
// interleaving, Narayanan et al. 2021). Each rank holds V chunks; chunk c of rank r is
// virtual stage c * P + r. Micro-batches go in groups of G (Megatron's
// microbatch_group_size_per_vp_stage, default P): the group's forwards through chunk 0,
// then through chunk 1, ...; the last group takes whatever is left. Backwards follow the
// same table with the chunks reversed. Rank r runs (P - r - 1) * 2 + (V - 1) * G warm-up
// forwards (at most all M * V), then a forward and a backward in turn, then the remaining
// backwards. The bubble shrinks by V against 1f1b: (P - 1) / (V M + P - 1) of the step.
//
// Megatron's rules: P <= G <= M, and a last, partial group of at least P micro-batches;
// otherwise the ranks' plans can wait on each other for ever (the plan simulator finds such
// deadlocks, e.g. P 4, V 3, M 5), and such shapes are refused. The bubble formula holds
// exactly when G divides M.
#include <algorithm>
#include <string>
#include <utility>

#include "plugins/pipeline/plans.h"

namespace loom::pipeline {

Plan interleaved_plan(const PipelineShape& s, int32_t group) {
  check_shape(s, "interleaved");
  const int32_t g = group > 0 ? group : s.stages;
  if (g < s.stages)
    fail(Code::kInvalidArgument,
         "pipeline schedule 'interleaved': microbatch_group_size " + std::to_string(g) +
             " is smaller than the " + std::to_string(s.stages) +
             " pipeline stages; use at least parallel.pp micro-batches per group");
  const std::string group_name = group > 0 ? "microbatch_group_size" : "the pipeline stages";
  if (s.micro_batches < g)
    fail(Code::kInvalidArgument,
         "pipeline schedule 'interleaved': " + std::to_string(s.micro_batches) +
             " micro-batches per step are fewer than a group of " + std::to_string(g) + " (" +
             group_name + "); raise train.global_batch_size or use the 1f1b schedule");
  const int32_t rest = s.micro_batches % g;
  if (rest != 0 && rest < s.stages)
    fail(Code::kInvalidArgument,
         "pipeline schedule 'interleaved': " + std::to_string(s.micro_batches) +
             " micro-batches per step leave " + std::to_string(rest) + " after groups of " +
             std::to_string(g) + " (" + group_name + "), fewer than the " +
             std::to_string(s.stages) +
             " stages (the plans would wait on each other); choose train.global_batch_size so "
             "that the micro-batches per step are a multiple of the group, or use the 1f1b "
             "schedule");
  // (micro-batch, chunk) in the order of the forwards; backwards reverse the chunk.
  std::vector<std::pair<int32_t, int32_t>> table;
  for (int32_t first = 0; first < s.micro_batches; first += g) {
    int32_t end = first + g >= s.micro_batches ? s.micro_batches : first + g;
    for (int32_t c = 0; c < s.chunks; ++c)
      for (int32_t m = first; m < end; ++m) table.emplace_back(m, c);
  }
  const int32_t total = static_cast<int32_t>(table.size());
  const int32_t warmup =
      std::min(total, (s.stages - s.rank - 1) * 2 + (s.chunks - 1) * g);
  Plan plan;
  auto forward = [&](int32_t k) { add_forward(plan, s, table[k].first, table[k].second); };
  auto backward = [&](int32_t k) {
    add_backward(plan, s, table[k].first, s.chunks - 1 - table[k].second);
  };
  for (int32_t k = 0; k < warmup; ++k) forward(k);
  for (int32_t k = 0; k < total - warmup; ++k) {
    forward(warmup + k);
    backward(k);
  }
  for (int32_t k = total - warmup; k < total; ++k) backward(k);
  return plan;
}

}  // namespace loom::pipeline
