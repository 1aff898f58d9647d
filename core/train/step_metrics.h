// StepMetrics: the numbers modules report while training (IForwardContext::metric: aux
// losses, load imbalance), combined for the log line and metrics.jsonl.
//
// A report is copied at once into a staging buffer on its device (no wait for the device);
// end_step reads the buffer back once, and the values join the log interval's running
// figures per name: mean of every report, or max. take() combines the interval over every
// rank (the names may differ between ranks: pipeline stages hold other layers) and starts
// a new interval.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/runtime/forward_context.h"
#include "loom/host.h"
#include "loom/kinds/comm_backend.h"

namespace loom::core {

class StepMetrics final : public MetricSink {
 public:
  /// \param device  the training device (the staging buffer goes where the first report
  ///                 from a device other than the CPU lives)
  StepMetrics(IHost& host, Device device);
  ~StepMetrics() override;
  StepMetrics(const StepMetrics&) = delete;
  StepMetrics& operator=(const StepMetrics&) = delete;

  void record(const std::string& name, const TensorView& value, MetricReduce reduce) override;
  /// Reads the step's reports into the interval's figures.
  void end_step();
  /// Drops the step's reports so far: its passes run again (result validation).
  void discard_step() { pending_.clear(); }
  /// The interval's values by name, over every rank of `world` (collective: every rank
  /// calls it at the same step; null or size 1: this rank's), then a new interval.
  std::map<std::string, double> take(ICommunicator* world);

 private:
  struct Figure {
    MetricReduce reduce = MetricReduce::kMean;
    double sum = 0, max = 0;
    int64_t count = 0;
  };
  void add(const std::string& name, MetricReduce reduce, double value);

  IHost& host_;
  Device device_;
  static constexpr int64_t kSlots = 1024;                      // reports staged per read-back
  void* staging_ = nullptr;                                    // (kSlots) f32 on the device
  std::vector<std::pair<std::string, MetricReduce>> pending_;  // staged reports, by slot
  std::map<std::string, Figure> interval_;
};

}  // namespace loom::core
