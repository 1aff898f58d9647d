// StepMetrics: reports of a step combine into the log interval's value by name, the mean of
// every report or their max, and a new interval starts after take().
#include "core/train/step_metrics.h"

#include <gtest/gtest.h>

#include "core/plugin/host.h"
#include "loom/cpp/tensor.h"

namespace loom::core {
namespace {

TEST(StepMetrics, MeanAndMaxOverEveryReportOfTheInterval) {
  Host host(nullptr, 0);
  StepMetrics metrics(host, kCpu);
  float v = 0;
  TensorView scalar = make_view(&v, DType::kF32, nullptr, 0);
  auto report = [&](const char* name, float value, MetricReduce reduce) {
    v = value;
    metrics.record(name, scalar, reduce);
  };
  report("aux", 1.0f, MetricReduce::kMean);
  report("imbalance", 1.5f, MetricReduce::kMax);
  metrics.end_step();
  report("aux", 3.0f, MetricReduce::kMean);
  report("imbalance", 1.25f, MetricReduce::kMax);
  report("aux", 5.0f, MetricReduce::kMean);
  metrics.end_step();
  std::map<std::string, double> values = metrics.take(nullptr);
  ASSERT_EQ(values.size(), 2u);
  EXPECT_DOUBLE_EQ(values["aux"], 3.0);  // (1 + 3 + 5) / 3
  EXPECT_DOUBLE_EQ(values["imbalance"], 1.5);
  EXPECT_TRUE(metrics.take(nullptr).empty()) << "the interval did not restart";
}

}  // namespace
}  // namespace loom::core
