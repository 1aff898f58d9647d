// The out-of-range label records of the cross-entropy kernels (label_errors.cuh).
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/cross_entropy.h>
#include <loom/ops.h>

#include <map>
#include <mutex>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/loss/label_errors.cuh"
#include "kernels/cuda/loss/loss.h"

namespace loom::kernels::cuda {
namespace loss {
namespace {

// One claim word per device: a module global has one instance in each device's context.
__device__ unsigned int g_label_error_claim = 0u;

struct DeviceSink {
  LabelErrorSink sink;
};

std::mutex& sinks_mutex() {
  static std::mutex m;
  return m;
}

std::map<int, DeviceSink>& sinks() {
  static auto* s = new std::map<int, DeviceSink>();  // leaked: see common/resources.cuh
  return *s;
}

const char* op_name(int32_t op) {
  switch (static_cast<LabelOp>(op)) {
    case LabelOp::kFwd:
      return ops::kCrossEntropyFwd;
    case LabelOp::kBwd:
      return ops::kCrossEntropyBwd;
    case LabelOp::kShardStats:
      return ops::kCrossEntropyShardStats;
    case LabelOp::kCombine:
      return ops::kCrossEntropyCombine;
    case LabelOp::kFwdBwd:
      return ops::kCrossEntropyFwdBwd;
  }
  return "cross_entropy";
}

// The message of a set record, which is cleared; "" when none. Caller holds the mutex.
std::string take_locked(int device, LabelErrorRecord* r) {
  if (__atomic_load_n(&r->set, __ATOMIC_ACQUIRE) == 0) return "";
  std::string message =
      op_checks::label_out_of_range_message(op_name(r->op), r->row, r->label, r->vocab) +
      " (found on cuda:" + std::to_string(device) +
      " by an earlier call, which wrote a NaN loss for that row and left its "
      "gradient without the label term)";
  __atomic_store_n(&r->set, 0, __ATOMIC_RELEASE);
  return message;
}

}  // namespace

LabelErrorSink label_error_sink(int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(sinks_mutex());
  auto it = sinks().find(device);
  if (it == sinks().end()) {
    DeviceSink s{};
    void* claim = nullptr;
    cuda_check(cudaGetSymbolAddress(&claim, g_label_error_claim), "cudaGetSymbolAddress");
    void* host = nullptr;
    cuda_check(
        cudaHostAlloc(&host, sizeof(LabelErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc of the label error record");
    *static_cast<LabelErrorRecord*>(host) = LabelErrorRecord{};
    void* mapped = nullptr;
    cuda_check(cudaHostGetDevicePointer(&mapped, host, 0), "cudaHostGetDevicePointer");
    s.sink.claim = static_cast<unsigned int*>(claim);
    s.sink.record = static_cast<LabelErrorRecord*>(mapped);
    // With UVA the mapped pointer is the host pointer; the host side reads it as such.
    if (mapped != host)
      throw Error(Code::kUnavailable,
                  "cross entropy: this system maps pinned host memory at a different device "
                  "address (no unified addressing); the CUDA kernels need a 64-bit UVA system");
    it = sinks().emplace(device, s).first;
  }
  std::string message = take_locked(device, it->second.sink.record);
  if (!message.empty()) {
    // Re-arm, ordered after the work already on this stream.
    cuda_check(cudaMemsetAsync(it->second.sink.claim, 0, sizeof(unsigned int), stream),
               "cudaMemsetAsync(label error claim)");
    throw Error(Code::kOutOfRange, message);
  }
  return it->second.sink;
}

std::string take_label_error_of(int device) {
  std::lock_guard<std::mutex> lock(sinks_mutex());
  auto it = sinks().find(device);
  if (it == sinks().end()) return "";
  std::string message = take_locked(device, it->second.sink.record);
  if (!message.empty()) {
    int current = 0;
    cuda_check(cudaGetDevice(&current), "cudaGetDevice");
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cudaError_t status = cudaMemsetAsync(it->second.sink.claim, 0, sizeof(unsigned int), nullptr);
    cudaSetDevice(current);
    cuda_check(status, "cudaMemsetAsync(label error claim)");
  }
  return message;
}

}  // namespace loss

std::string take_label_error() {
  std::vector<int> devices;
  {
    std::lock_guard<std::mutex> lock(loss::sinks_mutex());
    for (const auto& [device, sink] : loss::sinks()) devices.push_back(device);
  }
  for (int device : devices) {
    std::string message = loss::take_label_error_of(device);
    if (!message.empty()) return message;
  }
  return "";
}

}  // namespace loom::kernels::cuda
