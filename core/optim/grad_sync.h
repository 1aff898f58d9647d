// GradSync: data-parallel gradient reduction and, with the distributed optimizer (ZeRO-1),
// the sharding of the optimizer's work (DESIGN.md section 5).
//
// Each bucket is reduced over its own group (Bucket::group: the dense parameters' data
// group, cp x ep x dp, or the experts' data group), and sharded over that group's ranks.
//
// Gradients live in the parameter set's flat buffer, cut into buckets in backward order.
// Plain data parallelism all-reduces each bucket (averaging in the collective), so every
// rank updates every parameter. The distributed optimizer reduce-scatters each bucket
// instead: rank r receives the averaged chunk r of every bucket, updates only the
// parameter elements in those chunks (its segments: master weights and optimizer states
// exist only for them), and all-gathers the new values of each bucket afterwards.
// Buckets are reduced with the communicator's asynchronous collectives (communicator 1.1),
// issued when they are handed over and waited for in finish(). The backend runs its
// operations one at a time in issue order, on its own thread (Gloo) or stream (NCCL: after
// the work already queued on the device's compute stream, so gradient kernels queued
// before the hand-over finish first), so the reduction overlaps whatever the training
// thread does next (the rest of the last backward pass, when the trainer hands buckets
// over as their gradients become final: core/optim/bucket_readiness.h). The core's
// communicator wrapper (TimedCommunicator) has the asynchronous calls whatever the backend:
// over a 1.0 backend its reductions run at once, without overlap.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/runtime/parameters.h"
#include "loom/cpp/comm_work.h"
#include "loom/cpp/tensor.h"
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

/// The communicator of a role's group on this rank (a size-1 group in one process).
using GroupOf = std::function<ICommunicator&(ParallelRole role)>;

class GradSync {
 public:
  /// \param params   the model's parameters (flat buffers and buckets)
  /// \param groups   the communicators of the buckets' groups (their size may be 1), with
  ///                 the asynchronous collectives of communicator 1.1
  /// \param sharded  true for the distributed optimizer
  /// \param host     for the shard buffers (counted in the memory figures)
  GradSync(ParameterSet& params, const GroupOf& groups, bool sharded, IHost& host);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  /// The parts of parameters this rank updates: whole parameters, or with the distributed
  /// optimizer the parts that fall in this rank's chunks.
  const std::vector<Segment>& segments() const { return segments_; }
  /// The reduced gradient of a segment (f32, length), valid after finish().
  TensorView grad_of(const Segment& s) const;
  /// True with the distributed optimizer (over a data group of more than one rank).
  bool sharded() const { return sharded_; }
  /// Bytes of the distributed optimizer's two buffers: this rank's f32 gradient shard and
  /// the all-gather's input (the largest chunk, in the parameters' dtype); 0 otherwise.
  uint64_t shard_buffer_bytes() const { return shard_buffer_bytes_; }
  /// The communicator that reduces bucket `b`.
  ICommunicator& comm_of(size_t bucket) const { return *comms_[bucket]; }

  /// Issues the reduction of bucket `b` (its gradients are final: nothing writes them until
  /// finish() returns). Collectives on one communicator must be issued in the same order on
  /// every rank: every rank of the data-parallel group must hand the buckets over in the
  /// same order. A bucket already handed over in this step is ignored. Throws when the
  /// backend refuses to issue it.
  void start(size_t bucket);
  /// Hands over every bucket not yet started (in index order), then waits until all are
  /// reduced (on a device: until the compute stream is ordered after them). Throws the
  /// first communication error, after waiting for every reduction issued.
  void finish();
  /// Distributed optimizer: every rank's updated chunks to every rank (the parameter
  /// values, in their dtype). No-op otherwise.
  void gather_values();

 private:
  ParameterSet& params_;
  std::vector<ICommunicator*> comms_;  // per bucket
  bool sharded_ = false;
  IHost& host_;
  Device device_;  // where the parameters live
  std::vector<Segment> segments_;
  std::vector<int64_t> shard_base_;  // per bucket: start of its chunk in grad_shard_
  TensorView grad_shard_{};
  void* grad_shard_mem_ = nullptr;
  void* gather_mem_ = nullptr;  // one chunk of values, the all-gather's input
  uint64_t shard_buffer_bytes_ = 0;
  std::vector<bool> started_;
  // The reductions issued in this step, in issue order, with what they are for messages.
  struct Pending {
    CommWorkPtr work;
    const char* what;
  };
  std::vector<Pending> pending_;
  // Per bucket: what its reduced gradient is multiplied by (experts' buckets: edp / |data|).
  std::vector<double> factors_;
  Kernel scale_;
};


}  // namespace loom::core
