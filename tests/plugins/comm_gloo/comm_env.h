// Test environment of the Gloo backend: the real plugin loaded through the core from the
// test's runfiles, an in-memory rendezvous store, and groups whose ranks are threads.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/component/builder.h"
#include "core/plugin/plugin_manager.h"
#include "loom/cpp/error.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"

namespace loom::testing {

/// A rendezvous store in memory, shared by the threads of one test: get() waits on a
/// condition variable until the key is set or the timeout passes (kDeadlineExceeded).
class InMemoryStore final : public IRendezvousStore {
 public:
  Status set(StringView key, const void* value, uint64_t size) noexcept override;
  /// Copies at most `capacity` bytes; `*size` is the value's full size.
  Status get(StringView key, void* value, uint64_t capacity, uint64_t* size,
             int64_t timeout_ms) noexcept override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

/// Destroys a communicator through its own library.
struct CommDeleter {
  void operator()(ICommunicator* comm) const {
    if (comm != nullptr) comm->destroy();
  }
};
using CommPtr = std::unique_ptr<ICommunicator, CommDeleter>;

/// A status as (code, message); releases it.
struct Outcome {
  Code code = Code::kOk;
  std::string message;
};
Outcome outcome(Status status);

/// Builds comm_backend "gloo" from `node` ({"impl": "gloo", ...}) through the core, with
/// the plugin loaded once per process from the runfiles.
ObjectPtr make_backend(const nlohmann::json& node = {{"impl", "gloo"}, {"hostname", "127.0.0.1"}});
/// The backend's interface (null when `object` is not a comm_backend).
ICommBackend* as_backend(const ObjectPtr& object);

/// The ranks of one group: one backend and one communicator per rank.
struct Group {
  std::vector<ObjectPtr> backends;  // destroyed after the communicators
  std::vector<CommPtr> comms;       // indexed by rank
  ICommunicator& operator[](int rank) { return *comms[rank]; }
};

/// Connects `size` ranks (threads, concurrently) under `key` through `store`; fails the
/// test (ADD_FAILURE) and returns fewer communicators when one cannot connect.
Group connect_group(int size, const std::string& key, InMemoryStore& store,
                    const nlohmann::json& node = {{"impl", "gloo"}, {"hostname", "127.0.0.1"}});

/// Runs fn(rank) for every rank on its own thread and joins them.
void run_ranks(int size, const std::function<void(int)>& fn);

/// A contiguous 1-D CPU tensor of any dtype that owns its bytes; elements are read and
/// written as double (bf16/f16 round to nearest even on the way in).
struct HostTensor {
  DType dtype = DType::kF32;
  size_t n = 0;
  std::vector<unsigned char> bytes;
  HostTensor(DType dtype, size_t n) : dtype(dtype), n(n), bytes(n * dtype_size(dtype), 0) {}
  /// A (n,) view of the bytes (valid while this object lives).
  TensorView view();
  void set(size_t i, double value);
  double get(size_t i) const;
  /// All elements as double.
  std::vector<double> values() const;
};

}  // namespace loom::testing
