#include "core/parallel/local_communicator.h"

#include <fmt/format.h>

#include <cstring>

#include "loom/cpp/comm_work.h"
#include "loom/cpp/error.h"
#include "loom/cpp/tensor.h"

namespace loom::core {

Status LocalCommunicator::copy(const char* op, const TensorView& from, TensorView& to) noexcept {
  return guard([&] {
    if (numel(from) != numel(to) || from.dtype != to.dtype)
      fail(Code::kInvalidArgument,
           fmt::format("{} on group '{}' (1 rank): input {} {} and output {} {} must hold the "
                       "same elements",
                       op, key_, dtype_name(from.dtype), shape_string(from), dtype_name(to.dtype),
                       shape_string(to)));
    if (from.data != to.data) std::memmove(to.data, from.data, nbytes(from));
  });
}

Status LocalCommunicator::all_reduce(TensorView*, ReduceOp, void*) noexcept { return ok_status(); }

Status LocalCommunicator::reduce_scatter(const TensorView* input, TensorView* output, ReduceOp,
                                         void*) noexcept {
  return copy("reduce_scatter", *input, *output);
}

Status LocalCommunicator::all_gather(const TensorView* input, TensorView* output, void*) noexcept {
  return copy("all_gather", *input, *output);
}

Status LocalCommunicator::broadcast(TensorView*, int32_t root, void*) noexcept {
  return guard([&] {
    if (root != 0)
      fail(Code::kInvalidArgument,
           fmt::format("broadcast on group '{}': root {} is not a rank of this 1-rank group", key_,
                       root));
  });
}

Status LocalCommunicator::all_to_all(const TensorView* input, const int64_t* send_counts,
                                     const int64_t* send_offsets, TensorView* output,
                                     const int64_t* recv_counts, const int64_t* recv_offsets,
                                     void*) noexcept {
  return guard([&] {
    if (send_counts[0] != recv_counts[0] || input->dtype != output->dtype ||
        send_offsets[0] + send_counts[0] > numel(*input) ||
        recv_offsets[0] + recv_counts[0] > numel(*output))
      fail(Code::kInvalidArgument,
           fmt::format("all_to_all on group '{}' (1 rank): counts or offsets do not fit the "
                       "tensors",
                       key_));
    size_t e = dtype_size(input->dtype);
    std::memmove(static_cast<char*>(output->data) + recv_offsets[0] * e,
                 static_cast<const char*>(input->data) + send_offsets[0] * e, send_counts[0] * e);
  });
}

Status LocalCommunicator::send(const TensorView*, int32_t peer, int32_t, void*) noexcept {
  return guard([&] {
    fail(
        Code::kInvalidArgument,
        fmt::format("send on group '{}': peer {} does not exist in this 1-rank group", key_, peer));
  });
}

Status LocalCommunicator::recv(TensorView*, int32_t peer, int32_t, void*) noexcept {
  return guard([&] {
    fail(
        Code::kInvalidArgument,
        fmt::format("recv on group '{}': peer {} does not exist in this 1-rank group", key_, peer));
  });
}

Status LocalCommunicator::barrier() noexcept { return ok_status(); }

// One rank has nobody to wait for: each asynchronous call is its synchronous namesake,
// done before it returns, with its status in a finished handle.

Status LocalCommunicator::all_reduce_async(TensorView* tensor, ReduceOp op, void* stream,
                                           ICommWork** out) noexcept {
  return completed_work(all_reduce(tensor, op, stream), out);
}

Status LocalCommunicator::reduce_scatter_async(const TensorView* input, TensorView* output,
                                               ReduceOp op, void* stream,
                                               ICommWork** out) noexcept {
  return completed_work(reduce_scatter(input, output, op, stream), out);
}

Status LocalCommunicator::all_gather_async(const TensorView* input, TensorView* output,
                                           void* stream, ICommWork** out) noexcept {
  return completed_work(all_gather(input, output, stream), out);
}

Status LocalCommunicator::broadcast_async(TensorView* tensor, int32_t root, void* stream,
                                          ICommWork** out) noexcept {
  return completed_work(broadcast(tensor, root, stream), out);
}

Status LocalCommunicator::send_async(const TensorView* tensor, int32_t peer, int32_t tag,
                                     void* stream, ICommWork** out) noexcept {
  return completed_work(send(tensor, peer, tag, stream), out);
}

Status LocalCommunicator::recv_async(TensorView* tensor, int32_t peer, int32_t tag, void* stream,
                                     ICommWork** out) noexcept {
  return completed_work(recv(tensor, peer, tag, stream), out);
}

}  // namespace loom::core
