// Faults injected on purpose, for the fault tests (tests/tools/fault_test.cc,
// tests/tools/parallel_test.cc): LOOM_TEST_FAULT="KIND:RANK:STEP" in the environment of
// every rank. Nothing happens without the variable. Kinds:
//   kill          SIGKILL rank RANK in the middle of step STEP (after its first micro-batch's
//                 backward, before the gradient reduction: its peers block in a collective)
//   hang          stop rank RANK there for ever
//   throw         fail there with an internal error, as a bug in a module would
//   nan, inf      set the first gradient element of rank RANK's first parameter to NaN
//                 (+inf) after the step's gradient reduction (a fault that spoils that
//                 rank's copy of the reduced gradients), in the first run of step STEP only
//                 (a transient fault)
//   nan_always    the same in every run of step STEP (a reproducible fault)
//   spike         add 1000 to rank RANK's loss of step STEP, first run only
//   spike_always  the same in every run of step STEP
//   slow          sleep STEP milliseconds in every step on rank RANK (a straggler)
//   fp8_skew      double rank RANK's first FP8 scale after the scale update of step STEP
//                 (FP8 state that no longer agrees across the amax group)
//   poison_overwrite  fill every kParamGradOverwrite gradient of rank RANK with NaN after the
//                 zero fill of every step from STEP on: a run keeps its bits only if each
//                 such gradient's first write of a step overwrites it (grad_first_write)
// (Faults inside a save: LOOM_CHECKPOINT_FAULT, core/checkpoint/checkpoint_writer.h.)
#pragma once

#include <cstdint>
#include <string>

#include "core/runtime/parameters.h"

namespace loom::core {

/// The fault LOOM_TEST_FAULT names (read once), or kind "" when none.
struct TestFault {
  std::string kind;
  int rank = -1;
  int64_t step = -1;
};
const TestFault& test_fault();

/// Whether a fault is set at all (the trainer installs its hooks only then).
bool test_fault_set();

/// After the first micro-batch's backward of `step` on `rank`: kill, hang, throw, slow.
void inject_fault_after_backward(int rank, int64_t step);

/// After the zero fill of the gradients of `step` on `rank`: poison_overwrite.
void inject_fault_after_zero_fill(int rank, int64_t step, IHost& host, ParameterSet& params);

/// After the gradient reduction of run `attempt` (0: the first) of `step` on `rank`: nan,
/// inf, nan_always.
void inject_fault_after_reduction(int rank, int64_t step, int attempt, IHost& host,
                                  ParameterSet& params);

/// After the FP8 recipe's scale update of `step` on `rank`: fp8_skew doubles element 0 of
/// `scale` (the recipe's f32 scales on `device`).
void inject_fault_into_fp8_scale(int rank, int64_t step, IHost& host, Device device,
                                 const TensorView& scale);

/// The step's local loss, spiked when spike or spike_always names (rank, step, attempt).
double inject_fault_into_loss(int rank, int64_t step, int attempt, double loss);

}  // namespace loom::core
