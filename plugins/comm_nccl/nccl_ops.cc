// The operations of NcclCommunicator: their argument checks, then the NCCL calls each one
// queues on the communicator's stream (NcclCommunicator::issue does the rest):
//   all_reduce      ncclAllReduce in place (avg is ncclAvg)
//   reduce_scatter  ncclReduceScatter (in place when output is input's chunk `rank`)
//   all_gather      ncclAllGather of bytes (in place when input is output's chunk `rank`)
//   broadcast       ncclBroadcast in place, of bytes
//   all_to_all      ncclSend/ncclRecv per peer in one group; this rank's own slice by a
//                   device-to-device copy on the same stream
//   send / recv     ncclSend / ncclRecv of bytes
//   barrier         ncclAllReduce of one i32, waited for on the host
// Moves that do not reduce go as bytes (ncclUint8), so every dtype, fp8 and bool included,
// can be gathered, broadcast and exchanged.
#include <loom/cpp/tensor.h>

#include <cstdio>
#include <vector>

#include "plugins/comm_nccl/checks.h"
#include "plugins/comm_nccl/cuda_progress.h"
#include "plugins/comm_nccl/nccl_communicator.h"
#include "plugins/comm_nccl/nccl_types.h"
#include "plugins/comm_nccl/nccl_work.h"

namespace loom::comm_nccl {
namespace {

char* bytes_at(void* data, int64_t elements, size_t element_size) {
  return static_cast<char*>(data) + static_cast<size_t>(elements) * element_size;
}

}  // namespace

template <class Body>
Status NcclCommunicator::run_sync(Body&& body, bool blocking) noexcept {
  try {
    std::shared_ptr<OpRecord> record = body();
    if (!record) return ok_status();
    Status status = await_op(*record, blocking);
    if (status.code != Code::kOk) tracker_.mark_reported();  // this caller has been told
    return status;
  } catch (const Error& e) {
    return make_status(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_status(Code::kResourceExhausted, "out of host memory");
  } catch (const std::exception& e) {
    return make_status(Code::kInternal, e.what());
  }
}

template <class Body>
Status NcclCommunicator::run_async(const char* op, ICommWork** out, Body&& body) noexcept {
  if (out == nullptr) {
    static constexpr char kSuffix[] = "_async: the handle pointer `out` is null";
    char message[96] = {};
    std::snprintf(message, sizeof(message), "%s%s", op, kSuffix);
    return make_status(Code::kInvalidArgument, message);
  }
  *out = nullptr;
  std::shared_ptr<OpRecord> record;
  Status status = ok_status();
  try {
    record = body();
  } catch (const Error& e) {
    status = make_status(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_status(Code::kResourceExhausted, "out of host memory");
  } catch (const std::exception& e) {
    status = make_status(Code::kInternal, e.what());
  }
  // Bad arguments, a refusal or nothing to move: a finished handle (its wait() gives them).
  if (!record) return completed_work(status, out);
  try {
    *out = new NcclWork(record, config_.blocking_wait);
    return ok_status();
  } catch (...) {
    // Queued, and the other ranks count on it, but nobody can wait for it: order the caller's
    // stream after it now, so its memory is not reused under it.
    Status ordered = await_op(*record, false);
    status_release(&ordered);
    return make_status(Code::kResourceExhausted, "out of host memory");
  }
}

std::shared_ptr<OpRecord> NcclCommunicator::nothing_to_move(const std::string& what) {
  if (std::optional<Failure> refused = tracker_.refusal(what))
    throw Error(refused->code, refused->message);
  return nullptr;
}

// ---- all_reduce ---------------------------------------------------------------------------

std::shared_ptr<OpRecord> NcclCommunicator::do_all_reduce(const TensorView* tensor, ReduceOp op,
                                                          void* stream) {
  const std::string desc = what("all_reduce");
  check_cuda_tensor(desc, "tensor", tensor, config_.device);
  check_comm_reduction(desc, tensor->dtype, op, "nccl");
  const auto count = static_cast<size_t>(numel(*tensor));
  if (count == 0) return nothing_to_move(desc);
  void* data = tensor->data;
  const ncclDataType_t type = nccl_type(tensor->dtype);
  const ncclRedOp_t reduction = nccl_op(op);
  return issue(desc, stream, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(data, data, count, type, reduction, comm, s);
  });
}

Status NcclCommunicator::all_reduce(TensorView* tensor, ReduceOp op, void* stream) noexcept {
  return run_sync([&] { return do_all_reduce(tensor, op, stream); }, config_.blocking_wait);
}

Status NcclCommunicator::all_reduce_async(TensorView* tensor, ReduceOp op, void* stream,
                                          ICommWork** out) noexcept {
  return run_async("all_reduce", out, [&] { return do_all_reduce(tensor, op, stream); });
}

// ---- reduce_scatter -----------------------------------------------------------------------

std::shared_ptr<OpRecord> NcclCommunicator::do_reduce_scatter(const TensorView* input,
                                                              const TensorView* output, ReduceOp op,
                                                              void* stream) {
  const std::string desc = what("reduce_scatter");
  check_cuda_tensor(desc, "input", input, config_.device);
  check_cuda_tensor(desc, "output", output, config_.device);
  check_comm_reduce_scatter(desc, *input, *output, config_.rank, config_.size,
                            ChunkOverlap::kOwnChunk);
  check_comm_reduction(desc, input->dtype, op, "nccl");
  const auto count = static_cast<size_t>(numel(*output));
  if (count == 0) return nothing_to_move(desc);
  const void* in = input->data;
  void* out = output->data;
  const ncclDataType_t type = nccl_type(input->dtype);
  const ncclRedOp_t reduction = nccl_op(op);
  return issue(desc, stream, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclReduceScatter(in, out, count, type, reduction, comm, s);
  });
}

Status NcclCommunicator::reduce_scatter(const TensorView* input, TensorView* output, ReduceOp op,
                                        void* stream) noexcept {
  return run_sync([&] { return do_reduce_scatter(input, output, op, stream); },
                  config_.blocking_wait);
}

Status NcclCommunicator::reduce_scatter_async(const TensorView* input, TensorView* output,
                                              ReduceOp op, void* stream, ICommWork** out) noexcept {
  return run_async("reduce_scatter", out,
                   [&] { return do_reduce_scatter(input, output, op, stream); });
}

// ---- all_gather ---------------------------------------------------------------------------

std::shared_ptr<OpRecord> NcclCommunicator::do_all_gather(const TensorView* input,
                                                          const TensorView* output, void* stream) {
  const std::string desc = what("all_gather");
  check_cuda_tensor(desc, "input", input, config_.device);
  check_cuda_tensor(desc, "output", output, config_.device);
  check_comm_all_gather(desc, *input, *output, config_.rank, config_.size, ChunkOverlap::kOwnChunk);
  const size_t bytes = nbytes(*input);
  if (bytes == 0) return nothing_to_move(desc);
  const void* in = input->data;
  void* out = output->data;
  return issue(desc, stream, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclAllGather(in, out, bytes, ncclUint8, comm, s);
  });
}

Status NcclCommunicator::all_gather(const TensorView* input, TensorView* output,
                                    void* stream) noexcept {
  return run_sync([&] { return do_all_gather(input, output, stream); }, config_.blocking_wait);
}

Status NcclCommunicator::all_gather_async(const TensorView* input, TensorView* output, void* stream,
                                          ICommWork** out) noexcept {
  return run_async("all_gather", out, [&] { return do_all_gather(input, output, stream); });
}

// ---- broadcast ----------------------------------------------------------------------------

std::shared_ptr<OpRecord> NcclCommunicator::do_broadcast(const TensorView* tensor, int32_t root,
                                                         void* stream) {
  const std::string desc = what("broadcast");
  check_cuda_tensor(desc, "tensor", tensor, config_.device);
  check_comm_root(desc, root, config_.size);
  const size_t bytes = nbytes(*tensor);
  if (bytes == 0) return nothing_to_move(desc);
  void* data = tensor->data;
  return issue(desc, stream, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclBroadcast(data, data, bytes, ncclUint8, root, comm, s);
  });
}

Status NcclCommunicator::broadcast(TensorView* tensor, int32_t root, void* stream) noexcept {
  return run_sync([&] { return do_broadcast(tensor, root, stream); }, config_.blocking_wait);
}

Status NcclCommunicator::broadcast_async(TensorView* tensor, int32_t root, void* stream,
                                         ICommWork** out) noexcept {
  return run_async("broadcast", out, [&] { return do_broadcast(tensor, root, stream); });
}

// ---- all_to_all ---------------------------------------------------------------------------

Status NcclCommunicator::all_to_all(const TensorView* input, const int64_t* send_counts,
                                    const int64_t* send_offsets, TensorView* output,
                                    const int64_t* recv_counts, const int64_t* recv_offsets,
                                    void* stream) noexcept {
  return run_sync(
      [&]() -> std::shared_ptr<OpRecord> {
        const std::string desc = what("all_to_all");
        check_cuda_tensor(desc, "input", input, config_.device);
        check_cuda_tensor(desc, "output", output, config_.device);
        check_all_to_all(desc, *input, send_counts, send_offsets, *output, recv_counts,
                         recv_offsets, config_.rank, config_.size);
        const int32_t rank = config_.rank, size = config_.size;
        const size_t element = dtype_size(input->dtype);
        // (size,) each, copied: the enqueue below reads them after the checks.
        const std::vector<int64_t> sc(send_counts, send_counts + size),
            so(send_offsets, send_offsets + size), rc(recv_counts, recv_counts + size),
            ro(recv_offsets, recv_offsets + size);
        bool moves = false;
        for (int32_t p = 0; p < size; ++p) moves = moves || sc[p] > 0 || rc[p] > 0;
        if (!moves) return nothing_to_move(desc);
        void* in = input->data;
        void* out = output->data;
        return issue(desc, stream, [&](ncclComm_t comm, cudaStream_t s) -> ncclResult_t {
          if (sc[rank] > 0)
            cuda_check(cudaMemcpyAsync(
                           bytes_at(out, ro[rank], element), bytes_at(in, so[rank], element),
                           static_cast<size_t>(sc[rank]) * element, cudaMemcpyDeviceToDevice, s),
                       desc, "cudaMemcpyAsync");
          if (size == 1) return ncclSuccess;
          ncclResult_t first = ncclGroupStart();
          if (first != ncclSuccess) return first;
          // Both directions with every peer in one group, so that no pair waits for another:
          // zero counts are skipped on both sides (the peer's count is this rank's).
          for (int32_t p = 0; p < size && first == ncclSuccess; ++p) {
            if (p == rank) continue;
            if (sc[p] > 0)
              first = ncclSend(bytes_at(in, so[p], element), static_cast<size_t>(sc[p]) * element,
                               ncclUint8, p, comm, s);
            if (first == ncclSuccess && rc[p] > 0)
              first = ncclRecv(bytes_at(out, ro[p], element), static_cast<size_t>(rc[p]) * element,
                               ncclUint8, p, comm, s);
          }
          const ncclResult_t ended = ncclGroupEnd();
          return first != ncclSuccess ? first : ended;
        });
      },
      config_.blocking_wait);
}

// ---- send / recv --------------------------------------------------------------------------

std::shared_ptr<OpRecord> NcclCommunicator::do_point_to_point(const TensorView* tensor,
                                                              int32_t peer, bool is_send,
                                                              void* stream) {
  const std::string desc = what(is_send ? "send" : "recv");
  check_cuda_tensor(desc, "tensor", tensor, config_.device);
  check_comm_peer(desc, peer, config_.rank, config_.size);
  const size_t bytes = nbytes(*tensor);
  if (bytes == 0) return nothing_to_move(desc);  // both sides skip: the sizes must match
  void* data = tensor->data;
  return issue(desc, stream, [=](ncclComm_t comm, cudaStream_t s) {
    return is_send ? ncclSend(data, bytes, ncclUint8, peer, comm, s)
                   : ncclRecv(data, bytes, ncclUint8, peer, comm, s);
  });
}

Status NcclCommunicator::send(const TensorView* tensor, int32_t peer, int32_t,
                              void* stream) noexcept {
  return run_sync([&] { return do_point_to_point(tensor, peer, true, stream); },
                  config_.blocking_wait);
}

Status NcclCommunicator::recv(TensorView* tensor, int32_t peer, int32_t, void* stream) noexcept {
  return run_sync([&] { return do_point_to_point(tensor, peer, false, stream); },
                  config_.blocking_wait);
}

Status NcclCommunicator::send_async(const TensorView* tensor, int32_t peer, int32_t, void* stream,
                                    ICommWork** out) noexcept {
  return run_async("send", out, [&] { return do_point_to_point(tensor, peer, true, stream); });
}

Status NcclCommunicator::recv_async(TensorView* tensor, int32_t peer, int32_t, void* stream,
                                    ICommWork** out) noexcept {
  return run_async("recv", out, [&] { return do_point_to_point(tensor, peer, false, stream); });
}

// ---- barrier ------------------------------------------------------------------------------

Status NcclCommunicator::barrier() noexcept {
  return run_sync(
      [&] {
        void* buffer = barrier_buffer_;
        return issue(what("barrier"), nullptr, [buffer](ncclComm_t comm, cudaStream_t s) {
          return ncclAllReduce(buffer, buffer, 1, ncclInt32, ncclSum, comm, s);
        });
      },
      /*blocking=*/true);
}

}  // namespace loom::comm_nccl
