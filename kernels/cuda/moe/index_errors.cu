// The out-of-range index records of the moe kernels (index_errors.cuh).
#include <loom/cpp/error.h>
#include <loom/ops.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe/index_errors.cuh"
#include "kernels/cuda/moe/moe.h"

namespace loom::kernels::cuda {
namespace moe {
namespace {

// One claim word per device: a module global has one instance in each device's context.
__device__ unsigned int g_index_error_claim = 0u;

std::mutex& sinks_mutex() {
  static std::mutex m;
  return m;
}

std::map<int, IndexErrorSink>& sinks() {
  static auto* s = new std::map<int, IndexErrorSink>();  // leaked: see common/resources.cuh
  return *s;
}

// The CPU kernels' message for the recorded index (kernels/cpu/moe_topk.cc, moe_permute.cc).
std::string describe(const IndexErrorRecord& r) {
  const std::string value = std::to_string(r.value), index = std::to_string(r.index),
                    bound = std::to_string(r.bound);
  auto outside = [&](const char* op, const char* what, int lo) {
    return std::string(op) + ": " + what + "[" + index + "] = " + value + " is outside [" +
           std::to_string(lo) + ", " + bound + ")";
  };
  switch (static_cast<IndexOp>(r.op)) {
    case IndexOp::kTopkBwdExperts:
      return std::string(ops::kMoeTopkBwd) + ": experts[" + index + "] holds " + value +
             ", outside [0, E = " + bound + ")";
    case IndexOp::kPermuteSrc:
      return outside(ops::kMoePermute, "src", 0);
    case IndexOp::kUnpermuteSlotRows:
      return outside(ops::kMoeUnpermute, "slot_rows", -1);
    case IndexOp::kUnpermuteBwdSlotRows:
      return outside(ops::kMoeUnpermuteBwd, "slot_rows", -1);
    case IndexOp::kUnpermuteBwdRowSlots:
      return outside(ops::kMoeUnpermuteBwd, "row_slots", -1);
  }
  return "moe: index " + index + " = " + value + " is out of range";
}

// The message of a set record, which is cleared; "" when none. Caller holds the mutex.
std::string take_locked(int device, IndexErrorRecord* r) {
  if (__atomic_load_n(&r->set, __ATOMIC_ACQUIRE) == 0) return "";
  std::string message = describe(*r) + " (found on cuda:" + std::to_string(device) +
                        " by an earlier call, which treated it as a dropped choice: a zero row, "
                        "no term; the CUDA kernels check indices without waiting for the GPU)";
  __atomic_store_n(&r->set, 0, __ATOMIC_RELEASE);
  return message;
}

}  // namespace

IndexErrorSink index_error_sink(int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(sinks_mutex());
  auto it = sinks().find(device);
  if (it == sinks().end()) {
    IndexErrorSink s{};
    void* claim = nullptr;
    cuda_check(cudaGetSymbolAddress(&claim, g_index_error_claim), "cudaGetSymbolAddress");
    void* host = nullptr;
    cuda_check(
        cudaHostAlloc(&host, sizeof(IndexErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc of the moe index error record");
    *static_cast<IndexErrorRecord*>(host) = IndexErrorRecord{};
    void* mapped = nullptr;
    cuda_check(cudaHostGetDevicePointer(&mapped, host, 0), "cudaHostGetDevicePointer");
    // With UVA the mapped pointer is the host pointer; the host side reads it as such.
    if (mapped != host)
      throw Error(Code::kUnavailable,
                  "moe: this system maps pinned host memory at a different device address (no "
                  "unified addressing); the CUDA kernels need a 64-bit UVA system");
    s.claim = static_cast<unsigned int*>(claim);
    s.record = static_cast<IndexErrorRecord*>(mapped);
    it = sinks().emplace(device, s).first;
  }
  std::string message = take_locked(device, it->second.record);
  if (!message.empty()) {
    // Re-arm, ordered after the work already on this stream.
    cuda_check(cudaMemsetAsync(it->second.claim, 0, sizeof(unsigned int), stream),
               "cudaMemsetAsync(moe index error claim)");
    throw Error(Code::kOutOfRange, message);
  }
  return it->second;
}

namespace {

// The message of a recorded error of `device`, cleared, or "".
std::string take_index_error_of(int device) {
  std::lock_guard<std::mutex> lock(sinks_mutex());
  auto it = sinks().find(device);
  if (it == sinks().end()) return "";
  std::string message = take_locked(device, it->second.record);
  if (!message.empty()) {
    int current = 0;
    cuda_check(cudaGetDevice(&current), "cudaGetDevice");
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cudaError_t status = cudaMemsetAsync(it->second.claim, 0, sizeof(unsigned int), nullptr);
    cudaSetDevice(current);
    cuda_check(status, "cudaMemsetAsync(moe index error claim)");
  }
  return message;
}

}  // namespace
}  // namespace moe

std::string take_moe_index_error() {
  std::vector<int> devices;
  {
    std::lock_guard<std::mutex> lock(moe::sinks_mutex());
    for (const auto& [device, sink] : moe::sinks()) devices.push_back(device);
  }
  for (int device : devices) {
    std::string message = moe::take_index_error_of(device);
    if (!message.empty()) return message;
  }
  return "";
}

}  // namespace loom::kernels::cuda
