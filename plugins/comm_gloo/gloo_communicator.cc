#include "plugins/comm_gloo/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <loom/cpp/comm_checks.h>
#include <loom/cpp/tensor.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "plugins/comm_gloo/failure.h"
#include "plugins/comm_gloo/reduce.h"

namespace loom::comm_gloo {
namespace {

using Clock = std::chrono::steady_clock;
using Milliseconds = std::chrono::milliseconds;

// Slot prefixes of our own unbound-buffer traffic, above gloo's (0x01..0x08), so that
// send/recv tags and the ring reduce-scatter never match a gloo collective's messages.
constexpr uint8_t kPointToPointSlotPrefix = 0x40;
constexpr uint8_t kReduceScatterSlotPrefix = 0x41;

constexpr int64_t kDefaultTimeoutMs = 300000;

// Contiguous CPU view with data (or no elements); throws kInvalidArgument naming `name`.
void check_tensor(const std::string& what, const char* name, const TensorView* tensor) {
  check_comm_tensor(what, name, tensor, [&](const TensorView& t) {
    if (t.device.type != DeviceType::kCpu)
      fail(Code::kInvalidArgument, what + ": " + name + " " + shape_string(t) +
                                       " is not a CPU tensor; the gloo backend moves CPU tensors "
                                       "(CUDA tensors go over comm_nccl)");
  });
}

// Calls fn(T{}) with the unsigned type of `bytes` bytes (gloo's typed setters only use
// sizeof(T), and allreduce must segment on whole elements).
template <class Fn>
void with_element_type(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    case 8:
      return fn(uint64_t{});
    default:
      LOOM_CHECK(false, "unexpected element size ", bytes);
  }
}

char* bytes_of(const TensorView& t) { return static_cast<char*>(t.data); }

// A copy of an optional view argument, kept by a queued operation: the caller's
// TensorView struct may be gone by the time the worker runs it.
struct ViewArg {
  explicit ViewArg(const TensorView* v) : present(v != nullptr) {
    if (present) view = *v;
  }
  TensorView* get() { return present ? &view : nullptr; }
  TensorView view{};
  bool present;
};

Status null_handle(const char* op) {
  return make_status(Code::kInvalidArgument,
                     (std::string(op) + ": the handle pointer `out` is null").c_str());
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::string group_key, int32_t rank, int32_t size,
                                   std::shared_ptr<gloo::Context> context,
                                   std::vector<std::string> peer_addresses)
    : group_key_(std::move(group_key)),
      rank_(rank),
      size_(size),
      context_(std::move(context)),
      peer_addresses_(std::move(peer_addresses)),
      timeout_ms_(kDefaultTimeoutMs),
      issue_timeout_ms_(kDefaultTimeoutMs) {
  if (context_) context_->setTimeout(timeout());
  worker_ = std::thread([this] { worker_loop(); });
}

GlooCommunicator::~GlooCommunicator() {
  // Operations not yet started never will: their handles report kAborted. The running
  // one ends by itself (within its timeout) before the worker stops.
  std::deque<Task> abandoned;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
    abandoned.swap(queue_);
  }
  queue_changed_.notify_all();
  for (Task& task : abandoned) {
    try {
      task.completion->finish(make_status(
          Code::kAborted,
          (what(task.op) + ": the communicator was destroyed before the operation ran").c_str()));
    } catch (...) {
      task.completion->finish(make_status(Code::kAborted, "the communicator was destroyed"));
    }
  }
  if (worker_.joinable()) worker_.join();
  // Transfers still waiting for a peer (a caller that failed left them) end now: closing
  // the connections fails them at once instead of at their timeout. (Only then: peers that
  // are still setting up their own communicators over these connections must not see them
  // close before this process ends.)
  {
    std::lock_guard<std::mutex> lock(send_waiters_mutex_);
    bool waiting = false;
    for (const SendWaiter& w : send_waiters_) waiting = waiting || !w.finished->load();
    try {
      if (waiting && context_) context_->closeConnections();
    } catch (...) {
    }
  }
  {
    std::lock_guard<std::mutex> lock(send_waiters_mutex_);
    for (SendWaiter& w : send_waiters_)
      if (w.thread.joinable()) w.thread.join();
    send_waiters_.clear();
  }
  // Destroying the pairs closes the sockets: peers still inside an operation with this
  // rank see the connection close and fail with kAborted rather than wait.
  try {
    context_.reset();
  } catch (...) {
  }
}

void GlooCommunicator::worker_loop() noexcept {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (task.timeout_ms != timeout_ms_) {
      timeout_ms_ = task.timeout_ms;
      try {
        if (context_) context_->setTimeout(timeout());
      } catch (...) {
      }
    }
    task.completion->finish(task.body());
  }
}

template <class Body>
std::shared_ptr<WorkCompletion> GlooCommunicator::submit(const char* op, int32_t peer,
                                                         Body body) noexcept {
  try {
    auto completion = std::make_shared<WorkCompletion>();
    Task task{op,
              [this, op, peer, body = std::move(body)]() mutable { return run(op, peer, body); }, 0,
              completion};
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      task.timeout_ms = issue_timeout_ms_;
      queue_.push_back(std::move(task));
    }
    queue_changed_.notify_one();
    return completion;
  } catch (...) {
    return nullptr;
  }
}

Status GlooCommunicator::await(const std::shared_ptr<WorkCompletion>& completion) noexcept {
  if (!completion) return make_status(Code::kResourceExhausted, "out of host memory");
  return completion->wait();
}

Status GlooCommunicator::hand_out(std::shared_ptr<WorkCompletion> completion,
                                  ICommWork** out) noexcept {
  *out = nullptr;
  if (!completion) return make_status(Code::kResourceExhausted, "out of host memory");
  try {
    *out = new CompletionWork(std::move(completion));
    return ok_status();
  } catch (...) {
    // The operation is queued and will run (the other ranks expect it); nobody waits.
    return make_status(Code::kResourceExhausted, "out of host memory");
  }
}

std::string GlooCommunicator::what(const char* op) const {
  return std::string(op) + " on group '" + group_key_ + "' (rank " + std::to_string(rank_) +
         " of " + std::to_string(size_) + ")";
}

void GlooCommunicator::set_timeout_ms(int64_t timeout_ms) noexcept {
  // Taken by the operations issued from now on; the worker applies it when it starts one.
  std::lock_guard<std::mutex> lock(queue_mutex_);
  issue_timeout_ms_ = std::max<int64_t>(timeout_ms, 1);
}

Failure GlooCommunicator::transport_failed(std::exception_ptr error, const std::string& desc,
                                           int64_t timeout_ms,
                                           std::chrono::steady_clock::time_point start,
                                           int32_t peer) {
  FailureContext context;
  context.what = desc;
  context.timeout_ms = timeout_ms;
  context.elapsed_ms = std::chrono::duration_cast<Milliseconds>(Clock::now() - start).count();
  // In a group of two the only peer is the other rank, whatever gloo's message names.
  context.known_peer = peer < 0 && size_ == 2 ? 1 - rank_ : peer;
  context.peer_addresses = &peer_addresses_;
  Failure failure = classify_failure(error, context);
  record_failure(failure.message);
  // The other ranks may be waiting for this one: closing its connections makes them fail
  // now rather than at their own timeout.
  try {
    if (context_) context_->closeConnections();
  } catch (...) {
  }
  return failure;
}

template <class Body>
Status GlooCommunicator::run(const char* op, int32_t peer, Body&& body) noexcept {
  const auto start = Clock::now();
  try {
    const std::string desc = what(op);
    const std::string earlier = failure();
    if (!earlier.empty())
      return make_status(Code::kFailedPrecondition,
                         (desc + ": this communicator is unusable after an earlier failure (" +
                          earlier + "); the ranks are out of step, stop the run")
                             .c_str());
    try {
      body(desc);
      return ok_status();
    } catch (const Error& e) {
      // Our own checks, made before anything was sent: the communicator stays usable.
      return make_status(e.code(), e.what());
    } catch (...) {
      Failure failure = transport_failed(std::current_exception(), desc, timeout_ms_, start, peer);
      return make_status(failure.code, failure.message.c_str());
    }
  } catch (...) {
    return make_status(Code::kResourceExhausted, "out of host memory");
  }
}

Status GlooCommunicator::all_reduce(TensorView* tensor, ReduceOp op, void*) noexcept {
  return await(issue_all_reduce(tensor, op));
}

Status GlooCommunicator::all_reduce_async(TensorView* tensor, ReduceOp op, void*,
                                          ICommWork** out) noexcept {
  if (out == nullptr) return null_handle("all_reduce_async");
  return hand_out(issue_all_reduce(tensor, op), out);
}

std::shared_ptr<WorkCompletion> GlooCommunicator::issue_all_reduce(TensorView* tensor_arg,
                                                                   ReduceOp op) noexcept {
  return submit("all_reduce", -1,
                [this, view = ViewArg(tensor_arg), op](const std::string& desc) mutable {
                  TensorView* tensor = view.get();
                  check_tensor(desc, "tensor", tensor);
                  ReduceFn reduce = reduce_function(tensor->dtype, op, desc);
                  const size_t n = static_cast<size_t>(numel(*tensor));
                  if (size_ == 1 || n == 0)
                    return;  // one rank: the sum, max, min or mean of itself
                  gloo::AllreduceOptions opts(context_);
                  with_element_type(dtype_size(tensor->dtype), [&](auto zero) {
                    using T = decltype(zero);
                    opts.setOutput(static_cast<T*>(tensor->data), n);
                  });
                  opts.setReduceFunction(reduce);
                  opts.setTag(next_tag());
                  opts.setTimeout(timeout());
                  gloo::allreduce(opts);
                  if (op == ReduceOp::kAvg) scale(tensor->data, tensor->dtype, n, 1.0 / size_);
                });
}

Status GlooCommunicator::reduce_scatter(const TensorView* input, TensorView* output, ReduceOp op,
                                        void*) noexcept {
  return await(issue_reduce_scatter(input, output, op));
}

Status GlooCommunicator::reduce_scatter_async(const TensorView* input, TensorView* output,
                                              ReduceOp op, void*, ICommWork** out) noexcept {
  if (out == nullptr) return null_handle("reduce_scatter_async");
  return hand_out(issue_reduce_scatter(input, output, op), out);
}

std::shared_ptr<WorkCompletion> GlooCommunicator::issue_reduce_scatter(const TensorView* input_arg,
                                                                       TensorView* output_arg,
                                                                       ReduceOp op) noexcept {
  return submit(
      "reduce_scatter", -1,
      [this, in = ViewArg(input_arg), out = ViewArg(output_arg),
       op](const std::string& desc) mutable {
        const TensorView* input = in.get();
        TensorView* output = out.get();
        check_tensor(desc, "input", input);
        check_tensor(desc, "output", output);
        // No overlap is refused (comm_nccl refuses all but the in-place chunk): the ring
        // builds its sums in buffers of its own and writes the output only in its last step.
        check_comm_reduce_scatter(desc, *input, *output, rank_, size_, ChunkOverlap::kAny);
        ReduceFn reduce = reduce_function(input->dtype, op, desc);
        (void)reduce;
        if (numel(*output) == 0) return;
        if (size_ == 1) {
          std::memmove(output->data, input->data, nbytes(*output));
          return;
        }
        ring_reduce_scatter(*input, *output, op, desc);
        if (op == ReduceOp::kAvg)
          scale(output->data, output->dtype, static_cast<size_t>(numel(*output)), 1.0 / size_);
      });
}

// Ring reduce-scatter (as NCCL's): size - 1 steps; at step s rank r sends its partial sum
// of chunk (r - s - 1) to rank r + 1 and receives the partial sum of chunk (r - s - 2) from
// rank r - 1, adding its own contribution. After the last step the chunk received is r,
// complete. Each rank sends and receives (size - 1) chunks: bandwidth-optimal.
//   input  (size * n), chunk c = elements [c * n, (c + 1) * n)
//   acc    (2 * n) scratch: the partial sum being sent and the one being made
//   inbox  (n) the neighbour's partial sum
void GlooCommunicator::ring_reduce_scatter(const TensorView& input, TensorView& output, ReduceOp op,
                                           const std::string& desc) {
  const ReduceFn reduce = reduce_function(input.dtype, op, desc);
  const size_t elements = static_cast<size_t>(numel(output));
  const size_t chunk = nbytes(output);
  const auto deadline = Clock::now() + timeout();
  auto left_ms = [&] {
    return std::max(std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()),
                    Milliseconds(1));
  };
  std::vector<char> acc(2 * chunk), inbox(chunk);
  // gloo sends from unbound buffers only; the input is only read from.
  auto in_buf = context_->createUnboundBuffer(input.data, nbytes(input));
  auto acc_buf = context_->createUnboundBuffer(acc.data(), acc.size());
  auto inbox_buf = context_->createUnboundBuffer(inbox.data(), inbox.size());
  const int right = (rank_ + 1) % size_;
  const int left = (rank_ + size_ - 1) % size_;
  for (int step = 0; step < size_ - 1; ++step) {
    const int send_chunk = (rank_ - step - 1 + 2 * size_) % size_;
    const int recv_chunk = (rank_ - step - 2 + 2 * size_) % size_;
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
    gloo::transport::UnboundBuffer* from = step == 0 ? in_buf.get() : acc_buf.get();
    const size_t from_offset = step == 0 ? send_chunk * chunk : (step % 2) * chunk;
    from->send(right, slot, from_offset, chunk);
    inbox_buf->recv(left, slot, 0, chunk);
    inbox_buf->waitRecv(left_ms());
    void* target = step == size_ - 2 ? output.data : acc.data() + ((step + 1) % 2) * chunk;
    reduce(target, inbox.data(), bytes_of(input) + recv_chunk * chunk, elements);
    from->waitSend(left_ms());
  }
}

Status GlooCommunicator::all_gather(const TensorView* input, TensorView* output, void*) noexcept {
  return await(issue_all_gather(input, output));
}

Status GlooCommunicator::all_gather_async(const TensorView* input, TensorView* output, void*,
                                          ICommWork** out) noexcept {
  if (out == nullptr) return null_handle("all_gather_async");
  return hand_out(issue_all_gather(input, output), out);
}

std::shared_ptr<WorkCompletion> GlooCommunicator::issue_all_gather(
    const TensorView* input_arg, TensorView* output_arg) noexcept {
  return submit(
      "all_gather", -1,
      [this, in = ViewArg(input_arg), out = ViewArg(output_arg)](const std::string& desc) mutable {
        const TensorView* input = in.get();
        TensorView* output = out.get();
        check_tensor(desc, "input", input);
        check_tensor(desc, "output", output);
        // No overlap is refused: the input is moved (memmove) into this rank's chunk before
        // gloo gathers in place.
        check_comm_all_gather(desc, *input, *output, rank_, size_, ChunkOverlap::kAny);
        const size_t chunk = nbytes(*input);
        if (chunk == 0) return;
        // In place from here on: own chunk first (memmove: the input may be that very chunk,
        // as in ZeRO's gather of the updated shard).
        std::memmove(bytes_of(*output) + rank_ * chunk, input->data, chunk);
        if (size_ == 1) return;
        gloo::AllgatherOptions opts(context_);
        opts.setOutput(static_cast<uint8_t*>(output->data), nbytes(*output));
        opts.setTag(next_tag());
        opts.setTimeout(timeout());
        gloo::allgather(opts);
      });
}

Status GlooCommunicator::broadcast(TensorView* tensor, int32_t root, void*) noexcept {
  return await(issue_broadcast(tensor, root));
}

Status GlooCommunicator::broadcast_async(TensorView* tensor, int32_t root, void*,
                                         ICommWork** out) noexcept {
  if (out == nullptr) return null_handle("broadcast_async");
  return hand_out(issue_broadcast(tensor, root), out);
}

std::shared_ptr<WorkCompletion> GlooCommunicator::issue_broadcast(TensorView* tensor_arg,
                                                                  int32_t root) noexcept {
  return submit("broadcast", root,
                [this, view = ViewArg(tensor_arg), root](const std::string& desc) mutable {
                  TensorView* tensor = view.get();
                  check_tensor(desc, "tensor", tensor);
                  check_comm_root(desc, root, size_);
                  if (size_ == 1 || nbytes(*tensor) == 0) return;
                  gloo::BroadcastOptions opts(context_);
                  opts.setOutput(static_cast<uint8_t*>(tensor->data), nbytes(*tensor));
                  opts.setRoot(root);
                  opts.setTag(next_tag());
                  opts.setTimeout(timeout());
                  gloo::broadcast(opts);
                });
}

Status GlooCommunicator::all_to_all(const TensorView* input, const int64_t* send_counts,
                                    const int64_t* send_offsets, TensorView* output,
                                    const int64_t* recv_counts, const int64_t* recv_offsets,
                                    void*) noexcept {
  // Synchronous only: waiting here keeps the caller's count arrays alive for the worker.
  return await(submit("all_to_all", -1, [&](const std::string& desc) {
    check_tensor(desc, "input", input);
    check_tensor(desc, "output", output);
    // Unlike comm_nccl's, gloo's all_to_all does not refuse overlapping input and output.
    check_comm_all_to_all(desc, *input, send_counts, send_offsets, *output, recv_counts,
                          recv_offsets, rank_, size_);
    const size_t elem = dtype_size(input->dtype);
    int64_t send_total = 0, recv_total = 0;
    for (int32_t p = 0; p < size_; ++p) {
      send_total += send_counts[p];
      recv_total += recv_counts[p];
    }
    if (size_ == 1) {
      std::memmove(bytes_of(*output) + recv_offsets[0] * elem,
                   bytes_of(*input) + send_offsets[0] * elem, send_counts[0] * elem);
      return;
    }
    // gloo's alltoallv takes slices packed in rank order from the buffer's start; other
    // layouts go through a packed copy.
    auto packed = [&](const int64_t* counts, const int64_t* offsets) {
      int64_t at = 0;
      for (int32_t p = 0; p < size_; ++p) {
        if (offsets[p] != at) return false;
        at += counts[p];
      }
      return true;
    };
    const bool send_packed = packed(send_counts, send_offsets);
    const bool recv_packed = packed(recv_counts, recv_offsets);
    std::vector<char> send_copy, recv_copy;
    char* send_data = bytes_of(*input);
    char* recv_data = bytes_of(*output);
    if (!send_packed) {
      send_copy.resize(static_cast<size_t>(send_total) * elem);
      size_t at = 0;
      for (int32_t p = 0; p < size_; ++p) {
        std::memcpy(send_copy.data() + at, send_data + send_offsets[p] * elem,
                    send_counts[p] * elem);
        at += send_counts[p] * elem;
      }
      send_data = send_copy.data();
    }
    if (!recv_packed) {
      recv_copy.resize(static_cast<size_t>(recv_total) * elem);
      recv_data = recv_copy.data();
    }
    std::vector<int64_t> send_bytes(size_), recv_bytes(size_);
    for (int32_t p = 0; p < size_; ++p) {
      send_bytes[p] = send_counts[p] * static_cast<int64_t>(elem);
      recv_bytes[p] = recv_counts[p] * static_cast<int64_t>(elem);
    }
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(reinterpret_cast<uint8_t*>(send_data), send_bytes);
    opts.setOutput(reinterpret_cast<uint8_t*>(recv_data), recv_bytes);
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    gloo::alltoallv(opts);
    if (!recv_packed) {
      size_t at = 0;
      for (int32_t p = 0; p < size_; ++p) {
        std::memcpy(bytes_of(*output) + recv_offsets[p] * elem, recv_copy.data() + at,
                    recv_counts[p] * elem);
        at += recv_counts[p] * elem;
      }
    }
  }));
}

std::string GlooCommunicator::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

void GlooCommunicator::record_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (failure_.empty()) failure_ = message;
}

namespace {

// The handle of a send or a receive: done once the worker posted it and the data left (or
// arrived).
class TransferWork final : public Object<ICommWork> {
 public:
  TransferWork(std::shared_ptr<WorkCompletion> posted, std::shared_ptr<WorkCompletion> sent)
      : posted_(std::move(posted)), sent_(std::move(sent)) {}
  ~TransferWork() override {
    Status s = wait();
    status_release(&s);
  }
  Status wait() noexcept override {
    Status s = posted_->wait();
    if (s.code != Code::kOk) return s;  // never posted: `sent` never finishes
    return sent_->wait();
  }
  bool done() noexcept override {
    if (!posted_->done()) return false;
    Status s = posted_->wait();
    const bool failed = s.code != Code::kOk;
    status_release(&s);
    return failed || sent_->done();
  }

 private:
  std::shared_ptr<WorkCompletion> posted_, sent_;
};

}  // namespace

void GlooCommunicator::wait_for_transfer(std::shared_ptr<gloo::transport::UnboundBuffer> buffer,
                                         bool is_send, std::shared_ptr<WorkCompletion> sent,
                                         std::string desc, int32_t peer) {
  auto finished = std::make_shared<std::atomic<bool>>(false);
  const int64_t timeout_ms = timeout_ms_;
  std::thread thread([this, buffer, is_send, sent, desc, peer, finished, timeout_ms] {
    const auto start = Clock::now();
    try {
      if (is_send)
        buffer->waitSend(Milliseconds(timeout_ms));
      else
        buffer->waitRecv(Milliseconds(timeout_ms));
      sent->finish(ok_status());
    } catch (...) {
      try {
        Failure failure =
            transport_failed(std::current_exception(), desc, timeout_ms, start, peer);
        sent->finish(make_status(failure.code, failure.message.c_str()));
      } catch (...) {
        sent->finish(make_status(Code::kAborted, "transfer failed (out of memory describing why)"));
      }
    }
    finished->store(true);
  });
  std::lock_guard<std::mutex> lock(send_waiters_mutex_);
  // Join the waiters that are done, so the list stays as long as the sends in flight.
  std::vector<SendWaiter> running;
  for (SendWaiter& w : send_waiters_) {
    if (w.finished->load()) {
      w.thread.join();
    } else {
      running.push_back(std::move(w));
    }
  }
  running.push_back({std::move(thread), finished});
  send_waiters_.swap(running);
}

CommWorkPtr GlooCommunicator::issue_transfer(const TensorView* tensor_arg, int32_t peer,
                                             int32_t tag, bool is_send) noexcept {
  try {
    auto done = std::make_shared<WorkCompletion>();
    auto posted = submit(
        is_send ? "send" : "recv", peer,
        [this, view = ViewArg(tensor_arg), peer, tag, is_send, done](const std::string& desc) mutable {
          TensorView* tensor = view.get();
          check_tensor(desc, "tensor", tensor);
          check_comm_peer(desc, peer, rank_, size_);
          const size_t bytes = nbytes(*tensor);
          if (bytes == 0) {  // both sides skip: the sizes must match anyway
            done->finish(ok_status());
            return;
          }
          const uint64_t slot =
              gloo::Slot::build(kPointToPointSlotPrefix, static_cast<uint32_t>(tag));
          // A send only reads: gloo's buffers take non-const pointers.
          std::shared_ptr<gloo::transport::UnboundBuffer> buffer =
              context_->createUnboundBuffer(tensor->data, bytes);
          if (is_send)
            buffer->send(peer, slot);
          else
            buffer->recv(peer, slot);
          wait_for_transfer(std::move(buffer), is_send, done, desc, peer);
        });
    if (!posted) return nullptr;
    return CommWorkPtr(new TransferWork(std::move(posted), std::move(done)));
  } catch (...) {
    return nullptr;
  }
}

Status GlooCommunicator::send(const TensorView* tensor, int32_t peer, int32_t tag, void*) noexcept {
  CommWorkPtr work = issue_transfer(tensor, peer, tag, true);
  if (!work) return make_status(Code::kResourceExhausted, "out of host memory");
  return work->wait();
}

Status GlooCommunicator::recv(TensorView* tensor, int32_t peer, int32_t tag, void*) noexcept {
  CommWorkPtr work = issue_transfer(tensor, peer, tag, false);
  if (!work) return make_status(Code::kResourceExhausted, "out of host memory");
  return work->wait();
}

Status GlooCommunicator::send_async(const TensorView* tensor, int32_t peer, int32_t tag, void*,
                                    ICommWork** out) noexcept {
  if (out == nullptr) return null_handle("send_async");
  *out = nullptr;
  CommWorkPtr work = issue_transfer(tensor, peer, tag, true);
  if (!work) return make_status(Code::kResourceExhausted, "out of host memory");
  *out = work.release();
  return ok_status();
}

Status GlooCommunicator::recv_async(TensorView* tensor, int32_t peer, int32_t tag, void*,
                                    ICommWork** out) noexcept {
  if (out == nullptr) return null_handle("recv_async");
  *out = nullptr;
  CommWorkPtr work = issue_transfer(tensor, peer, tag, false);
  if (!work) return make_status(Code::kResourceExhausted, "out of host memory");
  *out = work.release();
  return ok_status();
}

Status GlooCommunicator::barrier() noexcept {
  return await(submit("barrier", -1, [this](const std::string&) {
    if (size_ == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    gloo::barrier(opts);
  }));
}

}  // namespace loom::comm_gloo
