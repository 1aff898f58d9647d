// Out-of-range labels in the CUDA cross-entropy kernels (kernels/cuda/loss/label_errors.cuh):
// the call that meets one succeeds without a host sync, never reads outside the logits,
// writes NaN for that row's loss, and the error surfaces as kOutOfRange with the CPU
// kernels' message, through take_label_error after a sync and in the next cross-entropy
// call. Needs a GPU; skips, saying so, without one.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <loom/cpp/error.h>
#include <loom/cpp/tensor.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/loss/loss.h"
#include "kernels/cuda/probe/device_probe.h"

namespace loom::kernels::cuda {
namespace {

const KernelDesc& cuda_kernel(const char* op) {
  static const std::vector<KernelDesc> all = [] {
    std::vector<KernelDesc> k;
    add_loss_kernels(k);
    return k;
  }();
  for (const KernelDesc& k : all)
    if (std::strcmp(k.op, op) == 0 && k.dtype == DType::kF32) return k;
  ADD_FAILURE() << "no kernel for " << op;
  static const KernelDesc none{};
  return none;
}

// A device copy of a host vector, freed at scope exit.
template <class T>
struct DeviceVec {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceVec(const std::vector<T>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceVec() { cudaFree(ptr); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TensorView view(void* data, DType t, std::vector<int64_t> shape, DeviceType dev) {
  return make_view(data, t, shape.data(), static_cast<int32_t>(shape.size()), Device{dev, 0});
}

Status call(const KernelDesc& k, std::vector<TensorView> in, std::vector<TensorView> out) {
  OpCall c{};
  c.struct_size = sizeof(OpCall);
  c.inputs = in.data();
  c.num_inputs = static_cast<int32_t>(in.size());
  c.outputs = out.data();
  c.num_outputs = static_cast<int32_t>(out.size());
  return k.fn(&c);
}

class LabelErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_probe::query_devices().count == 0)
      GTEST_SKIP() << "no CUDA device: " << cuda_probe::query_devices().error;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    take_label_error();  // nothing left over from another test
  }
};

TEST_F(LabelErrorTest, ForwardReportsLazilyWithTheCpuMessage) {
  const int64_t N = 4, V = 10;
  std::vector<float> logits(N * V);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * i);
  const std::vector<int32_t> labels = {1, 12, 3, -1};  // 12: out of range; -1: masked out
  const std::vector<float> mask = {1.0f, 1.0f, 1.0f, 0.0f};
  DeviceVec<float> d_logits(logits), d_mask(mask);
  DeviceVec<float> loss{std::vector<float>(N)}, lse{std::vector<float>(N)},
      mean{std::vector<float>(1)};
  DeviceVec<int32_t> d_labels(labels);
  auto run_fwd = [&] {
    return call(cuda_kernel(ops::kCrossEntropyFwd),
                {view(d_logits.ptr, DType::kF32, {N, V}, DeviceType::kCuda),
                 view(d_labels.ptr, DType::kI32, {N}, DeviceType::kCuda),
                 view(d_mask.ptr, DType::kF32, {N}, DeviceType::kCuda)},
                {view(loss.ptr, DType::kF32, {N}, DeviceType::kCuda),
                 view(lse.ptr, DType::kF32, {N}, DeviceType::kCuda),
                 view(mean.ptr, DType::kF32, {1}, DeviceType::kCuda)});
  };
  Status s = run_fwd();
  ASSERT_EQ(s.code, Code::kOk) << take_message(&s);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got = loss.get();
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[3], 0.0f);
  EXPECT_TRUE(std::isnan(mean.get()[0])) << "the NaN row is in the masked mean";

  // The good rows equal the CPU reference's (run on rows 0 and 2 alone).
  std::vector<float> good_logits(2 * V), cpu_loss(2), cpu_lse(2), cpu_mean(1);
  std::copy(logits.begin(), logits.begin() + V, good_logits.begin());
  std::copy(logits.begin() + 2 * V, logits.begin() + 3 * V, good_logits.begin() + V);
  std::vector<int32_t> good_labels = {1, 3};
  s = call(*cpu::find_kernel(ops::kCrossEntropyFwd, DType::kF32, "cpu.ref"),
           {view(good_logits.data(), DType::kF32, {2, V}, DeviceType::kCpu),
            view(good_labels.data(), DType::kI32, {2}, DeviceType::kCpu), TensorView{}},
           {view(cpu_loss.data(), DType::kF32, {2}, DeviceType::kCpu),
            view(cpu_lse.data(), DType::kF32, {2}, DeviceType::kCpu),
            view(cpu_mean.data(), DType::kF32, {1}, DeviceType::kCpu)});
  ASSERT_EQ(s.code, Code::kOk) << take_message(&s);
  EXPECT_NEAR(got[0], cpu_loss[0], 1e-5 + 1e-4 * std::fabs(cpu_loss[0]));
  EXPECT_NEAR(got[2], cpu_loss[1], 1e-5 + 1e-4 * std::fabs(cpu_loss[1]));

  std::string msg = take_label_error();
  EXPECT_NE(msg.find("cross_entropy_fwd: labels[1] = 12 is outside [0, 10) (the vocabulary); "
                     "fix the data or set its mask to 0"),
            std::string::npos)
      << msg;
  EXPECT_EQ(take_label_error(), "") << "taken once";

  // Unsynchronised: the next call reports the error of the one before.
  s = run_fwd();
  ASSERT_EQ(s.code, Code::kOk) << take_message(&s);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  s = run_fwd();
  EXPECT_EQ(s.code, Code::kOutOfRange);
  msg = take_message(&s);
  EXPECT_NE(msg.find("labels[1] = 12"), std::string::npos) << msg;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(take_label_error(), "") << "reported by the call: not again";
}

}  // namespace
}  // namespace loom::kernels::cuda
