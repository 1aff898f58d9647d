#include "plugins/comm_nccl/checks.h"

#include <loom/cpp/tensor.h>

#include <cstdint>
#include <string>

namespace loom::comm_nccl {
namespace {

std::string str(int64_t value) { return std::to_string(value); }

std::string cuda_name(int32_t index) { return "cuda:" + std::to_string(index); }

const char* bytes_of(const TensorView& t) { return static_cast<const char*>(t.data); }

}  // namespace

void check_cuda_tensor(const std::string& what, const char* name, const TensorView* t,
                       int32_t device) {
  if (t == nullptr) fail(Code::kInvalidArgument, what + ": " + name + " is null");
  if (t->ndim < 0 || t->ndim > kMaxDims || dtype_size(t->dtype) == 0)
    fail(Code::kInvalidArgument,
         what + ": " + name + " has an invalid rank or dtype (" + dtype_name(t->dtype) + ")");
  if (t->device.type == DeviceType::kCpu)
    fail(Code::kInvalidArgument,
         what + ": " + name + " " + shape_string(*t) +
             " is a CPU tensor; comm_backend 'nccl' moves CUDA tensors only: use comm_backend "
             "'gloo' for CPU tensors");
  if (t->device.type != DeviceType::kCuda)
    fail(Code::kInvalidArgument, what + ": " + name + " " + shape_string(*t) +
                                     " is on an unknown device type (" +
                                     str(static_cast<int32_t>(t->device.type)) +
                                     "); comm_backend 'nccl' moves CUDA tensors");
  if (t->device.index != device)
    fail(Code::kInvalidArgument,
         what + ": " + name + " " + shape_string(*t) + " is on " + cuda_name(t->device.index) +
             " but this communicator serves " + cuda_name(device) +
             " (the current device of the thread that created it); pass tensors of that device");
  if (!is_contiguous(*t))
    fail(Code::kInvalidArgument, what + ": " + name + " " + shape_string(*t) +
                                     " is not contiguous; pass a contiguous view");
  for (int32_t i = 0; i < t->ndim; ++i)
    if (t->shape[i] < 0)
      fail(Code::kInvalidArgument,
           what + ": " + name + " " + shape_string(*t) + " has a negative extent");
  if (t->data == nullptr && numel(*t) > 0)
    fail(Code::kInvalidArgument, what + ": " + name + " " + shape_string(*t) + " has no data");
}

void check_same_dtype(const std::string& what, const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype)
    fail(Code::kInvalidArgument, what + ": input is " + dtype_name(a.dtype) + " " +
                                     shape_string(a) + " but output is " + dtype_name(b.dtype) +
                                     " " + shape_string(b) + "; they must have one dtype");
}

bool reducible(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF64:
    case DType::kBF16:
    case DType::kF16:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      return true;
    default:
      return false;
  }
}

void check_reduction(const std::string& what, DType dtype, ReduceOp op) {
  if (!reducible(dtype))
    fail(Code::kInvalidArgument,
         what + ": cannot reduce " + dtype_name(dtype) +
             " tensors; the nccl backend reduces f32, f64, bf16, f16, i32, i64 and u8");
  switch (op) {
    case ReduceOp::kAvg:
      if (dtype != DType::kF32 && dtype != DType::kF64 && dtype != DType::kBF16 &&
          dtype != DType::kF16)
        fail(Code::kInvalidArgument, what + ": avg needs a floating-point tensor (f32, f64, " +
                                         "bf16, f16), got " + dtype_name(dtype) +
                                         "; use sum and divide");
      return;
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kMin:
      return;
  }
  fail(Code::kInvalidArgument, what + ": unknown reduce op " + str(static_cast<int32_t>(op)) +
                                   "; expected sum (0), avg (1), max (2) or min (3)");
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0 || a == nullptr || b == nullptr) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

namespace {

// Shared by reduce_scatter and all_gather: `whole` holds `size` chunks of `part`'s size, and
// `part` is either disjoint from `whole` or exactly its chunk `rank`.
void check_chunked(const std::string& what, const char* whole_name, const TensorView& whole,
                   const char* part_name, const TensorView& part, int32_t rank, int32_t size) {
  if (numel(whole) != size * numel(part))
    fail(Code::kInvalidArgument,
         what + ": " + whole_name + " " + shape_string(whole) + " must hold " + str(size) +
             " (the group size) times the elements of " + part_name + " " + shape_string(part) +
             ", i.e. " + str(size * numel(part)) + "; it holds " + str(numel(whole)));
  const size_t chunk = nbytes(part);
  if (!overlaps(whole.data, nbytes(whole), part.data, chunk)) return;
  if (bytes_of(part) == bytes_of(whole) + static_cast<size_t>(rank) * chunk) return;
  fail(Code::kInvalidArgument,
       what + ": " + part_name + " " + shape_string(part) + " overlaps " + whole_name + " " +
           shape_string(whole) + " but is not its chunk " + str(rank) +
           " (this rank's); NCCL works in place only on that chunk: pass that chunk or "
           "disjoint tensors");
}

}  // namespace

void check_reduce_scatter(const std::string& what, const TensorView& input,
                          const TensorView& output, int32_t rank, int32_t size) {
  check_same_dtype(what, input, output);
  check_chunked(what, "input", input, "output", output, rank, size);
}

void check_all_gather(const std::string& what, const TensorView& input, const TensorView& output,
                      int32_t rank, int32_t size) {
  check_same_dtype(what, input, output);
  check_chunked(what, "output", output, "input", input, rank, size);
}

void check_root(const std::string& what, int32_t root, int32_t size) {
  if (root < 0 || root >= size)
    fail(Code::kInvalidArgument,
         what + ": root " + str(root) + " is not a rank of the group (0.." + str(size - 1) + ")");
}

void check_peer(const std::string& what, int32_t peer, int32_t rank, int32_t size) {
  if (peer < 0 || peer >= size || peer == rank)
    fail(Code::kInvalidArgument, what + ": peer " + str(peer) +
                                     " must be another rank of the group (0.." + str(size - 1) +
                                     ", not " + str(rank) + ")");
}

void check_all_to_all(const std::string& what, const TensorView& input, const int64_t* send_counts,
                      const int64_t* send_offsets, const TensorView& output,
                      const int64_t* recv_counts, const int64_t* recv_offsets, int32_t rank,
                      int32_t size) {
  check_same_dtype(what, input, output);
  if (!send_counts || !send_offsets || !recv_counts || !recv_offsets)
    fail(Code::kInvalidArgument, what + ": counts and offsets must not be null");
  // Each rank's slice must lie inside its tensor; offsets need not be packed.
  auto check_slices = [&](const char* name, const TensorView& t, const int64_t* counts,
                          const int64_t* offsets) {
    for (int32_t p = 0; p < size; ++p)
      if (counts[p] < 0 || offsets[p] < 0 || offsets[p] > numel(t) ||
          counts[p] > numel(t) - offsets[p])
        fail(Code::kInvalidArgument, what + ": " + name + " slice for rank " + str(p) +
                                         " (offset " + str(offsets[p]) + ", count " +
                                         str(counts[p]) + ") is outside the " + shape_string(t) +
                                         " tensor of " + str(numel(t)) + " elements");
  };
  check_slices("input", input, send_counts, send_offsets);
  check_slices("output", output, recv_counts, recv_offsets);
  if (send_counts[rank] != recv_counts[rank])
    fail(Code::kInvalidArgument, what + ": send_counts[" + str(rank) + "] (" +
                                     str(send_counts[rank]) + ") and recv_counts[" + str(rank) +
                                     "] (" + str(recv_counts[rank]) +
                                     ") differ; what a rank sends itself it receives");
  if (overlaps(input.data, nbytes(input), output.data, nbytes(output)))
    fail(Code::kInvalidArgument, what + ": input " + shape_string(input) + " and output " +
                                     shape_string(output) +
                                     " overlap; NCCL's all-to-all needs disjoint tensors");
}

}  // namespace loom::comm_nccl
