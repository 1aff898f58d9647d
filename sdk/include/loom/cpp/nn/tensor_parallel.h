// TensorParallel: the tensor-parallel group as modules see it (Megatron's
// ColumnParallelLinear / RowParallelLinear communication, and sequence parallelism).
//
// Every module asks the host for the group of role kTensor (IHost::group; a size-1 group in
// a single-process run, when every method below is the identity) and splits what it
// declares by its size: attention heads and key/value groups, the MLP's hidden units, the
// vocabulary.
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

#include <loom/cpp/nn/options.h>
#include <loom/cpp/nn/views.h>
#include <loom/cpp/tensor.h>
#include <loom/kinds/comm_backend.h>

#include <cstdint>
#include <string>

namespace loom::nn {

/// The communicator of this rank's group for `role` (IHost::group), throwing with the role's
/// name when the host cannot give it.
inline ICommunicator& group(IHost& host, ParallelRole role) {
  ICommunicator* comm = nullptr;
  throw_if_error(host.group(role, &comm),
                 std::string("the ") + parallel_role_name(role) + " parallel group");
  return *comm;
}

/// The random stream `purpose` of a module inside a tensor-parallel region whose ranks hold
/// different parts of one tensor (attention heads): each rank draws from its own part of the
/// stream (Megatron's model-parallel RNG), and rank 0's is the single-rank stream, so a
/// one-rank run draws what rank 0 of a tensor-parallel run does.
inline uint64_t tensor_parallel_stream(IHost& host, uint64_t purpose) {
  return purpose + (static_cast<uint64_t>(group(host, ParallelRole::kTensor).rank()) << 32);
}

class TensorParallel {
 public:
  /// \param host               for the tensor-parallel group and the swap kernel
  /// \param device, dtype      of the activations that cross the group
  /// \param sequence_parallel  activations between layers are sequence shards
  TensorParallel(IHost& host, Device device, DType dtype, bool sequence_parallel)
      : sequence_parallel_(sequence_parallel) {
    comm_ = &group(host, ParallelRole::kTensor);
    size_ = comm_->size();
    rank_ = comm_->rank();
    if (size_ > 1 && sequence_parallel_) swap_ = Kernel(host, ops::kSwapAxes12, device, dtype);
  }

  int32_t size() const { return size_; }
  int32_t rank() const { return rank_; }
  /// True when activations between layers are sequence shards (and size() > 1).
  bool sequence_parallel() const { return sequence_parallel_ && size_ > 1; }

  /// `global` / size(); throws kInvalidArgument naming `key` (a spec key such as
  /// "/num_attention_heads") and the rule when size() does not divide it.
  int64_t split(int64_t global, const std::string& key) const {
    if (global % size_ != 0)
      invalid(detail::concat(key, ": ", global, " is not divisible by the tensor-parallel size ",
                             size_, " (parallel.tp); choose a multiple of ", size_,
                             " or a tensor-parallel size that divides ", global));
    return global / size_;
  }

  /// Forward of a column-parallel input: (B, T/P, C) -> (B, T, C) with sequence
  /// parallelism, else `x` itself. The four functions below return either their argument
  /// or a new activation of ctx (the caller's to release); their own temporaries are
  /// released inside.
  TensorView enter(IForwardContext& ctx, const TensorView& x) const {
    if (!sequence_parallel()) return x;
    expect(x, {-1, -1, -1}, x.dtype, "sequence shard");
    int64_t b = x.shape[0], tl = x.shape[1], c = x.shape[2], p = size_;
    TensorView chunks = allocate(ctx, x.dtype, {p, b, tl, c}, x.device);  // rank-major
    all_gather(x, chunks, "a sequence shard");
    if (b == 1) return make_view(chunks.data, x.dtype, {1, p * tl, c}, x.device);
    TensorView full = allocate(ctx, x.dtype, {b, p * tl, c}, x.device);
    swap_({as4(chunks, 1, p, b, tl * c)}, {as4(full, 1, b, p, tl * c)});
    release(ctx, chunks);
    return full;
  }
  /// Backward of the same: the partial input gradient (B, T, C) summed over the group,
  /// reduce-scattered to (B, T/P, C) with sequence parallelism, else all-reduced in place.
  TensorView enter_backward(IForwardContext& ctx, const TensorView& dx) const {
    if (!sequence_parallel()) {
      all_reduce(dx, "a partial sum");
      return dx;
    }
    expect(dx, {-1, -1, -1}, dx.dtype, "sequence-parallel partial sum");
    int64_t b = dx.shape[0], t = dx.shape[1], c = dx.shape[2], p = size_;
    if (t % p != 0)
      fail(Code::kInvalidArgument,
           detail::concat("sequence parallelism: the sequence length ", t,
                          " is not divisible by the tensor-parallel size ", p,
                          "; set train.seq_length to a multiple of ", p));
    int64_t tl = t / p;
    TensorView chunks = dx;  // (P, B, T/P, C): the chunk for rank r at r
    if (b > 1) {
      chunks = allocate(ctx, dx.dtype, {p, b, tl, c}, dx.device);
      swap_({as4(dx, 1, b, p, tl * c)}, {as4(chunks, 1, p, b, tl * c)});
    }
    TensorView shard = allocate(ctx, dx.dtype, {b, tl, c}, dx.device);
    TensorView in = make_view(chunks.data, dx.dtype, {numel(dx)}, dx.device);
    TensorView out = make_view(shard.data, dx.dtype, {numel(shard)}, dx.device);
    throw_if_error(comm_->reduce_scatter(&in, &out, ReduceOp::kSum, nullptr),
                   "tensor-parallel reduce-scatter of a partial sum");
    if (b > 1) release(ctx, chunks);  // b == 1: chunks is dx, the caller's
    return shard;
  }
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
  void all_reduce(const TensorView& x, const char* what) const {
    if (size_ == 1) return;
    TensorView flat = make_view(x.data, x.dtype, {numel(x)}, x.device);
    throw_if_error(comm_->all_reduce(&flat, ReduceOp::kSum, nullptr),
                   std::string("tensor-parallel all-reduce of ") + what);
  }
  /// Every rank's `x` (n elements) into out (P * n), rank r's at chunk r.
  void all_gather(const TensorView& x, const TensorView& out, const char* what) const {
    TensorView in = make_view(x.data, x.dtype, {numel(x)}, x.device);
    TensorView all = make_view(out.data, out.dtype, {numel(out)}, out.device);
    throw_if_error(comm_->all_gather(&in, &all, nullptr),
                   std::string("tensor-parallel all-gather of ") + what);
  }

 private:
  // `x` (A, I, J, X) as one flat view of the given 4-D shape (for swap_axes_12).
  static TensorView as4(const TensorView& x, int64_t a, int64_t i, int64_t j, int64_t rest) {
    return make_view(x.data, x.dtype, {a, i, j, rest}, x.device);
  }

  ICommunicator* comm_ = nullptr;
  int32_t size_ = 1, rank_ = 0;
  bool sequence_parallel_;
  Kernel swap_;
};

/// Dropout of rows [local, local + n) of every sequence of a (B, T_local, C) activation,
/// which are rows [global, global + n) of the (B, T, C) tensor a single-rank run drops out:
/// each element draws the random number it would draw there (one Philox counter per row
/// block), so shards of the sequence reproduce the whole's mask exactly. Needs (T * C) and
/// (global * C) to be multiples of 4 (a hidden size that is a multiple of 4); throws
/// kInvalidArgument else.
/// \param kernel      the dropout_fwd or dropout_bwd kernel
/// \param attrs       p and the stream's (key, counter) for the whole tensor
/// \param in, out     (B, T_local, C), may alias
/// \param t           the whole sequence length
inline void dropout_row_run(const Kernel& kernel, ops::DropoutAttrs attrs, const TensorView& in,
                            const TensorView& out, int64_t t, int64_t local, int64_t global,
                            int64_t n) {
  const int64_t b = in.shape[0], tl = in.shape[1], c = in.shape[2];
  if (n <= 0) return;
  if ((t * c) % 4 != 0 || (global * c) % 4 != 0)
    fail(Code::kInvalidArgument,
         detail::concat("dropout on a sequence shard: rows of ", c,
                        " elements do not start on a 4-element block of the random stream; "
                        "sequence or context parallelism with dropout needs hidden_size to be a "
                        "multiple of 4 (or set the dropout to 0)"));
  const size_t elem = dtype_size(in.dtype), out_elem = dtype_size(out.dtype);
  const uint64_t base = attrs.counter;
  for (int64_t i = 0; i < b; ++i) {
    // Element (i, global + j, k) of the whole tensor is number (i T + global + j) C + k.
    attrs.counter = base + static_cast<uint64_t>((i * t + global) * c / 4);
    const int64_t first = (i * tl + local) * c;
    TensorView xi = make_view(static_cast<char*>(in.data) + first * elem, in.dtype, {n, c},
                              in.device);
    TensorView yi = make_view(static_cast<char*>(out.data) + first * out_elem, out.dtype, {n, c},
                              out.device);
    kernel({xi}, {yi}, attrs);
  }
}

/// Dropout of a (B, T_local, C) activation that is rows [start, start + T_local) of every
/// sequence of the (B, T, C) tensor a single-rank run drops out (dropout_row_run over all of
/// it; one call when it is the whole sequence).
inline void dropout_rows(const Kernel& kernel, ops::DropoutAttrs attrs, const TensorView& in,
                         const TensorView& out, int64_t t, int64_t start) {
  const int64_t tl = in.shape[1];
  if (tl == t) {  // the whole sequence
    kernel({in}, {out}, attrs);
    return;
  }
  dropout_row_run(kernel, attrs, in, out, t, 0, start, tl);
}

}  // namespace loom::nn
