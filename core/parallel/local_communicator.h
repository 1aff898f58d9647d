// LocalCommunicator: the communicator of a size-1 group. A single-process run has only
// such groups (IHost::communicator), and a module written for tensor parallelism runs
// unchanged on one rank: reductions leave data as it is, gathers and scatters copy. The
// asynchronous forms do the same at once and return a finished handle.
#pragma once

#include <string>

#include "loom/cpp/object.h"
#include "loom/kinds/comm_backend.h"

namespace loom::core {

class LocalCommunicator final : public Object<ICommunicator> {
 public:
  /// \param group_key  the group's name, for messages
  explicit LocalCommunicator(std::string group_key) : key_(std::move(group_key)) {}

  int32_t rank() const noexcept override { return 0; }
  int32_t size() const noexcept override { return 1; }
  Status all_reduce(TensorView* tensor, ReduceOp op, void* stream) noexcept override;
  Status reduce_scatter(const TensorView* input, TensorView* output, ReduceOp op,
                        void* stream) noexcept override;
  Status all_gather(const TensorView* input, TensorView* output, void* stream) noexcept override;
  Status broadcast(TensorView* tensor, int32_t root, void* stream) noexcept override;
  Status all_to_all(const TensorView* input, const int64_t* send_counts,
                    const int64_t* send_offsets, TensorView* output, const int64_t* recv_counts,
                    const int64_t* recv_offsets, void* stream) noexcept override;
  Status send(const TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept override;
  Status recv(TensorView* tensor, int32_t peer, int32_t tag, void* stream) noexcept override;
  Status barrier() noexcept override;
  void set_timeout_ms(int64_t) noexcept override {}

  Status all_reduce_async(TensorView* tensor, ReduceOp op, void* stream,
                          ICommWork** out) noexcept override;
  Status reduce_scatter_async(const TensorView* input, TensorView* output, ReduceOp op,
                              void* stream, ICommWork** out) noexcept override;
  Status all_gather_async(const TensorView* input, TensorView* output, void* stream,
                          ICommWork** out) noexcept override;
  Status broadcast_async(TensorView* tensor, int32_t root, void* stream,
                         ICommWork** out) noexcept override;
  Status send_async(const TensorView* tensor, int32_t peer, int32_t tag, void* stream,
                    ICommWork** out) noexcept override;
  Status recv_async(TensorView* tensor, int32_t peer, int32_t tag, void* stream,
                    ICommWork** out) noexcept override;

 private:
  Status copy(const char* op, const TensorView& from, TensorView& to) noexcept;
  std::string key_;
};

}  // namespace loom::core
