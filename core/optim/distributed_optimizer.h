// DistributedOptimizer: the optimizer's side of a training step, in one place (DESIGN.md
// sections 5 and 6). It owns, for the parameter segments this rank updates (whole
// parameters, or with the distributed optimizer the parts in its shards, GradSync), the f32
// master weights (the parameter itself when it is f32) and the optimizer plugin's state
// tensors; and it runs the step's optimizer work:
//   - the gradient reduction: sequence-parallel gradients summed over the tensor group, the
//     tied embedding table's over the embedding group (the first and the last pipeline
//     stage each hold it; its bucket waits until backward is over on every stage), then
//     each bucket averaged over its data group (all-reduce, or reduce-scatter for ZeRO-1),
//     started during the last backward as buckets become final (BucketReadiness) when
//     overlap is on, else after backward;
//   - the global gradient norm (each gradient piece counted once, summed over the grad-norm
//     group) and the clipping coefficient;
//   - the update: update_many (optimizer 1.1) with the casts into non-f32 parameters fused,
//     or update per shard and a cast for an optimizer built against optimizer 1.0; then the
//     all-gather of the updated shards (ZeRO-1);
//   - its checkpoint tensors ("optim.master.<name>", "optim.<state>.<name>"), gathered from
//     the shards, and their restore (optimizer_checkpoint.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/optim/bucket_readiness.h"
#include "core/optim/grad_sync.h"
#include "core/runtime/parameters.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds/optimizer.h"

namespace loom::core {

/// How the optimizer runs on this rank.
struct OptimizerSetup {
  Device device;                     ///< where parameters, gradients and states live
  DType params_dtype = DType::kF32;  ///< f32 parameters are their own master weights
  bool sharded = false;              ///< the distributed optimizer (ZeRO-1)
  bool overlap = false;              ///< reduce buckets during the step's last backward
  int tp_rank = 0;                   ///< this rank's tensor-parallel coordinate
  /// The tied embedding table (kParamTiedEmbedding) here is the last pipeline stage's copy
  /// of the first stage's: its gradient is summed with the first stage's over the embedding
  /// group like the first stage's, and counted once in the norm (there, not here).
  bool tied_replica = false;
  /// This rank's coordinates on the experts' grid (etp, edp): an expert's parameter
  /// replicated over etp (or over edp without sharding) counts in the norm once, there.
  int expert_tp_rank = 0;
  int expert_dp_rank = 0;
  /// Some rank of the run holds experts' parameters: every rank then takes part in summing
  /// their squared norm over every rank (a pipeline stage without experts too). A rank that
  /// holds experts sums theirs either way.
  bool experts = false;
  /// Where this rank's slices start: tp_rank, or expert_tp_rank for an expert's parameter.
  SplitRanks split_ranks() const { return {tp_rank, expert_tp_rank}; }
};

/// The dtype of each of `optimizer`'s states (IOptimizer::state_dtype; f32 for an optimizer
/// older than 1.4). Throws kInvalidArgument, naming the state, for a dtype other than f32
/// and bf16.
std::vector<DType> state_dtypes(const IOptimizer& optimizer);

class DistributedOptimizer {
 public:
  /// Allocates the master weights (copied from the parameters) and zeroed states of this
  /// rank's segments. Frees them again when it throws.
  /// \param host       allocator, copies and kernels
  /// \param params     the model's parameters (outlives this object)
  /// \param optimizer  the optimizer plugin's component (outlives this object)
  /// \param groups     the communicators of the data, expert-data, tensor, embedding and
  ///                   grad-norm roles
  DistributedOptimizer(IHost& host, ParameterSet& params, IOptimizer& optimizer,
                       const OptimizerSetup& setup, const GroupOf& groups);
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  /// Starts a step: zero gradients (with `keep_overwrite`, all but the kParamGradOverwrite
  /// ones, whose first write overwrites them: ParameterSet::zero_grads), no bucket handed
  /// over yet.
  void begin_step(bool keep_overwrite = false);
  /// Whether buckets are reduced during the step's last backward.
  bool overlap() const { return setup_.overlap; }
  /// The grads_ready signal of `owner` (a module) during the step's last backward: starts
  /// the reduction of every bucket that became final, in bucket order, after zeroing its
  /// kept overwrite gradients that no write claimed (ParameterSet::zero_unclaimed).
  void grads_ready(const void* owner);
  /// After the last backward: reduces the buckets not started yet and waits for all.
  void finish_reduction();
  /// The global L2 norm of the reduced gradients (every piece once, over every rank),
  /// divided by `loss_scale`.
  double grad_norm(double loss_scale);
  /// The sum of squares of grad_norm, left on the device: zeroes `acc` (f64 (1) where the
  /// gradients live) and adds every gradient piece's squares into it, reading nothing back,
  /// so that it can be captured in a graph (/train/cuda_graph "step"). One process without
  /// experts' parameters only (grad_norm adds those up on the host): throws
  /// kFailedPrecondition otherwise.
  void grad_sumsq(const TensorView& acc);
  /// Updates every shard with `hp` (clipping and unscaling in hp.grad_scale, or in its step
  /// scalars), then gathers the updated shards (ZeRO-1). `verify_cast`: read the first
  /// updated bf16/f16 parameter back once (check_cast); false inside a graph's capture.
  void update(const OptimizerStep& hp, bool verify_cast = true);
  /// Buckets handed over during the last backward in this step, and in all.
  size_t released_buckets() const { return readiness_.released(); }
  size_t bucket_count() const { return readiness_.bucket_count(); }
  bool sharded() const { return grad_sync_.sharded(); }

  /// Whether the tensors append_checkpoint_tensors gives are host memory (the gathered
  /// shards of the distributed optimizer) rather than where the states live.
  bool checkpoint_on_host() const { return checkpoint_on_host_; }
  /// Memory of the master weights and of the optimizer states on this rank, in bytes.
  uint64_t master_bytes() const;
  uint64_t state_bytes() const;
  /// The distributed optimizer's gradient shard and all-gather buffer (GradSync), in bytes.
  uint64_t shard_buffer_bytes() const { return grad_sync_.shard_buffer_bytes(); }

  // ---- checkpoints (optimizer_checkpoint.cc) ----

  /// Makes the optimizer tensors of every parameter readable for a checkpoint: f32 master
  /// weights when the parameters are not f32 ("optim.master.<name>") and the optimizer's
  /// states ("optim.<state>.<name>"). Collective over the data groups with the distributed
  /// optimizer: the shards are gathered into host memory this object keeps until the next
  /// call. Call on every rank before append_checkpoint_tensors.
  void prepare_checkpoint();
  /// Appends `p`'s optimizer tensors (prepared above), this rank's slice in the whole
  /// tensor's coordinates; the data still lives where the states do (on a device: the
  /// caller copies it to the host). Only the ranks that write `p` call it.
  void append_checkpoint_tensors(const Parameter& p, std::vector<SaveTensor>& out) const;
  /// Reads the optimizer tensors of every parameter this rank updates from `reader`.
  /// Throws kNotFound naming the tensor when the checkpoint lacks one (another optimizer).
  /// \param saved_optimizer  the optimizer impl that saved it (for the message)
  /// \param this_optimizer   this run's impl
  void restore(CheckpointReader& reader, const std::string& saved_optimizer,
               const std::string& this_optimizer);
  /// Copies the parameters' values into the master weights (after loading weights alone).
  void refresh_masters();

 private:
  // Optimizer memory of one segment (a whole parameter, or with the distributed optimizer
  // the part of it this rank updates): f32 master weights (the parameter itself when it is
  // f32) and the optimizer's state tensors.
  struct ParamState {
    Parameter* param = nullptr;
    Segment segment;
    TensorView master{};             // f32 (n,)
    std::vector<TensorView> states;  // (n,) each, of state_dtypes_
    std::vector<void*> owned;        // allocations to free
    bool decay = true;
    bool in_norm = true;  // counted in the grad norm on this rank (replicas count once)
    bool expert = false;  // an expert's: its squares are summed over every rank
  };
  // The dtype of checkpoint kind `kind`: 0, the master weights: f32; s + 1: state s's.
  DType kind_dtype(int32_t kind) const;
  // The parameter's own memory of a shard: (segment.length) in the parameter's dtype.
  TensorView param_shard(const ParamState& st) const;
  // Bucket `b`'s gradients are final: its sequence-parallel ones over the tensor group,
  // then its data-parallel reduction (issued now, waited for in finish_reduction).
  void reduce_bucket(size_t b);
  void reduce_sequence_parallel_grads(size_t b);
  void reduce_tied_grads(size_t b);
  // One update_many call (optimizer 1.1), or update and a cast per shard (1.0).
  void update_all(const OptimizerStep& hp, bool verify_cast);
  // Adds the squares of the gradients of dense (experts = false) or experts' parameters
  // counted on this rank into `acc` (f64 (1) where they live), in one multi-tensor call
  // where a kernel serves it.
  void add_sumsq(bool experts, const TensorView& acc);
  void update_each(const OptimizerStep& hp);
  // After the first update_many: the first bf16/f16 shard's parameter must hold its new
  // master rounded to nearest even (OptimizerShard::param). An optimizer that skips that
  // cast would train nothing and say nothing; it is refused with its name instead.
  void check_cast(const ParamState& st);
  void release();

  IHost& host_;
  ParameterSet& params_;
  IOptimizer& optimizer_;
  OptimizerSetup setup_;
  ICommunicator& tensor_;
  ICommunicator& grad_norm_group_;
  ICommunicator& world_;        // where the experts' squared norms add up
  bool local_experts_ = false;  // this rank holds experts' parameters
  ICommunicator& embedding_;
  GradSync grad_sync_;
  BucketReadiness readiness_;
  std::vector<std::unique_ptr<ParamState>> states_;
  std::vector<DType> state_dtypes_;  // [state_count()]: each state's dtype (state_dtypes)
  Kernel sumsq_, cast_;
  Kernel sumsq_multi_;        // unresolved where no kernel serves it: sumsq_ per tensor
  void* norm_acc_ = nullptr;  // (1) f64 on a device: the gradient norm's sum of squares
  // Gathered master weights and states (host), each in its own dtype's bytes.
  std::vector<std::vector<uint64_t>> checkpoint_scratch_;
  std::vector<const void*> checkpoint_data_;  // [param * (states + 1) + kind], kind 0: master
  bool checkpoint_on_host_ = false;           // checkpoint_data_ points into the scratch
  bool cast_checked_ = false;                 // check_cast ran (on the first update_many)
};

}  // namespace loom::core
