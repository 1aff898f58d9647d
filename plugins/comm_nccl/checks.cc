#include "plugins/comm_nccl/checks.h"

#include <loom/cpp/tensor.h>

#include <cstdint>
#include <string>

namespace loom::comm_nccl {
namespace {

std::string cuda_name(int32_t index) { return "cuda:" + std::to_string(index); }

}  // namespace

void check_cuda_tensor(const std::string& what, const char* name, const TensorView* tensor,
                       int32_t device) {
  check_comm_tensor(what, name, tensor, [&](const TensorView& t) {
    if (t.device.type == DeviceType::kCpu)
      fail(Code::kInvalidArgument,
           what + ": " + name + " " + shape_string(t) +
               " is a CPU tensor; comm_backend 'nccl' moves CUDA tensors only: use comm_backend "
               "'gloo' for CPU tensors");
    if (t.device.type != DeviceType::kCuda)
      fail(Code::kInvalidArgument, what + ": " + name + " " + shape_string(t) +
                                       " is on an unknown device type (" +
                                       std::to_string(static_cast<int32_t>(t.device.type)) +
                                       "); comm_backend 'nccl' moves CUDA tensors");
    if (t.device.index != device)
      fail(Code::kInvalidArgument,
           what + ": " + name + " " + shape_string(t) + " is on " + cuda_name(t.device.index) +
               " but this communicator serves " + cuda_name(device) +
               " (the current device of the thread that created it); pass tensors of that "
               "device");
  });
}

void check_all_to_all(const std::string& what, const TensorView& input, const int64_t* send_counts,
                      const int64_t* send_offsets, const TensorView& output,
                      const int64_t* recv_counts, const int64_t* recv_offsets, int32_t rank,
                      int32_t size) {
  check_comm_all_to_all(what, input, send_counts, send_offsets, output, recv_counts, recv_offsets,
                        rank, size);
  if (bytes_overlap(input.data, nbytes(input), output.data, nbytes(output)))
    fail(Code::kInvalidArgument, what + ": input " + shape_string(input) + " and output " +
                                     shape_string(output) +
                                     " overlap; NCCL's all-to-all needs disjoint tensors");
}

}  // namespace loom::comm_nccl
