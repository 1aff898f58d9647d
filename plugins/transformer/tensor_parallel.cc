#include "plugins/transformer/tensor_parallel.h"

#include "plugins/transformer/options.h"
#include "plugins/transformer/views.h"

namespace loom::transformer {
namespace {

// `x` (A, I, J, X) as one flat view of the given 4-D shape (for swap_axes_12).
TensorView as4(const TensorView& x, int64_t a, int64_t i, int64_t j, int64_t rest) {
  return make_view(x.data, x.dtype, {a, i, j, rest}, x.device);
}

}  // namespace

TensorParallel::TensorParallel(IHost& host, Device device, DType dtype, bool sequence_parallel)
    : sequence_parallel_(sequence_parallel) {
  const char* dims = "tp";
  throw_if_error(host.communicator(StringView{dims, 2}, &comm_), "the tensor-parallel group");
  size_ = comm_->size();
  rank_ = comm_->rank();
  if (size_ > 1 && sequence_parallel_) swap_ = Kernel(host, ops::kSwapAxes12, device, dtype);
}

int64_t TensorParallel::split(int64_t global, const std::string& key) const {
  if (global % size_ != 0)
    invalid(detail::concat(key, ": ", global, " is not divisible by the tensor-parallel size ",
                           size_, " (parallel.tp); choose a multiple of ", size_,
                           " or a tensor-parallel size that divides ", global));
  return global / size_;
}

void TensorParallel::all_reduce(const TensorView& x, const char* what) const {
  if (size_ == 1) return;
  TensorView flat = make_view(x.data, x.dtype, {numel(x)}, x.device);
  throw_if_error(comm_->all_reduce(&flat, ReduceOp::kSum, nullptr),
                 std::string("tensor-parallel all-reduce of ") + what);
}

void TensorParallel::all_gather(const TensorView& x, const TensorView& out,
                                const char* what) const {
  TensorView in = make_view(x.data, x.dtype, {numel(x)}, x.device);
  TensorView all = make_view(out.data, out.dtype, {numel(out)}, out.device);
  throw_if_error(comm_->all_gather(&in, &all, nullptr),
                 std::string("tensor-parallel all-gather of ") + what);
}

TensorView TensorParallel::enter(IForwardContext& ctx, const TensorView& x) const {
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

TensorView TensorParallel::enter_backward(IForwardContext& ctx, const TensorView& dx) const {
  if (!sequence_parallel()) {
    all_reduce(dx, "a partial sum");
    return dx;
  }
  expect(dx, {-1, -1, -1}, dx.dtype, "sequence-parallel partial sum");
  int64_t b = dx.shape[0], t = dx.shape[1], c = dx.shape[2], p = size_;
  if (t % p != 0)
    fail(Code::kInvalidArgument, detail::concat("sequence parallelism: the sequence length ", t,
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

void dropout_rows(const Kernel& kernel, ops::DropoutAttrs attrs, const TensorView& in,
                  const TensorView& out, int64_t t, int64_t start) {
  int64_t b = in.shape[0], tl = in.shape[1], c = in.shape[2];
  if (tl == t) {  // the whole sequence
    kernel({in}, {out}, attrs);
    return;
  }
  size_t row_bytes = static_cast<size_t>(tl * c) * dtype_size(in.dtype);
  uint64_t base = attrs.counter;
  if ((t * c) % 4 != 0 || (start * c) % 4 != 0)
    fail(Code::kInvalidArgument,
         detail::concat("dropout on a sequence shard: rows of ", c,
                        " elements do not start on a 4-element block of the random stream; "
                        "sequence parallelism with dropout needs hidden_size to be a multiple "
                        "of 4 (or set the dropout to 0)"));
  for (int64_t i = 0; i < b; ++i) {
    // Element (i, start + j, k) of the whole tensor is number (i T + start + j) C + k.
    attrs.counter = base + static_cast<uint64_t>((i * t + start) * c / 4);
    TensorView xi =
        make_view(static_cast<char*>(in.data) + i * row_bytes, in.dtype, {tl, c}, in.device);
    TensorView yi =
        make_view(static_cast<char*>(out.data) + i * row_bytes, out.dtype, {tl, c}, out.device);
    kernel({xi}, {yi}, attrs);
  }
}

}  // namespace loom::transformer
