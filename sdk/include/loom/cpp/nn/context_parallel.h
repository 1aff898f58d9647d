// ContextParallelAttention: attention over a sequence split across the context-parallel
// group (IHost::group(kContext)), as Megatron's context parallelism (TransformerEngine's
// AttnFuncWithCPAndKVP2P and its all-gather variant), for any attention core to use.
//
// Layout (causal load balancing). Every sequence of T tokens is cut into 2 cp chunks of
// c = T / (2 cp); rank r holds chunks r and 2cp-1-r, in that order, as its local sequence
// (B, 2c, ...): context_parallel_chunks(). The core hands the model exactly that slice of the
// tokens, labels, loss mask, position ids and segment ids, so that with a causal mask every
// rank has the same amount of attention work.
//
// Attention. Query chunk a of this rank sees key chunk b fully when b < a, causally (the
// square block's own causal mask) when b == a, and not at all when b > a (without a causal
// mask, every block fully). Each visible (query chunk, key chunk) pair is one attention_fwd
// call of c queries and c keys; its output and log-sum-exp are folded into the running
// result by attention_merge, so the result equals attention over the whole sequence.
//   p2p:        key/value chunks travel around the ring (rank r sends to r+1, receives from
//               r-1); the transfer of the next rank's keys overlaps with the attention of
//               the ones at hand. Backward passes keys and values around again, and the
//               gradients of each rank's keys and values follow them, accumulated on the
//               way, back to their owner.
//   all_gather: every rank gathers all keys and values first (and again in backward, to
//               keep memory at one rank's share between the passes); the key/value
//               gradients are reduce-scattered back.
// Backward calls attention_bwd per block with the merged output and log-sum-exp, which
// gives each block's share of the gradients (loom/ops/attention.h). Packed documents: the
// segment ids of the keys travel (or are gathered) with them, and each block passes the
// queries' and the keys' ids (attention_fwd's key segment ids).
//
// Internally every (B, 2c, ...) tensor is kept chunk-major, (2, B, c, ...), so that each
// chunk of the whole micro-batch is one contiguous view.
//
// Attention dropout: each block says where it sits in the whole (T, T) attention
// (ops::AttentionBlockAttrs), so it draws exactly the mask of a one-rank run, in forward and
// backward.
//
//   ContextParallelAttention cp(host, device, dtype, context_parallel_comm(name));
//   if (cp.active()) out = cp.forward(ctx, this, 0, q, k, v, segments, attrs);   // saves
//   ...           cp.backward(ctx, this, 0, dout, attrs, dq, dk, dv);             // loads
#pragma once

#include <loom/cpp/comm_work.h>
#include <loom/cpp/nn/options.h>
#include <loom/cpp/nn/tensor_parallel.h>
#include <loom/cpp/nn/views.h>
#include <loom/ops.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::nn {

/// The two chunks (of 2 size) of every sequence that context-parallel rank `rank` of `size`
/// holds, in the order of its local sequence: rank and 2 size - 1 - rank.
inline std::array<int64_t, 2> context_parallel_chunks(int32_t rank, int32_t size) {
  return {rank, 2 * static_cast<int64_t>(size) - 1 - rank};
}

/// How the context-parallel ranks exchange keys and values (Megatron's --cp-comm-type).
enum class ContextParallelComm { kP2p, kAllGather };

/// The comm type named `name` ("p2p", "all_gather"); throws naming the option otherwise.
inline ContextParallelComm context_parallel_comm(const std::string& name) {
  if (name == "p2p") return ContextParallelComm::kP2p;
  if (name == "all_gather") return ContextParallelComm::kAllGather;
  invalid("#/parallel/cp_comm_type: '" + name + "' is not one of p2p, all_gather");
}

/// Dropout of a (B, T_local, C) activation between the layers of a context-parallel rank
/// (its two chunks, or with sequence parallelism its shard of them) drawing exactly what a
/// one-rank run draws for those tokens (dropout_row_run per contiguous stretch of the whole
/// sequence).
/// \param kernel    the dropout_fwd or dropout_bwd kernel
/// \param attrs     p and the stream's (key, counter) for the whole tensor
/// \param in, out   (B, T_local, C), may alias
/// \param tp        the tensor-parallel region (its sequence shard, with sequence parallelism)
/// \param cp_rank, cp_size  this rank in the context-parallel group (IHost::group(kContext))
inline void dropout_sequence(const Kernel& kernel, const ops::DropoutAttrs& attrs,
                             const TensorView& in, const TensorView& out, const TensorParallel& tp,
                             int32_t cp_rank, int32_t cp_size) {
  const int64_t tl = in.shape[1];
  const int64_t local = tp.full_length(tl), start = tp.sequence_start(tl);
  if (cp_size == 1) return dropout_rows(kernel, attrs, in, out, local, start);
  const int64_t c = local / 2, t = local * cp_size;
  const auto chunks = context_parallel_chunks(cp_rank, cp_size);
  for (int64_t half = 0; half < 2; ++half) {  // the shard's rows within each chunk
    const int64_t lo = std::max(start, half * c), hi = std::min(start + tl, (half + 1) * c);
    dropout_row_run(kernel, attrs, in, out, t, lo - start, chunks[half] * c + (lo - half * c),
                    hi - lo);
  }
}

class ContextParallelAttention {
 public:
  /// Slots of the owner's saves that forward fills and backward reads: [first, first + kSlots).
  static constexpr int32_t kSlots = 6;

  ContextParallelAttention() = default;
  /// \param host    for the context-parallel group and the kernels
  /// \param device  of q, k, v and the output
  /// \param dtype   of q, k, v and the output
  /// \param comm    how keys and values are exchanged
  ContextParallelAttention(IHost& host, Device device, DType dtype, ContextParallelComm comm)
      : host_(&host), device_(device), dtype_(dtype), comm_type_(comm) {
    comm_ = &group(host, ParallelRole::kContext);
    size_ = comm_->size();
    rank_ = comm_->rank();
    if (size_ == 1) return;
    if (!has_async(*comm_))
      fail(Code::kFailedPrecondition,
           "context parallelism: the communicator of the context-parallel group has no "
           "asynchronous operations (communicator 1.1); use a comm backend built against SDK "
           "1.5 or newer");
    fwd_ = Kernel(host, ops::kAttentionFwd, device, dtype);
    bwd_ = Kernel(host, ops::kAttentionBwd, device, dtype);
    merge_ = Kernel(host, ops::kAttentionMerge, device, dtype);
    swap_ = Kernel(host, ops::kSwapAxes12, device, dtype);
    add_ = Kernel(host, ops::kAdd, device, dtype);
  }

  /// True when the sequence is split (the group has more than one rank).
  bool active() const { return size_ > 1; }
  int32_t size() const { return size_; }
  int32_t rank() const { return rank_; }

  /// Attention of this rank's queries over the whole sequence's keys.
  ///   q (B, 2c, H, D), k and v (B, 2c, G, D): this rank's chunks (see above)
  ///   segments (B, 2c) i32 or empty: this rank's chunks' segment ids (packed documents);
  ///            they travel with the keys, and every block masks across documents
  ///   attrs: the core's scale, causal flag and dropout (key and counter of its stream)
  /// Returns out (B, 2c, H, D), a new activation of ctx; in training saves what backward
  /// needs in `owner`'s slots [first_slot, first_slot + kSlots).
  TensorView forward(IForwardContext& ctx, const void* owner, int32_t first_slot,
                     const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& segments, const ops::AttentionAttrs& attrs) const {
    check_inputs(q, k, v, segments);
    Extents e = extents(q, k);
    TensorView q_cm = chunk_major(ctx, q), k_cm = chunk_major(ctx, k), v_cm = chunk_major(ctx, v);
    TensorView seg_cm = segments_chunk_major(ctx, segments);
    TensorView o_cm = allocate(ctx, dtype_, {2, e.b, e.c, e.h, e.d}, device_);
    TensorView lse_cm = allocate(ctx, DType::kF32, {2, e.b, e.h, e.c}, device_);
    TensorView o_part = allocate(ctx, dtype_, {e.b, e.c, e.h, e.d}, device_);
    TensorView lse_part = allocate(ctx, DType::kF32, {e.b, e.h, e.c}, device_);
    bool started[2] = {false, false};
    KeyValues kv = key_values(ctx, e, k_cm, v_cm, seg_cm);
    for (int32_t step = 0; step < size_; ++step) {
      const int32_t source = (rank_ - step + size_) % size_;
      Ring ring = kv.advance(*this, step);
      for (const Block& blk : blocks(source, attrs.causal != 0)) {
        TensorView o_a = chunk(o_cm, blk.q_half), lse_a = chunk(lse_cm, blk.q_half);
        const ops::AttentionBlockAttrs a = block_attrs(attrs, e, blk);
        // The block's first result goes straight into the running one.
        TensorView o_out = started[blk.q_half] ? o_part : o_a;
        TensorView lse_out = started[blk.q_half] ? lse_part : lse_a;
        const TensorView q_a = chunk(q_cm, blk.q_half), k_e = chunk(kv.k, blk.kv_half);
        const TensorView v_e = chunk(kv.v, blk.kv_half);
        if (present(seg_cm))
          fwd_({q_a, k_e, v_e, chunk(seg_cm, blk.q_half), chunk(kv.s, blk.kv_half)},
               {o_out, lse_out}, a, stream());
        else
          fwd_({q_a, k_e, v_e, empty_view()}, {o_out, lse_out}, a, stream());
        if (started[blk.q_half]) merge_({o_part, lse_part}, {o_a, lse_a}, stream());
        started[blk.q_half] = true;
      }
      ring.finish("forward");
      kv.settle(*this, step);
    }
    // Every query chunk sees at least its own chunk, so both halves were written.
    TensorView out = natural(ctx, o_cm);
    if (ctx.training()) {
      const TensorView keep[kSlots] = {q_cm, k_cm, v_cm, o_cm, lse_cm, seg_cm};
      for (int32_t i = 0; i < kSlots; ++i) save(ctx, owner, first_slot + i, keep[i]);
    }
    kv.release_all(ctx);
    release_all(ctx, {q_cm, k_cm, v_cm, o_cm, lse_cm, seg_cm, o_part, lse_part});
    return out;
  }

  /// Gradients of forward's q, k, v from d(out) (B, 2c, H, D); dq, dk, dv are new
  /// activations of ctx, shaped as q, k, v.
  void backward(IForwardContext& ctx, const void* owner, int32_t first_slot,
                const TensorView& dout, const ops::AttentionAttrs& attrs, TensorView& dq,
                TensorView& dk, TensorView& dv) const {
    TensorView q_cm = load(ctx, owner, first_slot + 0), k_cm = load(ctx, owner, first_slot + 1);
    TensorView v_cm = load(ctx, owner, first_slot + 2), o_cm = load(ctx, owner, first_slot + 3);
    TensorView lse_cm = load(ctx, owner, first_slot + 4), seg_cm = load(ctx, owner, first_slot + 5);
    Extents e{q_cm.shape[1], q_cm.shape[2], q_cm.shape[3], k_cm.shape[3], q_cm.shape[4]};
    expect(dout, {e.b, 2 * e.c, e.h, e.d}, dtype_, "context-parallel attention d(out)");
    TensorView do_cm = chunk_major(ctx, dout);
    TensorView dq_cm = zeros(ctx, dtype_, {2, e.b, e.c, e.h, e.d});
    TensorView dq_part = allocate(ctx, dtype_, {e.b, e.c, e.h, e.d}, device_);
    TensorView dk_part = allocate(ctx, dtype_, {e.b, e.c, e.g, e.d}, device_);
    TensorView dv_part = allocate(ctx, dtype_, {e.b, e.c, e.g, e.d}, device_);
    // This step's key/value gradients (of the chunks at hand), then added to what travels.
    TensorView dk_step = allocate(ctx, dtype_, {2, e.b, e.c, e.g, e.d}, device_);
    TensorView dv_step = allocate_like(ctx, dk_step);
    KeyValues kv = key_values(ctx, e, k_cm, v_cm, seg_cm);
    KeyValueGrads grads = key_value_grads(ctx, e);
    for (int32_t step = 0; step < size_; ++step) {
      const int32_t source = (rank_ - step + size_) % size_;
      Ring ring = kv.advance(*this, step);
      fill_zero(dk_step);
      fill_zero(dv_step);
      for (const Block& blk : blocks(source, attrs.causal != 0)) {
        const ops::AttentionBlockAttrs a = block_attrs(attrs, e, blk);
        const TensorView do_a = chunk(do_cm, blk.q_half), q_a = chunk(q_cm, blk.q_half);
        const TensorView k_e = chunk(kv.k, blk.kv_half), v_e = chunk(kv.v, blk.kv_half);
        const TensorView o_a = chunk(o_cm, blk.q_half), lse_a = chunk(lse_cm, blk.q_half);
        if (present(seg_cm))
          bwd_({do_a, q_a, k_e, v_e, o_a, lse_a, chunk(seg_cm, blk.q_half),
                chunk(kv.s, blk.kv_half)},
               {dq_part, dk_part, dv_part}, a, stream());
        else
          bwd_({do_a, q_a, k_e, v_e, o_a, lse_a, empty_view()}, {dq_part, dk_part, dv_part}, a,
               stream());
        TensorView dq_a = chunk(dq_cm, blk.q_half);
        TensorView dk_e = chunk(dk_step, blk.kv_half), dv_e = chunk(dv_step, blk.kv_half);
        add_({dq_a, dq_part}, {dq_a}, stream());
        add_({dk_e, dk_part}, {dk_e}, stream());
        add_({dv_e, dv_part}, {dv_e}, stream());
      }
      grads.accumulate(*this, step, source, dk_step, dv_step);
      ring.finish("backward");
      kv.settle(*this, step);
    }
    TensorView dk_cm = allocate_like(ctx, k_cm), dv_cm = allocate_like(ctx, v_cm);
    grads.finish(*this, dk_cm, dv_cm);
    dq = natural(ctx, dq_cm);
    dk = natural(ctx, dk_cm);
    dv = natural(ctx, dv_cm);
    kv.release_all(ctx);
    grads.release_all(ctx);
    release_all(ctx, {do_cm, dq_cm, dq_part, dk_part, dv_part, dk_step, dv_step, dk_cm, dv_cm});
  }

 private:
  struct Extents {
    int64_t b, c, h, g, d;  // batch, chunk length, query heads, key/value heads, head dim
  };
  // One attention call: query half q_half (0: chunk rank, 1: chunk 2cp-1-rank) over key
  // half kv_half of the source rank's chunks, which are global chunks q_chunk and k_chunk.
  struct Block {
    int32_t q_half, kv_half;
    bool causal;
    int64_t q_chunk, k_chunk;
  };

  void* stream() const { return host_->compute_stream(device_); }

  void check_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& segments) const {
    expect(q, {-1, -1, -1, -1}, dtype_, "context-parallel attention q");
    if (present(segments))
      expect(segments, {q.shape[0], q.shape[1]}, DType::kI32,
             "context-parallel attention segment ids");
    expect(k, {q.shape[0], q.shape[1], -1, q.shape[3]}, dtype_, "context-parallel attention k");
    expect(v, {k.shape[0], k.shape[1], k.shape[2], k.shape[3]}, dtype_,
           "context-parallel attention v");
    if (q.shape[1] % 2 != 0)
      fail(Code::kInvalidArgument,
           detail::concat("context-parallel attention: the local sequence of ", q.shape[1],
                          " tokens is not two equal chunks; the core hands each rank 2 of the "
                          "sequence's 2 cp chunks"));
  }

  static Extents extents(const TensorView& q, const TensorView& k) {
    return {q.shape[0], q.shape[1] / 2, q.shape[2], k.shape[2], q.shape[3]};
  }

  // The visible (query half, key half) pairs of this rank's queries over `source`'s keys.
  std::vector<Block> blocks(int32_t source, bool causal) const {
    std::vector<Block> out;
    const auto mine = context_parallel_chunks(rank_, size_);
    const auto theirs = context_parallel_chunks(source, size_);
    for (int32_t a = 0; a < 2; ++a)
      for (int32_t kv = 0; kv < 2; ++kv) {
        if (causal && theirs[kv] > mine[a]) continue;
        out.push_back(Block{a, kv, causal && theirs[kv] == mine[a], mine[a], theirs[kv]});
      }
    return out;
  }

  // The block's attributes: its own causal flag, and its place in the whole sequence's
  // (T, T) attention for the dropout mask.
  ops::AttentionBlockAttrs block_attrs(const ops::AttentionAttrs& attrs, const Extents& e,
                                       const Block& blk) const {
    ops::AttentionBlockAttrs a{attrs, blk.q_chunk * e.c, blk.k_chunk * e.c, 2 * size_ * e.c,
                               2 * size_ * e.c};
    a.base.causal = blk.causal ? 1 : 0;
    return a;
  }

  // Half `half` of a chunk-major tensor (2, ...) (or chunk `half` of any (N, ...)).
  static TensorView chunk(const TensorView& x, int64_t half) {
    const int64_t n = numel(x) / x.shape[0];
    return make_view(static_cast<char*>(x.data) + half * n * static_cast<int64_t>(dtype_size(x.dtype)),
                     x.dtype, x.shape + 1, x.ndim - 1, x.device);
  }

  // (B, 2c, ...) -> (2, B, c, ...), a new activation.
  TensorView chunk_major(IForwardContext& ctx, const TensorView& x) const {
    const int64_t b = x.shape[0], c = x.shape[1] / 2, row = numel(x) / (b * 2 * c);
    std::vector<int64_t> shape{2, b, c};
    for (int32_t i = 2; i < x.ndim; ++i) shape.push_back(x.shape[i]);
    TensorView y = allocate_shape(ctx, x.dtype, shape, x.device);
    swap_({make_view(x.data, x.dtype, {1, b, 2, c * row}, x.device)},
          {make_view(y.data, y.dtype, {1, 2, b, c * row}, y.device)}, stream());
    return y;
  }

  // (2, B, c, ...) -> (B, 2c, ...), a new activation.
  TensorView natural(IForwardContext& ctx, const TensorView& y) const {
    const int64_t b = y.shape[1], c = y.shape[2], row = numel(y) / (2 * b * c);
    std::vector<int64_t> shape{b, 2 * c};
    for (int32_t i = 3; i < y.ndim; ++i) shape.push_back(y.shape[i]);
    TensorView x = allocate_shape(ctx, y.dtype, shape, y.device);
    swap_({make_view(y.data, y.dtype, {1, 2, b, c * row}, y.device)},
          {make_view(x.data, x.dtype, {1, b, 2, c * row}, x.device)}, stream());
    return x;
  }

  // Segment ids (B, 2c) -> (2, B, c), by 2 B row copies (no kernel moves i32); empty stays
  // empty.
  TensorView segments_chunk_major(IForwardContext& ctx, const TensorView& seg) const {
    if (!present(seg)) return empty_view();
    const int64_t b = seg.shape[0], c = seg.shape[1] / 2;
    TensorView y = allocate(ctx, DType::kI32, {2, b, c}, device_);
    const uint64_t row = static_cast<uint64_t>(c) * sizeof(int32_t);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t half = 0; half < 2; ++half)
        throw_if_error(host_->copy(device_, static_cast<char*>(y.data) + (half * b + i) * row,
                                   device_, static_cast<const char*>(seg.data) + (i * 2 + half) * row,
                                   row),
                       "context-parallel attention: the segment ids");
    return y;
  }

  TensorView zeros(IForwardContext& ctx, DType dtype, std::initializer_list<int64_t> shape) const {
    TensorView t = allocate(ctx, dtype, shape, device_);
    fill_zero(t);
    return t;
  }
  void fill_zero(const TensorView& t) const {
    throw_if_error(host_->fill_zero(device_, t.data, nbytes(t)), "context-parallel attention");
  }

  // Point-to-point transfers of one ring step, waited by finish().
  class Ring {
   public:
    // Sends `out` to the next rank and receives `in` from the previous one, tensor i with
    // tag first_tag + i. Even ranks send first and odd ranks receive first, so that a
    // backend whose transfers run one after another in issue order (NCCL on its stream)
    // pairs every send with its receive without a cycle; Gloo takes any order.
    void exchange(const ContextParallelAttention& cp, std::initializer_list<TensorView> out,
                  std::initializer_list<TensorView> in, int32_t first_tag) {
      auto sends = [&] {
        int32_t tag = first_tag;
        for (const TensorView& t : out) {
          ICommWork* w = nullptr;
          throw_if_error(cp.comm_->send_async(&t, cp.next(), tag++, cp.stream(), &w),
                         "context-parallel ring send");
          work_.emplace_back(w);
        }
      };
      auto receives = [&] {
        int32_t tag = first_tag;
        for (TensorView t : in) {
          ICommWork* w = nullptr;
          throw_if_error(cp.comm_->recv_async(&t, cp.prev(), tag++, cp.stream(), &w),
                         "context-parallel ring receive");
          work_.emplace_back(w);
        }
      };
      if (cp.rank_ % 2 == 0) {
        sends();
        receives();
      } else {
        receives();
        sends();
      }
    }
    void finish(const char* pass) {
      for (CommWorkPtr& w : work_)
        throw_if_error(w->wait(), std::string("context-parallel attention ") + pass +
                                      ": a key/value transfer between context-parallel ranks");
      work_.clear();
    }

   private:
    std::vector<CommWorkPtr> work_;
  };

  // Tags of a ring step's transfers: kTags * step + (0 keys, 1 values, 2 segment ids, 3 and
  // 4 the key and value gradients).
  static constexpr int32_t kTags = 8;

  int32_t next() const { return (rank_ + 1) % size_; }
  int32_t prev() const { return (rank_ - 1 + size_) % size_; }

  // The keys and values at hand in a ring step (p2p: this rank's, then those received;
  // all_gather: one source's chunks of the gathered whole).
  struct KeyValues {
    TensorView local_k{}, local_v{}, local_s{};    // (2, B, c, G, D); segment ids (2, B, c)
    TensorView k{}, v{}, s{};                      // at hand
    TensorView buf_k[2]{}, buf_v[2]{}, buf_s[2]{};  // p2p: receive buffers, alternating
    TensorView all_k{}, all_v{}, all_s{};          // all_gather: (cp, 2, B, c, G, D), (cp, 2, B, c)
    TensorView next_k{}, next_v{}, next_s{};

    // Starts the transfer of the next step's keys and values (p2p), or picks the step's
    // source from the gathered ones (all_gather).
    Ring advance(const ContextParallelAttention& self, int32_t step) {
      Ring ring;
      if (self.comm_type_ == ContextParallelComm::kAllGather) {
        const int32_t source = (self.rank_ - step + self.size_) % self.size_;
        k = chunk(all_k, source);
        v = chunk(all_v, source);
        if (present(all_s)) s = chunk(all_s, source);
        return ring;
      }
      if (step == 0) k = local_k, v = local_v, s = local_s;
      if (step + 1 < self.size_) {
        next_k = buf_k[step % 2];
        next_v = buf_v[step % 2];
        next_s = buf_s[step % 2];
        if (present(s))
          ring.exchange(self, {k, v, s}, {next_k, next_v, next_s}, kTags * step);
        else
          ring.exchange(self, {k, v}, {next_k, next_v}, kTags * step);
      }
      return ring;
    }
    // After the step's transfers finished: the received keys and values are at hand.
    void settle(const ContextParallelAttention& self, int32_t step) {
      if (self.comm_type_ == ContextParallelComm::kP2p && step + 1 < self.size_)
        k = next_k, v = next_v, s = next_s;
    }
    void release_all(IForwardContext& ctx) {
      nn::release_all(ctx, {buf_k[0], buf_k[1], buf_v[0], buf_v[1], buf_s[0], buf_s[1], all_k,
                            all_v, all_s});
    }
  };

  KeyValues key_values(IForwardContext& ctx, const Extents& e, const TensorView& k_cm,
                       const TensorView& v_cm, const TensorView& seg_cm) const {
    KeyValues kv;
    kv.local_k = k_cm;
    kv.local_v = v_cm;
    kv.local_s = seg_cm;
    if (comm_type_ == ContextParallelComm::kP2p) {
      for (int32_t i = 0; i < 2 && i + 1 < size_; ++i) {
        kv.buf_k[i] = allocate_like(ctx, k_cm);
        kv.buf_v[i] = allocate_like(ctx, v_cm);
        if (present(seg_cm)) kv.buf_s[i] = allocate_like(ctx, seg_cm);
      }
    } else {
      kv.all_k = allocate(ctx, dtype_, {size_, 2, e.b, e.c, e.g, e.d}, device_);
      kv.all_v = allocate_like(ctx, kv.all_k);
      throw_if_error(comm_->all_gather(&k_cm, &kv.all_k, stream()),
                     "context-parallel attention: gathering the keys");
      throw_if_error(comm_->all_gather(&v_cm, &kv.all_v, stream()),
                     "context-parallel attention: gathering the values");
      if (present(seg_cm)) {
        kv.all_s = allocate(ctx, DType::kI32, {size_, 2, e.b, e.c}, device_);
        throw_if_error(comm_->all_gather(&seg_cm, &kv.all_s, stream()),
                       "context-parallel attention: gathering the segment ids");
      }
    }
    return kv;
  }

  // The key/value gradients on their way back to their owners. p2p: each step's share is
  // added to the gradients of the chunks at hand received from the previous rank (or to
  // zeros in step 0) and sent on to the next rank, which holds those chunks in the next
  // step; after the last step each rank has received its own. all_gather: shares are added
  // into the whole and reduce-scattered at the end.
  struct KeyValueGrads {
    TensorView acc_k[2]{}, acc_v[2]{};  // p2p: travelling accumulators, alternating
    TensorView all_k{}, all_v{};        // all_gather: (cp, 2, B, c, G, D)
    Ring in_flight;                 // p2p: the last step's send and receive
    int32_t last = -1;

    void accumulate(const ContextParallelAttention& self, int32_t step, int32_t source,
                    const TensorView& dk, const TensorView& dv) {
      if (self.comm_type_ == ContextParallelComm::kAllGather) {
        TensorView k = chunk(all_k, source), v = chunk(all_v, source);
        self.add_({k, dk}, {k}, self.stream());
        self.add_({v, dv}, {v}, self.stream());
        return;
      }
      const int32_t in = step % 2;  // received in the last step (zeros in step 0)
      in_flight.finish("backward");  // the last receive, and the send of the other buffer
      self.add_({acc_k[in], dk}, {acc_k[in]}, self.stream());
      self.add_({acc_v[in], dv}, {acc_v[in]}, self.stream());
      in_flight.exchange(self, {acc_k[in], acc_v[in]}, {acc_k[1 - in], acc_v[1 - in]},
                         kTags * step + 3);
      last = 1 - in;
    }
    void finish(const ContextParallelAttention& self, TensorView& dk, TensorView& dv) {
      if (self.comm_type_ == ContextParallelComm::kAllGather) {
        throw_if_error(self.comm_->reduce_scatter(&all_k, &dk, ReduceOp::kSum, self.stream()),
                       "context-parallel attention: reducing the key gradients");
        throw_if_error(self.comm_->reduce_scatter(&all_v, &dv, ReduceOp::kSum, self.stream()),
                       "context-parallel attention: reducing the value gradients");
        return;
      }
      in_flight.finish("backward");
      throw_if_error(self.host_->copy(self.device_, dk.data, self.device_, acc_k[last].data,
                                      nbytes(dk)),
                     "context-parallel attention: the key gradients");
      throw_if_error(self.host_->copy(self.device_, dv.data, self.device_, acc_v[last].data,
                                      nbytes(dv)),
                     "context-parallel attention: the value gradients");
    }
    void release_all(IForwardContext& ctx) {
      nn::release_all(ctx, {acc_k[0], acc_k[1], acc_v[0], acc_v[1], all_k, all_v});
    }
  };

  KeyValueGrads key_value_grads(IForwardContext& ctx, const Extents& e) const {
    KeyValueGrads g;
    if (comm_type_ == ContextParallelComm::kP2p) {
      for (int32_t i = 0; i < 2; ++i) {
        g.acc_k[i] = allocate(ctx, dtype_, {2, e.b, e.c, e.g, e.d}, device_);
        g.acc_v[i] = allocate_like(ctx, g.acc_k[i]);
      }
      fill_zero(g.acc_k[0]);
      fill_zero(g.acc_v[0]);
    } else {
      g.all_k = zeros(ctx, dtype_, {size_, 2, e.b, e.c, e.g, e.d});
      g.all_v = zeros(ctx, dtype_, {size_, 2, e.b, e.c, e.g, e.d});
    }
    return g;
  }

  IHost* host_ = nullptr;
  Device device_{};
  DType dtype_ = DType::kF32;
  ContextParallelComm comm_type_ = ContextParallelComm::kP2p;
  ICommunicator* comm_ = nullptr;
  int32_t size_ = 1, rank_ = 0;
  Kernel fwd_, bwd_, merge_, swap_, add_;
};

}  // namespace loom::nn
