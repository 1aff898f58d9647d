// Progress: what a training run tells its user (DESIGN.md section 8): a line per log
// interval (iteration, loss, LR, grad norm, tokens/s, step time, MFU, memory, the loss
// scale under f16 and the modules' metrics), a line per skipped step and per validation,
// the same figures in <run dir>/metrics.jsonl, and on a terminal a progress bar with the
// time left.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/train/tensorboard.h"

namespace loom::core {

/// What one optimizer step did.
struct StepResult {
  int64_t step = 0;         ///< 1-based step just taken (or skipped)
  double loss = 0;          ///< mean of the micro-batch losses
  double grad_norm = 0;     ///< global L2 norm of the (unscaled, unclipped) gradients
  double lr = 0;            ///< learning rate used
  double loss_scale = 1;    ///< loss scale used (f16), else 1
  bool skipped = false;     ///< non-finite gradients or loss: no update
  double seconds = 0;       ///< wall time of the step
  double comm_seconds = 0;  ///< of which the training thread spent blocked in communication
  int64_t tokens = 0;       ///< tokens processed (by every data-parallel rank together)
  /// Result validation (ResultValidator): why the step's passes ran twice ("" when they
  /// did not), the first run's loss and norm, and whether the rerun reproduced them.
  std::string rerun_reason;
  double first_loss = 0, first_grad_norm = 0;
  bool rerun_reproduced = false;
};

/// The figures of one log line besides the steps' own.
struct LogFigures {
  double flops_per_step = 0, peak_flops = 0;  ///< for MFU (0 peak: no MFU)
  uint64_t peak_memory = 0, max_rss = 0;      ///< bytes
  std::optional<double> loss_scale;           ///< shown with dynamic loss scaling
  std::map<std::string, double> metrics;      ///< the modules' (StepMetrics::take)
  /// With several ranks: each rank's compute time per step over the interval (step time
  /// less the time blocked in communication), by rank; empty with one rank.
  std::vector<double> rank_compute_seconds;
  double straggler_factor = 2;  ///< /log/straggler_factor
};

class Progress {
 public:
  /// \param run_dir          metrics.jsonl (appended) and a TensorBoard event file
  ///                         (tensorboard.h) go here; empty for none
  /// \param steps            the run's last iteration
  /// \param first_iteration  where it starts (a resumed run: after the checkpoint's)
  Progress(const std::filesystem::path& run_dir, int64_t steps, int64_t first_iteration);
  ~Progress();

  /// Takes a step's result; a skipped step, and a step run again by result validation,
  /// get their own line at once (and a line in metrics.jsonl).
  void add(const StepResult& r);
  /// Prints (and writes) the log line of the steps since the last one, ending at
  /// `iteration`, and starts a new interval.
  void log(int64_t iteration, const LogFigures& figures);
  /// A validation result (not finite: nothing shown).
  void validation(int64_t iteration, double loss);
  /// The progress bar at `iteration` (on a terminal only).
  void bar(int64_t iteration);
  /// Clears the progress bar's line before other output.
  void clear_bar();

 private:
  std::ofstream metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // with metrics_
  bool tty_;
  int64_t steps_, first_iteration_;
  std::chrono::steady_clock::time_point start_;
  double loss_ = 0, time_ = 0, norm_ = 0, lr_ = 0;
  int64_t count_ = 0, tokens_ = 0, skipped_ = 0, steps_in_ = 0;
};

}  // namespace loom::core
