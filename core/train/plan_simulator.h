// The plans of every rank of a pipeline, run against each other on paper: each rank does its
// actions in order, a pass takes its cost, a send is posted at once (the executor's sends
// are asynchronous) and a receive waits until its send has been posted. What comes out is
// each action's start and end, each rank's busy time, and the bubble: the share of the
// step's span that the ranks sit idle. The simulator also checks that the plans fit
// together: every send has exactly one receive on the right neighbour (the rank of the next
// virtual stage for an activation, of the previous one for a gradient) and the other way
// round, no rank waits for ever (a deadlock is named with each stuck rank's action), and
// each rank's plan keeps the rules of plan_rules.h.
//
// Theory, with a backward twice a forward (B = 2F; split halves B_input = B_weight = F):
//   gpipe and 1f1b     bubble (P - 1) / (M + P - 1)
//   interleaved        (P - 1) / (V M + P - 1)
//   zb_h1              (P - 1) / (3 M + P - 1)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/kinds/pipeline_schedule.h"

namespace loom::core {

/// How long each pass of one chunk takes, in any unit.
struct PassCosts {
  double forward = 1;
  double backward = 2;         ///< a whole backward
  double backward_input = 1;   ///< the input-gradient half of a split backward
  double backward_weight = 1;  ///< the weight-gradient half
  double transfer = 0;         ///< from a send to its receive being satisfiable
};

/// One action of one rank, placed in time.
struct TimedAction {
  int32_t rank = 0;
  PipelineAction action{};
  double start = 0, end = 0;  ///< a receive: from when it was reached to when it got its data
};

struct Simulation {
  double span = 0;                     ///< from the first start to the last end
  std::vector<double> busy;            ///< per rank: time spent in passes
  std::vector<int32_t> peak_in_flight; ///< per rank: most (micro-batch, chunk) pairs between
                                       ///< their forward and their last backward pass
  std::vector<TimedAction> timeline;   ///< in the order the simulation ran them
  /// The idle share of the step: 1 - sum(busy) / (ranks * span).
  double bubble() const;
};

/// Simulates `plans` (one per rank of `plans.size()` stages, each for `micro_batches`
/// micro-batches over `chunks` chunks). Throws InvalidArgument naming the schedule, the
/// rank and the action for a plan that breaks a rule, a transfer without its partner, or a
/// deadlock.
Simulation simulate_plans(const std::vector<std::vector<PipelineAction>>& plans,
                          int32_t micro_batches, int32_t chunks, const PassCosts& costs,
                          const std::string& schedule);

/// The bubble the theory gives a schedule (see the top of this file) for B = 2F, or a
/// negative number for a schedule it does not know.
double theoretical_bubble(const std::string& schedule, int32_t stages, int32_t micro_batches,
                          int32_t chunks);

/// A per-rank text diagram of a simulation, one row per rank, one column per time unit of
/// `unit` (F, B, b = backward_input, W = backward_weight, '.' idle, micro-batch numbers
/// below), for `loom schedule show`.
std::string draw_timeline(const Simulation& sim, int32_t stages, double unit);

}  // namespace loom::core
