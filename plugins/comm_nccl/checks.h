// The NCCL communicator's own argument checks, on top of the shared ones
// (loom/cpp/comm_checks.h): which device a tensor must be on, and NCCL's rule that
// all-to-all's tensors are disjoint. They use no CUDA, so they run (and are tested) on
// machines without a GPU. Each throws loom::Error(kInvalidArgument) with a message that starts
// with the operation's description, e.g. "all_reduce on group 'tp/0' (rank 0 of 2)", and leaves
// the communicator usable: nothing has been sent when they fail.
#pragma once

#include <loom/cpp/comm_checks.h>
#include <loom/sdk.h>
#include <stdint.h>

#include <string>

namespace loom::comm_nccl {

/// A contiguous CUDA tensor on device `device`, with data (or no elements) and a dtype
/// (check_comm_tensor). A CPU tensor is refused with the hint to move it over comm_backend
/// 'gloo'.
/// \param what    the operation's description
/// \param name    the argument's name ("tensor", "input", "output")
/// \param tensor  the view; may be null (refused)
/// \param device  the CUDA device the communicator serves
void check_cuda_tensor(const std::string& what, const char* name, const TensorView* tensor,
                       int32_t device);

/// all_to_all's arguments (check_comm_all_to_all), and input and output disjoint: NCCL reads
/// the one while writing the other.
/// \param what  the operation's description
/// \param input, send_counts, send_offsets, output, recv_counts, recv_offsets  as in
///        check_comm_all_to_all
/// \param rank  this rank in the group
/// \param size  the group size (the length of each count and offset array)
void check_all_to_all(const std::string& what, const TensorView& input, const int64_t* send_counts,
                      const int64_t* send_offsets, const TensorView& output,
                      const int64_t* recv_counts, const int64_t* recv_offsets, int32_t rank,
                      int32_t size);

}  // namespace loom::comm_nccl
