// The CUDA device runtime. Without a GPU (or driver) it must say why and fail every device
// call cleanly; with one, memory, copies, zero fills and synchronisation are checked on the
// device. The device tests print "[cuda] skipped: <reason>" when there is none.
#include "kernels/cuda/runtime/cuda_runtime.h"

#include <gtest/gtest.h>
#include <loom/cpp/error.h>
#include <loom/kinds.h>
#include <stdio.h>
#include <string.h>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::kernels::cuda {
namespace {

std::string to_string(StringView view) { return std::string(view.data, view.size); }

// The code of `status`, with its message in *message (released).
Code code_of(Status status, std::string* message) {
  const Code code = status.code;
  *message = code == Code::kOk ? std::string() : take_message(&status);
  return code;
}

TEST(PeakBf16FlopsTest, KnowsTheHopperPartsByName) {
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H100 SXM5 94GB"), 989.4e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H200"), 989.4e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H100 NVL"), 0);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H200 NVL"), 0);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA A100-SXM4-80GB"), 0);
  EXPECT_EQ(peak_bf16_flops_for(""), 0);
  EXPECT_EQ(peak_bf16_flops_for(nullptr), 0);
}

TEST(CudaRuntimeTest, DescribesItself) {
  CudaRuntime runtime;
  const InterfaceInfo info = runtime.interface_info();
  EXPECT_STREQ(info.kind, kinds::kDeviceRuntime.kind);
  EXPECT_EQ(info.major, kinds::kDeviceRuntime.major);
  EXPECT_EQ(info.minor, kinds::kDeviceRuntime.minor);
  EXPECT_EQ(runtime.device_type(), DeviceType::kCuda);
  EXPECT_EQ(runtime.compute_stream(0), nullptr);  // the legacy default stream
}

TEST(CudaRuntimeTest, ReportsEitherDevicesOrWhyNone) {
  CudaRuntime runtime;
  const int32_t count = runtime.device_count();
  const std::string reason = to_string(runtime.unavailable_reason());
  EXPECT_GE(count, 0);
  EXPECT_EQ(count == 0, !reason.empty()) << "count " << count << ", reason '" << reason << "'";
  // The process-wide instance sees the same, and asking twice changes nothing (no sticky
  // error left behind by the first query).
  CudaRuntime* shared = cuda_runtime();
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared, cuda_runtime());
  EXPECT_EQ(shared->device_count(), count);
  EXPECT_EQ(to_string(shared->unavailable_reason()), reason);
}

TEST(CudaRuntimeWithoutDeviceTest, EveryDeviceCallFailsCleanlyWithTheReason) {
  CudaRuntime runtime;
  if (runtime.device_count() > 0) {
    GTEST_SKIP() << "a CUDA device is present; the no-device path is not reachable";
  }
  const std::string reason = to_string(runtime.unavailable_reason());
  ASSERT_FALSE(reason.empty());
  printf("[cuda] no device: %s\n", reason.c_str());

  std::string message;
  void* pointer = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(code_of(runtime.allocate(0, 1024, &pointer), &message), Code::kUnavailable);
  EXPECT_EQ(pointer, nullptr);
  EXPECT_NE(message.find("allocate on cuda:0: no CUDA device can be used"), std::string::npos)
      << message;
  EXPECT_NE(message.find(reason), std::string::npos) << message;

  DeviceProperties properties;
  EXPECT_EQ(code_of(runtime.properties(0, &properties), &message), Code::kUnavailable);
  DeviceMemoryStats stats;
  EXPECT_EQ(code_of(runtime.memory_stats(0, &stats), &message), Code::kUnavailable);
  EXPECT_EQ(code_of(runtime.empty_cache(0), &message), Code::kUnavailable);
  char host[16] = {};
  EXPECT_EQ(code_of(runtime.copy(0, host, host, sizeof host, CopyKind::kHostToDevice), &message),
            Code::kUnavailable);
  EXPECT_EQ(code_of(runtime.fill_zero(0, host, sizeof host), &message), Code::kUnavailable);
  EXPECT_EQ(code_of(runtime.synchronize(0), &message), Code::kUnavailable);
  EXPECT_NE(message.find("synchronize on cuda:0"), std::string::npos) << message;
  EXPECT_EQ(code_of(runtime.capture_begin(0), &message), Code::kUnavailable);
  EXPECT_NE(message.find("capture_begin on cuda:0"), std::string::npos) << message;
  void* graph = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(code_of(runtime.capture_end(0, &graph), &message), Code::kUnavailable);
  EXPECT_EQ(graph, nullptr);

  // The void methods log instead of failing.
  testing::internal::CaptureStderr();
  runtime.deallocate(0, host);
  runtime.reset_peak(0);
  runtime.deallocate(0, nullptr);  // a no-op, not logged
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("deallocate on cuda:0: no CUDA device can be used"), std::string::npos) << log;
  EXPECT_NE(log.find("reset_peak on cuda:0"), std::string::npos) << log;
}

class CudaRuntimeOnDeviceTest : public testing::Test {
 protected:
  void SetUp() override {
    if (runtime_.device_count() == 0) {
      const std::string reason = to_string(runtime_.unavailable_reason());
      printf("[cuda] skipped: %s\n", reason.c_str());
      GTEST_SKIP() << "no CUDA device: " << reason;
    }
  }

  // Status to a test failure with its message.
  void expect_ok(Status status, const char* what) {
    std::string message;
    EXPECT_EQ(code_of(status, &message), Code::kOk) << what << ": " << message;
  }

  CudaRuntime runtime_;
};

TEST_F(CudaRuntimeOnDeviceTest, PropertiesOfEveryDevice) {
  for (int32_t i = 0; i < runtime_.device_count(); ++i) {
    DeviceProperties p;
    memset(&p, 0xff, sizeof p);
    expect_ok(runtime_.properties(i, &p), "properties");
    ASSERT_NE(memchr(p.name, '\0', sizeof p.name), nullptr) << "name not terminated";
    EXPECT_GT(strlen(p.name), 0u);
    EXPECT_GE(p.major, 1);
    EXPECT_GE(p.minor, 0);
    EXPECT_GT(p.multiprocessors, 0);
    EXPECT_GT(p.total_memory, uint64_t{1} << 30);
    EXPECT_EQ(p.peak_bf16_flops, peak_bf16_flops_for(p.name));
    printf("[cuda] device %d: %s, sm_%d%d, %d SMs, %.1f GiB, peak bf16 %.1f TFLOP/s\n", i, p.name,
           p.major, p.minor, p.multiprocessors, p.total_memory / 1073741824.0,
           p.peak_bf16_flops / 1e12);
  }
  DeviceProperties p;
  std::string message;
  EXPECT_EQ(code_of(runtime_.properties(runtime_.device_count(), &p), &message), Code::kOutOfRange);
  EXPECT_NE(message.find("no such device"), std::string::npos) << message;
  EXPECT_EQ(code_of(runtime_.properties(-1, &p), &message), Code::kOutOfRange);
}

TEST_F(CudaRuntimeOnDeviceTest, CopiesRoundTripAndZeroFills) {
  const size_t n = 1000003;  // odd, so the tail is not a multiple of any vector width
  const uint64_t bytes = n * sizeof(float);
  std::vector<float> input(n), output(n, -1.0f);
  for (size_t i = 0; i < n; ++i) input[i] = static_cast<float>(i % 9973) * 0.5f - 7.0f;

  void* a = nullptr;
  void* b = nullptr;
  expect_ok(runtime_.allocate(0, bytes, &a), "allocate a");
  expect_ok(runtime_.allocate(0, bytes, &b), "allocate b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 256, 0u);

  expect_ok(runtime_.copy(0, a, input.data(), bytes, CopyKind::kHostToDevice), "to device");
  // The host buffer may be reused at once: scribbling on it must not change the device copy.
  std::vector<float> saved = input;
  std::fill(input.begin(), input.end(), 123.0f);
  expect_ok(runtime_.copy(0, b, a, bytes, CopyKind::kDeviceToDevice), "device to device");
  expect_ok(runtime_.copy(0, output.data(), b, bytes, CopyKind::kDeviceToHost), "to host");
  EXPECT_EQ(memcmp(output.data(), saved.data(), bytes), 0);

  // Zero a middle range of b, at an offset that is not a multiple of 16 bytes.
  const size_t first = 12345, count = 400001;
  expect_ok(runtime_.fill_zero(0, static_cast<float*>(b) + first, count * sizeof(float)),
            "fill_zero");
  expect_ok(runtime_.copy(0, output.data(), b, bytes, CopyKind::kDeviceToHost), "to host");
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const float expected = (i >= first && i < first + count) ? 0.0f : saved[i];
    if (output[i] != expected && ++wrong <= 5) {
      ADD_FAILURE() << "b[" << i << "] = " << output[i] << ", expected " << expected;
    }
  }
  EXPECT_EQ(wrong, 0u);

  // Zero bytes are no-ops, even with null pointers.
  expect_ok(runtime_.copy(0, nullptr, nullptr, 0, CopyKind::kDeviceToHost), "empty copy");
  expect_ok(runtime_.fill_zero(0, nullptr, 0), "empty fill");
  std::string message;
  EXPECT_EQ(code_of(runtime_.copy(0, nullptr, a, 4, CopyKind::kDeviceToHost), &message),
            Code::kInvalidArgument);
  expect_ok(runtime_.synchronize(0), "synchronize");
  runtime_.deallocate(0, a);
  runtime_.deallocate(0, b);
}

// A graph of a zero fill and a device-to-device copy: nothing runs at the capture, every
// replay runs both on the buffers' current contents; the capture's allocation stays the
// graph's; host copies and synchronize are refused while capturing, and end the capture
// with that error.
TEST_F(CudaRuntimeOnDeviceTest, GraphsRecordAndReplayTheComputeStreamsWork) {
  const size_t n = 4099;
  const uint64_t bytes = n * sizeof(float);
  std::vector<float> input(n), output(n, -1.0f);
  for (size_t i = 0; i < n; ++i) input[i] = static_cast<float>(i) + 0.25f;
  void* src = nullptr;
  void* dst = nullptr;
  expect_ok(runtime_.allocate(0, bytes, &src), "allocate src");
  expect_ok(runtime_.allocate(0, bytes, &dst), "allocate dst");
  expect_ok(runtime_.copy(0, src, input.data(), bytes, CopyKind::kHostToDevice), "src");
  expect_ok(runtime_.copy(0, dst, input.data(), bytes, CopyKind::kHostToDevice), "dst");

  expect_ok(runtime_.capture_begin(0), "capture_begin");
  EXPECT_NE(runtime_.compute_stream(0), nullptr) << "a capture runs on a stream of its own";
  void* scratch = nullptr;
  expect_ok(runtime_.allocate(0, bytes, &scratch), "allocate in the capture");
  expect_ok(runtime_.fill_zero(0, dst, bytes / 2), "captured fill_zero");
  expect_ok(runtime_.copy(0, scratch, src, bytes, CopyKind::kDeviceToDevice), "captured copy");
  expect_ok(runtime_.copy(0, static_cast<float*>(dst) + n / 2, static_cast<float*>(scratch) + n / 2,
                          bytes - (n / 2) * sizeof(float), CopyKind::kDeviceToDevice),
            "captured copy 2");
  runtime_.deallocate(0, scratch);  // back to the graph's pool, not to everyone
  void* graph = nullptr;
  expect_ok(runtime_.capture_end(0, &graph), "capture_end");
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(runtime_.compute_stream(0), nullptr);

  // Nothing ran yet: dst is still the input.
  expect_ok(runtime_.copy(0, output.data(), dst, bytes, CopyKind::kDeviceToHost), "read");
  EXPECT_EQ(memcmp(output.data(), input.data(), bytes), 0);
  // Replays read src as it is then.
  for (float offset : {1000.0f, 2000.0f}) {
    std::vector<float> now(n);
    for (size_t i = 0; i < n; ++i) now[i] = input[i] + offset;
    expect_ok(runtime_.copy(0, src, now.data(), bytes, CopyKind::kHostToDevice), "new src");
    expect_ok(runtime_.graph_replay(0, graph), "replay");
    expect_ok(runtime_.copy(0, output.data(), dst, bytes, CopyKind::kDeviceToHost), "read");
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      const float expected = i < n / 2 ? 0.0f : now[i];
      if (output[i] != expected && ++wrong <= 5)
        ADD_FAILURE() << "after a replay, dst[" << i << "] = " << output[i] << ", expected "
                      << expected;
    }
    EXPECT_EQ(wrong, 0u);
  }
  runtime_.graph_destroy(0, graph);

  // Refusals end the capture with the first one's message.
  std::string message;
  expect_ok(runtime_.capture_begin(0), "capture_begin");
  EXPECT_EQ(code_of(runtime_.copy(0, output.data(), dst, bytes, CopyKind::kDeviceToHost), &message),
            Code::kFailedPrecondition);
  EXPECT_NE(message.find("a device-to-host copy of"), std::string::npos) << message;
  EXPECT_EQ(code_of(runtime_.synchronize(0), &message), Code::kFailedPrecondition);
  EXPECT_EQ(code_of(runtime_.capture_begin(0), &message), Code::kFailedPrecondition);
  graph = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(code_of(runtime_.capture_end(0, &graph), &message), Code::kFailedPrecondition);
  EXPECT_EQ(graph, nullptr);
  EXPECT_NE(message.find("a device-to-host copy of"), std::string::npos) << message;
  expect_ok(runtime_.synchronize(0), "synchronize after the failed capture");
  runtime_.deallocate(0, src);
  runtime_.deallocate(0, dst);
}

TEST_F(CudaRuntimeOnDeviceTest, MemoryStatsFollowAllocations) {
  DeviceProperties properties;
  expect_ok(runtime_.properties(0, &properties), "properties");
  DeviceMemoryStats s;
  expect_ok(runtime_.memory_stats(0, &s), "memory_stats");
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.total, properties.total_memory);

  void* small = nullptr;
  void* large = nullptr;
  expect_ok(runtime_.allocate(0, 1000, &small), "allocate small");
  expect_ok(runtime_.allocate(0, 40 << 20, &large), "allocate large");
  expect_ok(runtime_.memory_stats(0, &s), "memory_stats");
  EXPECT_EQ(s.allocated, 1024u + (40u << 20));
  EXPECT_EQ(s.reserved, (2u << 20) + (40u << 20));
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.num_driver_allocs, 2u);

  runtime_.deallocate(0, large);
  void* again = nullptr;
  expect_ok(runtime_.allocate(0, 40 << 20, &again), "allocate again");
  EXPECT_EQ(again, large);  // from the cache
  runtime_.deallocate(0, again);
  runtime_.deallocate(0, small);
  expect_ok(runtime_.memory_stats(0, &s), "memory_stats");
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.peak_allocated, 1024u + (40u << 20));
  EXPECT_EQ(s.num_driver_allocs, 2u);
  runtime_.reset_peak(0);
  expect_ok(runtime_.empty_cache(0), "empty_cache");
  expect_ok(runtime_.memory_stats(0, &s), "memory_stats");
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.peak_allocated, 0u);
  EXPECT_EQ(s.peak_reserved, (2u << 20) + (40u << 20));  // reset before the cache was emptied

  // A bad free is logged and changes nothing.
  int on_stack = 0;
  testing::internal::CaptureStderr();
  runtime_.deallocate(0, &on_stack);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("not a live allocation"), std::string::npos) << log;
}

TEST_F(CudaRuntimeOnDeviceTest, ExhaustionFailsCleanlyAndLeavesNoErrorBehind) {
  DeviceProperties properties;
  expect_ok(runtime_.properties(0, &properties), "properties");
  void* pointer = reinterpret_cast<void*>(0x1);
  std::string message;
  EXPECT_EQ(code_of(runtime_.allocate(0, 2 * properties.total_memory, &pointer), &message),
            Code::kResourceExhausted);
  EXPECT_EQ(pointer, nullptr);
  EXPECT_NE(message.find("cuda:0: out of memory"), std::string::npos) << message;
  EXPECT_NE(message.find("device total"), std::string::npos) << message;
  // The failed cudaMalloc must not surface later as somebody else's error.
  expect_ok(runtime_.allocate(0, 4096, &pointer), "allocate after exhaustion");
  expect_ok(runtime_.fill_zero(0, pointer, 4096), "fill_zero after exhaustion");
  expect_ok(runtime_.synchronize(0), "synchronize after exhaustion");
  DeviceMemoryStats s;
  expect_ok(runtime_.memory_stats(0, &s), "memory_stats");
  EXPECT_EQ(s.num_cache_flushes, 1u);
  runtime_.deallocate(0, pointer);
}

}  // namespace
}  // namespace loom::kernels::cuda
