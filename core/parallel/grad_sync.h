// GradSync: data-parallel gradient reduction and, with the distributed optimizer (ZeRO-1),
// the sharding of the optimizer's work (DESIGN.md section 5).
//
// Gradients live in the parameter set's flat buffer, cut into buckets in backward order.
// Plain data parallelism all-reduces each bucket (averaging in the collective), so every
// rank updates every parameter. The distributed optimizer reduce-scatters each bucket
// instead: rank r receives the averaged chunk r of every bucket, updates only the
// parameter elements in those chunks (its segments: master weights and optimizer states
// exist only for them), and all-gathers the new values of each bucket afterwards.
// Buckets are reduced on a worker thread as soon as they are handed over, one at a time in
// the order they were handed over, so reduction overlaps whatever the training thread does
// next (the rest of the last backward pass, when the trainer hands buckets over as their
// gradients become final: core/parallel/bucket_readiness.h). Until finish() returns, the
// data-parallel communicator belongs to the worker: the training thread must not use it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/parallel/comm_stats.h"
#include "core/runtime/parameters.h"
#include "loom/kinds/comm_backend.h"

namespace loom::core {

/// A contiguous part of one parameter that this rank's optimizer updates.
struct Segment {
  size_t param = 0;    ///< index into ParameterSet::all()
  int64_t begin = 0;   ///< first element within the parameter
  int64_t length = 0;  ///< elements
  int64_t flat = 0;    ///< position of element `begin` in the flat buffers
  int64_t shard = -1;  ///< position in this rank's gradient shard (distributed optimizer)
};

class GradSync {
 public:
  /// \param params   the model's parameters (flat buffers and buckets)
  /// \param dp       the data-parallel group's communicator (its size may be 1)
  /// \param sharded  true for the distributed optimizer
  /// \param host     for the shard buffers (counted in the memory figures)
  /// \param stats    where the training thread's waits are counted, or null
  GradSync(ParameterSet& params, ICommunicator& dp, bool sharded, IHost& host,
           CommStats* stats = nullptr);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  /// The parts of parameters this rank updates: whole parameters, or with the distributed
  /// optimizer the parts that fall in this rank's chunks.
  const std::vector<Segment>& segments() const { return segments_; }
  /// The reduced gradient of a segment (f32, length), valid after finish().
  TensorView grad_of(const Segment& s) const;
  /// True with the distributed optimizer.
  bool sharded() const { return sharded_; }

  /// Hands bucket `b` to the worker for reduction (its gradients are final). Collectives on
  /// one communicator must be issued in the same order on every rank: every rank of the
  /// data-parallel group must hand the buckets over in the same order. A bucket already
  /// handed over in this step is ignored.
  void start(size_t bucket);
  /// Hands over every bucket not yet started (in index order), then waits until all are
  /// reduced. Throws the first communication error.
  void finish();
  /// Distributed optimizer: every rank's updated chunks to every rank (the parameter
  /// values, in their dtype). No-op otherwise.
  void gather_values();

 private:
  void run(std::function<void()> task);
  void worker();
  ParameterSet& params_;
  ICommunicator& dp_;
  bool sharded_;
  IHost& host_;
  Device device_;  // where the parameters live
  CommStats* stats_;
  std::vector<Segment> segments_;
  std::vector<int64_t> shard_base_;  // per bucket: start of its chunk in grad_shard_
  TensorView grad_shard_{};
  void* grad_shard_mem_ = nullptr;
  void* gather_mem_ = nullptr;  // one chunk of values, the all-gather's input
  std::vector<bool> started_;
  // The worker thread and its queue.
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int64_t pending_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::core
