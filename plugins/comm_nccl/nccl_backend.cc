#include "plugins/comm_nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "plugins/comm_nccl/cuda_progress.h"
#include "plugins/comm_nccl/nccl_communicator.h"
#include "plugins/comm_nccl/nccl_types.h"

namespace loom::comm_nccl {
namespace {

// How long create_communicator waits for the other ranks of the group (the communicator's
// own timeout is set later by the core through set_timeout_ms).
constexpr std::chrono::milliseconds kConnectTimeout{300000};

std::string describe(const std::string& key, int32_t rank, int32_t size) {
  return "create_communicator for group '" + key + "' (rank " + std::to_string(rank) + " of " +
         std::to_string(size) + ")";
}

// The device this rank's communicator lives on: the calling thread's current one (the core
// makes each rank's device current before it builds anything).
int32_t current_device(const std::string& what) {
  const std::string hint =
      "; run on a machine with an NVIDIA GPU and driver, or use comm_backend 'gloo' (CPU "
      "tensors)";
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess)
    fail(Code::kUnavailable, what +
                                 ": comm_backend 'nccl' needs a CUDA device: no CUDA device: "
                                 "cudaGetDeviceCount: " +
                                 cuda_error_text(counted) + hint);
  if (count == 0)
    fail(Code::kUnavailable, what +
                                 ": comm_backend 'nccl' needs a CUDA device: no CUDA device: "
                                 "cudaGetDeviceCount found none" +
                                 hint);
  int device = -1;
  const cudaError_t got = cudaGetDevice(&device);
  if (got != cudaSuccess)
    fail(Code::kUnavailable, what + ": comm_backend 'nccl' needs a CUDA device: cudaGetDevice: " +
                                 cuda_error_text(got) + hint);
  return device;
}

// What rank 0 publishes: NCCL's unique id, then the group size it drew it for (so that ranks
// disagreeing on the layout fail here with a message rather than hang in NCCL's bootstrap).
constexpr size_t kRecordBytes = sizeof(ncclUniqueId) + sizeof(int32_t);

ncclUniqueId exchange_id(IRendezvousStore* store, const std::string& key, int32_t rank,
                         int32_t size, const std::string& what) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    const ncclResult_t drawn = ncclGetUniqueId(&id);
    if (drawn != ncclSuccess)
      fail(Code::kUnavailable, what + ": ncclGetUniqueId: " + nccl_error_text(drawn) +
                                   " (rank 0 opens NCCL's bootstrap socket; NCCL_SOCKET_IFNAME "
                                   "picks its network interface)");
    if (size == 1) return id;
    std::vector<char> record(kRecordBytes);
    std::memcpy(record.data(), &id, sizeof(id));
    std::memcpy(record.data() + sizeof(id), &size, sizeof(size));
    throw_if_error(store->set(StringView{key.data(), key.size()}, record.data(), record.size()),
                   what + ": publishing NCCL's unique id under '" + key + "'");
    return id;
  }
  std::vector<char> record(kRecordBytes);
  uint64_t got = 0;
  Status status = store->get(StringView{key.data(), key.size()}, record.data(), record.size(), &got,
                             kConnectTimeout.count());
  if (status.code == Code::kDeadlineExceeded) {
    const std::string detail = take_message(&status);
    fail(Code::kDeadlineExceeded,
         what +
             ": timed out after 300 s waiting for rank 0 of the group to publish NCCL's "
             "unique id under '" +
             key + "' (" + detail + "); rank 0 did not start, crashed, or uses another rendezvous");
  }
  throw_if_error(status, what + ": reading NCCL's unique id under '" + key + "'");
  if (got != kRecordBytes)
    fail(Code::kFailedPrecondition,
         what + ": the store holds " + std::to_string(got) + " bytes under '" + key +
             "', not the " + std::to_string(kRecordBytes) +
             " of this build's NCCL unique id; every rank must run the same loom and NCCL");
  int32_t their_size = 0;
  std::memcpy(&id, record.data(), sizeof(id));
  std::memcpy(&their_size, record.data() + sizeof(id), sizeof(their_size));
  if (their_size != size)
    fail(Code::kFailedPrecondition, what + ": rank 0 made this group for " +
                                        std::to_string(their_size) + " ranks, this rank for " +
                                        std::to_string(size) +
                                        "; the ranks disagree on the parallel layout");
  return id;
}

// ncclCommInitRankConfig, non-blocking, polled until it is done or kConnectTimeout passed.
ncclComm_t init_comm(const ncclUniqueId& id, int32_t rank, int32_t size, int32_t device,
                     const std::string& what) {
  DeviceGuard guard(device, what);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + kConnectTimeout;
  auto pause = std::chrono::microseconds(100);
  while (result == ncclInProgress) {
    if (std::chrono::steady_clock::now() >= deadline) {
      (void)ncclCommAbort(comm);
      fail(Code::kDeadlineExceeded,
           what +
               ": timed out after 300 s in NCCL's bootstrap waiting for the other ranks of "
               "the group; a rank did not start, crashed, or cannot reach rank 0's address "
               "(NCCL_SOCKET_IFNAME picks the network interface)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
    ncclResult_t state = ncclInProgress;
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
    result = queried != ncclSuccess ? queried : state;
  }
  if (result != ncclSuccess) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    fail(code_of(result) == Code::kAborted ? Code::kUnavailable : Code::kInternal,
         what + ": ncclCommInitRankConfig on cuda:" + std::to_string(device) + ": " +
             nccl_error_text(result) +
             " (every rank of a group needs its own GPU; NCCL_DEBUG=INFO tells more)");
  }
  return comm;
}

}  // namespace

NcclBackend::NcclBackend(const nlohmann::json& options, IBuildContext& ctx)
    : host_(ctx.host()), blocking_wait_(options.value("blocking_wait", false)) {
  // Collectives of different communicators (a tp all-reduce while the dp reductions of the
  // gradient buckets are in flight) can run on one GPU at once, each on its communicator's
  // stream; NCCL promises progress then only when every rank launches them in one order.
  // NCCL 2.26+ keeps the host's issue order (the same on every rank here) with this
  // setting, read at its first communicator; the user's own value wins.
  setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", /*overwrite=*/0);
}

Status NcclBackend::create_communicator(IRendezvousStore* store, StringView group_key, int32_t rank,
                                        int32_t size, DeviceType device_type,
                                        ICommunicator** out) noexcept {
  return guard([&] {
    const std::string key(group_key.data != nullptr ? group_key.data : "", group_key.size);
    const std::string what = describe(key, rank, size);
    if (out == nullptr) fail(Code::kInvalidArgument, what + ": out is null");
    *out = nullptr;
    if (device_type != DeviceType::kCuda)
      fail(Code::kUnimplemented, what +
                                     ": comm_backend 'nccl' moves CUDA tensors only; CPU "
                                     "tensors go over comm_backend 'gloo'");
    if (size < 1 || rank < 0 || rank >= size)
      fail(Code::kInvalidArgument, what + ": rank must be in [0, size) and size >= 1");
    if (size > 1 && store == nullptr)
      fail(Code::kInvalidArgument, what + ": the rendezvous store is null");
    if (key.empty()) fail(Code::kInvalidArgument, what + ": the group key is empty");
    const int32_t device = current_device(what);
    int generation = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation = made_[key]++;
    }
    const std::string id_key = key + "/nccl/" + std::to_string(generation) + "/id";
    const ncclUniqueId id = exchange_id(store, id_key, rank, size, what);
    ncclComm_t comm = init_comm(id, rank, size, device, what);
    NcclCommunicator::Config config;
    config.group_key = key;
    config.rank = rank;
    config.size = size;
    config.device = device;
    config.blocking_wait = blocking_wait_;
    config.host = host_;
    *out = new NcclCommunicator(std::move(config), comm);  // aborts `comm` if it throws
  });
}

}  // namespace loom::comm_nccl
