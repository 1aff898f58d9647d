// NcclCommunicator's life: its stream, the shared issue path, the watchdog, teardown. The
// operations themselves are in nccl_ops.cc.
#include "plugins/comm_nccl/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "plugins/comm_nccl/cuda_progress.h"
#include "plugins/comm_nccl/nccl_types.h"

namespace loom::comm_nccl {
namespace {

constexpr int64_t kDefaultTimeoutMs = 300000;

using Milliseconds = std::chrono::milliseconds;

}  // namespace

NcclCommunicator::NcclCommunicator(Config config, ncclComm_t comm)
    : config_(std::move(config)), timeout_ms_(kDefaultTimeoutMs), comm_(comm) {
  const std::string where = what("create_communicator");
  try {
    DeviceGuard device(config_.device, where);
    // The highest priority: a collective that others wait for should not queue behind
    // compute kernels for SM slots.
    int least = 0, greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), where,
               "cudaDeviceGetStreamPriorityRange");
    // Non-blocking: the legacy default stream (a compute stream of null) must not serialise
    // with it implicitly; the ordering is the explicit events of cuda_progress.h.
    cuda_check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), where,
               "cudaStreamCreateWithPriority");
    cuda_check(cudaMalloc(&barrier_buffer_, sizeof(int32_t)), where, "cudaMalloc");
    cuda_check(cudaMemsetAsync(barrier_buffer_, 0, sizeof(int32_t), stream_), where,
               "cudaMemsetAsync");
    watchdog_ = std::thread([this] { watchdog_loop(); });
  } catch (...) {
    if (barrier_buffer_ != nullptr) (void)cudaFree(barrier_buffer_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)ncclCommAbort(comm_);
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  const int64_t timeout_ms = timeout_ms_.load();
  // The operations in flight finish first (the watchdog keeps timing them); if some are
  // still running a whole timeout later, something is stuck: abort rather than hang.
  if (!tracker_.wait_idle(Clock::now() + Milliseconds(timeout_ms))) {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    try {
      abort_locked(
          Failure{Code::kAborted, what("destroy") + ": operations were still running " +
                                      duration_text(timeout_ms) +
                                      " after the communicator was destroyed; they were aborted"},
          false);
    } catch (...) {
      if (comm_ != nullptr) (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    stopping_ = true;
  }
  watch_wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  const int previous = [] {
    int d = -1;
    return cudaGetDevice(&d) == cudaSuccess ? d : -1;
  }();
  (void)cudaSetDevice(config_.device);
  {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    if (comm_ != nullptr) {
      // Finalize flushes NCCL's outstanding work (including what it does on behalf of
      // peers) so that destroy never blocks; if that does not end in time, abort.
      const ncclResult_t finalized =
          settle(ncclCommFinalize(comm_), Clock::now() + Milliseconds(timeout_ms));
      if (finalized == ncclSuccess)
        (void)ncclCommDestroy(comm_);
      else
        (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }
  (void)cudaFree(barrier_buffer_);
  (void)cudaStreamDestroy(stream_);
  if (previous >= 0) (void)cudaSetDevice(previous);
}

void NcclCommunicator::set_timeout_ms(int64_t timeout_ms) noexcept {
  timeout_ms_.store(std::max<int64_t>(timeout_ms, 1));
}

std::string NcclCommunicator::what(const char* op) const {
  return std::string(op) + " on group '" + config_.group_key + "' (rank " +
         std::to_string(config_.rank) + " of " + std::to_string(config_.size) + ")";
}

void NcclCommunicator::log(LogLevel level, const std::string& message) const noexcept {
  if (config_.host == nullptr) return;
  static constexpr char kSource[] = "comm_nccl";
  config_.host->log(level, StringView{kSource, sizeof(kSource) - 1},
                    StringView{message.data(), message.size()});
}

cudaStream_t NcclCommunicator::caller_stream(void* stream) const {
  if (stream != nullptr) return static_cast<cudaStream_t>(stream);
  // Host 1.1 has the compute stream; an older core runs its kernels on the legacy default
  // stream, which a null stream names.
  if (config_.host != nullptr && config_.host->interface_info().minor >= 1)
    return static_cast<cudaStream_t>(
        config_.host->compute_stream(Device{DeviceType::kCuda, config_.device}));
  return nullptr;
}

ncclResult_t NcclCommunicator::settle(ncclResult_t result, Clock::time_point deadline) {
  // A non-blocking communicator returns ncclInProgress while a thread of NCCL's queues the
  // work (or connects to peers on first use); no other call on it may start, and nothing may
  // be recorded on its stream, before it reports ncclSuccess.
  auto pause = std::chrono::microseconds(20);
  for (int round = 0; result == ncclInProgress; ++round) {
    if (Clock::now() >= deadline) return ncclInProgress;
    if (round < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    ncclResult_t state = ncclInProgress;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    result = queried != ncclSuccess ? queried : state;
  }
  return result;
}

std::shared_ptr<OpRecord> NcclCommunicator::issue(const std::string& what, void* stream,
                                                  const Enqueue& enqueue) {
  const int64_t timeout_ms = timeout_ms_.load();
  const cudaStream_t caller = caller_stream(stream);
  std::shared_ptr<OpRecord> record;
  {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    if (std::optional<Failure> refused = tracker_.refusal(what))
      throw Error(refused->code, refused->message);
    try {
      DeviceGuard device(config_.device, what);
      auto progress = std::make_unique<CudaProgress>(caller, config_.device, what);
      CudaProgress& events = *progress;
      record = std::make_shared<OpRecord>(what, timeout_ms, std::move(progress));
      cuda_check(cudaEventRecord(events.ready(), caller), what, "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(stream_, events.ready(), 0), what, "cudaStreamWaitEvent");
      const ncclResult_t result =
          settle(enqueue(comm_, stream_), Clock::now() + Milliseconds(timeout_ms));
      if (result == ncclInProgress)
        fail(Code::kDeadlineExceeded,
             what + ": NCCL did not finish queueing the operation within " +
                 duration_text(timeout_ms) +
                 " (it connects to the peers on first use); a rank is stuck or dead, or the "
                 "ranks issued collectives in different orders (raise parallel.timeout_s if it "
                 "is just slow)");
      if (result != ncclSuccess)
        fail(code_of(result),
             what + ": " + nccl_error_text(result) +
                 (code_of(result) == Code::kAborted ? "; a peer failed or the network broke"
                                                    : "; the ranks may disagree on the call"));
      cuda_check(cudaEventRecord(events.done(), stream_), what, "cudaEventRecord");
      tracker_.add(record);
    } catch (const Error& e) {
      abort_locked(Failure{e.code(), e.what()}, true);
      throw;
    } catch (const std::bad_alloc&) {
      abort_locked(Failure{Code::kResourceExhausted, what + ": out of host memory"}, true);
      throw Error(Code::kResourceExhausted, what + ": out of host memory");
    } catch (const std::exception& e) {
      abort_locked(Failure{Code::kInternal, what + ": " + e.what()}, true);
      throw Error(Code::kInternal, what + ": " + e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);  // the watchdog sleeps while idle
  }
  watch_wake_.notify_one();
  return record;
}

void NcclCommunicator::abort_locked(const Failure& failure, bool reported) {
  if (!tracker_.fail(failure, reported)) return;  // failed (and aborted) before
  if (comm_ != nullptr) {
    // Sets NCCL's abort flag, so kernels waiting for a dead peer return, then frees the
    // communicator. This blocks (even for a non-blocking communicator) until NCCL's own
    // streams drain, which the abort flag makes quick: the kernels exit.
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  log(LogLevel::kError, failure.message + " (the NCCL communicator was aborted)");
}

void NcclCommunicator::watchdog_loop() noexcept {
  (void)cudaSetDevice(config_.device);
  std::unique_lock<std::mutex> lock(watch_mutex_);
  while (!stopping_) {
    if (tracker_.pending() == 0) {
      watch_wake_.wait(lock, [&] { return stopping_ || tracker_.pending() > 0; });
      continue;
    }
    // A twentieth of the timeout, between 1 and 50 ms: timeouts are found within 5%, and a
    // busy communicator costs a few event queries every 50 ms.
    const auto tick = Milliseconds(std::clamp<int64_t>(timeout_ms_.load() / 20, 1, 50));
    watch_wake_.wait_for(lock, tick, [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    try {
      watchdog_check();
    } catch (...) {
      // Out of memory while building a message: try again next round.
    }
    lock.lock();
  }
}

void NcclCommunicator::watchdog_check() {
  if (std::optional<Failure> found = tracker_.poll(Clock::now())) {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    abort_locked(*found, false);
    return;
  }
  // NCCL's asynchronous error (a peer or the network failed) is read only while no call is
  // under way: the issuing thread reads it itself while it queues.
  std::unique_lock<std::mutex> lock(comm_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || comm_ == nullptr) return;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
  if (queried != ncclSuccess) state = queried;
  if (state == ncclSuccess || state == ncclInProgress) return;
  std::string front = tracker_.front_what();
  if (front.empty()) front = what("a pending operation");
  abort_locked(Failure{code_of(state),
                       front + ": NCCL reported an error while it ran: " + nccl_error_text(state) +
                           "; a peer failed or the network broke"},
               false);
}

}  // namespace loom::comm_nccl
