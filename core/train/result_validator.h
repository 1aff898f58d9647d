// Result validation, as Megatron's rerun state machine (megatron/core/rerun_state_machine.py,
// --rerun-mode validate_results): a step whose loss or gradient norm is non-finite, or
// whose loss is spiky, is run again on the same data before the optimizer sees it. A rerun
// that gives the same values (bit for bit) says the fault is reproducible: the data or the
// model, not the machine. A rerun that differs says it was transient (a hardware or
// software fault), and the step goes on with the rerun's gradients.
//
// A loss is spiky when it is at least `factor` times the largest |loss| of the first
// `samples` steps (Megatron's is_unexpectedly_large: those first steps only calibrate and
// are never rejected as spiky). Non-finite values are never counted into that largest.
// Under dynamic loss scaling (f16) non-finite gradients are expected overflows, so only a
// non-finite loss and spikes are checked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::core {

class ResultValidator {
 public:
  /// \param enabled          /train/rerun_mode is validate_results
  /// \param check_spiky      /train/check_for_spiky_loss
  /// \param factor           /train/spiky_loss_factor (>= 1)
  /// \param samples          /train/spiky_loss_samples (>= 1)
  /// \param overflow_normal  dynamic loss scaling: non-finite gradients are not faults
  ResultValidator(bool enabled, bool check_spiky, double factor, int64_t samples,
                  bool overflow_normal)
      : enabled_(enabled),
        check_spiky_(check_spiky),
        factor_(factor),
        samples_(samples),
        overflow_normal_(overflow_normal) {}

  bool enabled() const { return enabled_; }

  /// Why a step with this (global) loss and gradient norm should be rerun ("" when it
  /// should not): "non-finite loss", "non-finite gradients", or "spiky loss 1004 >= 10 x
  /// 4.62, the largest of the first 100 steps". Counts the loss into the calibration while
  /// the first `samples` steps last.
  std::string reject(double loss, double grad_norm);

  /// Whether a rerun reproduced a value: equal bits, or both NaN.
  static bool reproduced(double first, double rerun);

  /// One reason from every rank's (by rank; "" where a rank rejected nothing): the reason
  /// alone when every rank gave the same, else "rank 1: non-finite gradients; rank 3: ..."
  /// (the first four, then how many more).
  static std::string combine(const std::vector<std::string>& reasons);

 private:
  bool enabled_, check_spiky_;
  double factor_;
  int64_t samples_;
  bool overflow_normal_;
  int64_t seen_ = 0;
  double largest_ = 0;
};

}  // namespace loom::core
