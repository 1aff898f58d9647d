#include "kernels/cuda/probe/device_probe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace loom::cuda_probe {
namespace {

TEST(QueryDevicesTest, ReportsEitherDevicesOrWhyNone) {
  const DeviceQuery query = query_devices();
  EXPECT_GE(query.count, 0);
  // Exactly one of the two: a machine with devices has no error, one without says why.
  EXPECT_EQ(query.count == 0, !query.error.empty())
      << "count " << query.count << ", error '" << query.error << "'";
  // Asking twice gives the same answer: the first failure leaves no sticky error behind.
  const DeviceQuery again = query_devices();
  EXPECT_EQ(again.count, query.count);
  EXPECT_EQ(again.error, query.error);
}

TEST(SaxpyArgumentsTest, EmptyInputNeedsNoDevice) {
  std::string error;
  EXPECT_TRUE(saxpy(2.0f, nullptr, nullptr, nullptr, 0, &error)) << error;
  EXPECT_TRUE(error.empty());
}

TEST(SaxpyArgumentsTest, RejectsNegativeLengthAndNullArrays) {
  float x = 1.0f, y = 2.0f, out = 0.0f;
  std::string error;
  EXPECT_FALSE(saxpy(2.0f, &x, &y, &out, -1, &error));
  EXPECT_NE(error.find("n = -1"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(saxpy(2.0f, &x, nullptr, &out, 1, &error));
  EXPECT_NE(error.find("invalid arguments"), std::string::npos) << error;
  EXPECT_FALSE(saxpy(2.0f, &x, &y, &out, -1, nullptr));  // a null `error` is allowed
}

// Without a device, saxpy must fail with the runtime's reason, not crash or claim success.
TEST(SaxpyWithoutDeviceTest, FailsWithReason) {
  const DeviceQuery query = query_devices();
  if (query.count > 0) {
    GTEST_SKIP() << "a CUDA device is present; the failure path is not reachable";
  }
  const std::vector<float> x(7, 1.0f), y(7, 2.0f);
  std::vector<float> out(7);
  std::string error;
  EXPECT_FALSE(saxpy(3.0f, x.data(), y.data(), out.data(), 7, &error));
  EXPECT_FALSE(error.empty());
}

class SaxpyOnDeviceTest : public testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const DeviceQuery query = query_devices();
    if (query.count == 0) {
      std::printf("[cuda] skipped: no CUDA device (%s)\n", query.error.c_str());
      GTEST_SKIP() << "no CUDA device: " << query.error;
    }
  }
};

TEST_P(SaxpyOnDeviceTest, MatchesCpuLoop) {
  const int n = GetParam();
  const float a = 1.75f;
  std::mt19937 rng(n);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(n), y(n), out(n, NAN);  // (n,) each
  for (int i = 0; i < n; ++i) {
    x[i] = uniform(rng);
    y[i] = uniform(rng);
  }

  std::string error;
  ASSERT_TRUE(saxpy(a, x.data(), y.data(), out.data(), n, &error)) << error;

  // nvcc contracts a * x + y into one fma, the CPU loop may round twice: allow an ulp or two.
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    const float expected = a * x[i] + y[i];
    const float tolerance = 4e-7f * (std::fabs(a * x[i]) + std::fabs(y[i]));
    if (!(std::fabs(out[i] - expected) <= tolerance) && ++mismatches <= 5) {
      ADD_FAILURE() << "out[" << i << "] = " << out[i] << ", expected " << expected;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Lengths, SaxpyOnDeviceTest, testing::Values(1, 7, 1000, 1 << 20));

}  // namespace
}  // namespace loom::cuda_probe

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
