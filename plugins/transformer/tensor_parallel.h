// TensorParallel: the tensor-parallel group as the transformer's modules see it (Megatron's
// ColumnParallelLinear / RowParallelLinear communication, and sequence parallelism).
//
// Every module asks the host for the "tp" communicator (a size-1 group in a single-process
// run, when every method below is the identity) and splits what it declares by its size:
// attention heads and key/value groups, the MLP's hidden units, the vocabulary.
//
// Activations between the layers are (B, T, C). With sequence parallelism each rank holds
// the sequence shard (B, T/P, C) there, rows [r T/P, (r + 1) T/P) of every sequence, and
// norms, dropout and residual adds run on the shard; a column-parallel input is gathered
// to (B, T, C) first and a row-parallel output is reduce-scattered back to the shard.
// Without it every rank holds the whole (B, T, C), and a row-parallel output is
// all-reduced.
//
//   column-parallel input  x:  forward enter(x)   (gather | identity)
//                             backward enter_backward(dx)   (reduce-scatter | all-reduce)
//   row-parallel output    y:  forward exit(y)    (reduce-scatter | all-reduce)
//                             backward exit_backward(dy)    (gather | identity)
#pragma once

#include <loom/cpp/tensor.h>

#include <cstdint>
#include <string>

namespace loom::transformer {

class TensorParallel {
 public:
  /// \param host               for the "tp" communicator and the swap kernel
  /// \param device, dtype      of the activations that cross the group
  /// \param sequence_parallel  activations between layers are sequence shards
  TensorParallel(IHost& host, Device device, DType dtype, bool sequence_parallel);

  int32_t size() const { return size_; }
  int32_t rank() const { return rank_; }
  /// True when activations between layers are sequence shards (and size() > 1).
  bool sequence_parallel() const { return sequence_parallel_ && size_ > 1; }

  /// `global` / size(); throws kInvalidArgument naming `key` (a spec key such as
  /// "/num_attention_heads") and the rule when size() does not divide it.
  int64_t split(int64_t global, const std::string& key) const;

  /// Forward of a column-parallel input: (B, T/P, C) -> (B, T, C) with sequence
  /// parallelism, else `x` itself. The four functions below return either their argument
  /// or a new activation of ctx (the caller's to release); their own temporaries are
  /// released inside.
  TensorView enter(IForwardContext& ctx, const TensorView& x) const;
  /// Backward of the same: the partial input gradient (B, T, C) summed over the group,
  /// reduce-scattered to (B, T/P, C) with sequence parallelism, else all-reduced in place.
  TensorView enter_backward(IForwardContext& ctx, const TensorView& dx) const;
  /// Forward of a row-parallel output (partial sums, (B, T, C)): as enter_backward.
  TensorView exit(IForwardContext& ctx, const TensorView& y) const {
    return enter_backward(ctx, y);
  }
  /// Backward of the same: as enter.
  TensorView exit_backward(IForwardContext& ctx, const TensorView& dy) const {
    return enter(ctx, dy);
  }

  /// The row offset of this rank's sequence shard in a sequence of `t` rows (0 without
  /// sequence parallelism).
  int64_t sequence_start(int64_t t_shard) const {
    return sequence_parallel() ? rank_ * t_shard : 0;
  }
  /// The whole sequence length of activations with `t_local` rows on this rank.
  int64_t full_length(int64_t t_local) const {
    return sequence_parallel() ? t_local * size_ : t_local;
  }

  /// Sum over the group in place; `what` names the tensor in errors.
  void all_reduce(const TensorView& x, const char* what) const;
  /// Every rank's `x` (n elements) into out (P * n), rank r's at chunk r.
  void all_gather(const TensorView& x, const TensorView& out, const char* what) const;

 private:
  ICommunicator* comm_ = nullptr;
  int32_t size_ = 1, rank_ = 0;
  bool sequence_parallel_;
  Kernel swap_;
};

/// Dropout of a (B, T_local, C) activation that is rows [start, start + T_local) of every
/// sequence of the (B, T, C) tensor a single-rank run drops out: each element draws the
/// random number it would draw there (one Philox counter per row block), so sequence
/// shards reproduce the unsharded mask exactly. Needs (T * C) and (start * C) to be
/// multiples of 4 (a hidden size that is a multiple of 4); throws kInvalidArgument else.
/// \param kernel      the dropout_fwd or dropout_bwd kernel
/// \param attrs       p and the stream's (key, counter) for the whole tensor
/// \param in, out     (B, T_local, C), may alias
/// \param t, start    the whole sequence length and the shard's first row
void dropout_rows(const Kernel& kernel, ops::DropoutAttrs attrs, const TensorView& in,
                  const TensorView& out, int64_t t, int64_t start);

}  // namespace loom::transformer
