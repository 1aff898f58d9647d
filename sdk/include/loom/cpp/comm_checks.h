// Argument checks of communicators (ICommunicator, loom/kinds/comm_backend.h), shared by the
// backends so that all of them refuse a bad call with the same words (header-only; nothing
// here crosses the boundary). They use no device: what is a backend's own (which device a
// tensor must be on, rules of its library) stays in the backend.
//
// Each check throws loom::Error(kInvalidArgument) with a message that starts with `what`, the
// operation's description, e.g. "all_reduce on group 'tp/0' (rank 0 of 2)"; a backend makes
// them before anything is sent, so a refused call leaves the communicator usable.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <string>

#include "loom/cpp/error.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds/comm_backend.h"

namespace loom {

/// Checks a tensor argument: not null, a valid rank and dtype, on the backend's device
/// (`check_device`), contiguous, no negative extent, and data unless it has no elements.
/// \param what          the operation's description
/// \param name          the argument's name ("tensor", "input", "output")
/// \param tensor        the view; may be null (refused)
/// \param check_device  called as check_device(*tensor) once rank and dtype are known valid;
///                      throws (with `what` and `name`) when the tensor is on a device the
///                      backend does not serve
template <class DeviceCheck>
void check_comm_tensor(const std::string& what, const char* name, const TensorView* tensor,
                       DeviceCheck&& check_device) {
  if (tensor == nullptr) fail(Code::kInvalidArgument, what + ": " + name + " is null");
  const TensorView& t = *tensor;
  // Before anything reads the shape: shape_string trusts ndim.
  if (t.ndim < 0 || t.ndim > kMaxDims || dtype_size(t.dtype) == 0)
    fail(Code::kInvalidArgument,
         what + ": " + name + " has an invalid rank or dtype (" + dtype_name(t.dtype) + ")");
  check_device(t);
  if (!is_contiguous(t))
    fail(Code::kInvalidArgument,
         what + ": " + name + " " + shape_string(t) + " is not contiguous; pass a contiguous view");
  for (int32_t i = 0; i < t.ndim; ++i)
    if (t.shape[i] < 0)
      fail(Code::kInvalidArgument,
           what + ": " + name + " " + shape_string(t) + " has a negative extent");
  if (t.data == nullptr && numel(t) > 0)
    fail(Code::kInvalidArgument, what + ": " + name + " " + shape_string(t) + " has no data");
}

/// Checks that input and output have one dtype.
/// \param what    the operation's description
/// \param input   the operation's input (checked by check_comm_tensor)
/// \param output  the operation's output (checked by check_comm_tensor)
inline void check_comm_same_dtype(const std::string& what, const TensorView& input,
                                  const TensorView& output) {
  if (input.dtype != output.dtype)
    fail(Code::kInvalidArgument, what + ": input is " + dtype_name(input.dtype) + " " +
                                     shape_string(input) + " but output is " +
                                     dtype_name(output.dtype) + " " + shape_string(output) +
                                     "; they must have one dtype");
}

/// True for the dtypes every backend reduces: f32, f64, bf16, f16, i32, i64, u8 (the same
/// set on each, so that a spec behaves the same on every backend).
/// \param dtype  the element type of a reduction
inline bool comm_reducible(DType dtype) noexcept {
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

/// True for the dtypes avg accepts: f32, f64, bf16, f16 (an integer mean would truncate).
/// \param dtype  the element type of a reduction
inline bool comm_averageable(DType dtype) noexcept {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16 ||
         dtype == DType::kF16;
}

/// Checks a reduction: a reducible dtype, avg only on an averageable one, and a known op.
/// \param what     the operation's description
/// \param dtype    the element type of the tensors
/// \param op       the reduction
/// \param backend  the backend's name for the message ("gloo": "the gloo backend reduces ...")
inline void check_comm_reduction(const std::string& what, DType dtype, ReduceOp op,
                                 const char* backend) {
  if (!comm_reducible(dtype))
    fail(Code::kInvalidArgument, what + ": cannot reduce " + dtype_name(dtype) + " tensors; the " +
                                     backend +
                                     " backend reduces f32, f64, bf16, f16, i32, i64 and u8");
  switch (op) {
    case ReduceOp::kAvg:
      if (!comm_averageable(dtype))
        fail(Code::kInvalidArgument, what + ": avg needs a floating-point tensor (f32, f64, " +
                                         "bf16, f16), got " + dtype_name(dtype) +
                                         "; use sum and divide");
      return;
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kMin:
      return;
  }
  fail(Code::kInvalidArgument, what + ": unknown reduce op " +
                                   std::to_string(static_cast<int32_t>(op)) +
                                   "; expected sum (0), avg (1), max (2) or min (3)");
}

/// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte (an empty or
/// null range shares none).
inline bool bytes_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) noexcept {
  if (a_bytes == 0 || b_bytes == 0 || a == nullptr || b == nullptr) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

/// Which overlaps of input and output a backend accepts in reduce_scatter and all_gather.
enum class ChunkOverlap {
  kAny,       ///< any: the backend copies through buffers of its own (comm_gloo)
  kOwnChunk,  ///< none, except the smaller tensor being exactly chunk `rank` of the larger
              ///< (NCCL's in-place form)
};

namespace detail {

// Shared by reduce_scatter and all_gather: `whole` holds `size` chunks of `part`'s size, and
// under kOwnChunk `part` is either disjoint from `whole` or exactly its chunk `rank`.
inline void check_comm_chunks(const std::string& what, const char* whole_name,
                              const TensorView& whole, const char* part_name,
                              const TensorView& part, int32_t rank, int32_t size,
                              ChunkOverlap overlap) {
  if (numel(whole) != size * numel(part))
    fail(Code::kInvalidArgument,
         what + ": " + whole_name + " " + shape_string(whole) + " must hold " +
             std::to_string(size) + " (the group size) times the elements of " + part_name + " " +
             shape_string(part) + ", i.e. " + std::to_string(size * numel(part)) + "; it holds " +
             std::to_string(numel(whole)));
  if (overlap == ChunkOverlap::kAny) return;
  const size_t chunk = nbytes(part);
  if (!bytes_overlap(whole.data, nbytes(whole), part.data, chunk)) return;
  if (static_cast<const char*>(part.data) ==
      static_cast<const char*>(whole.data) + static_cast<size_t>(rank) * chunk)
    return;
  fail(Code::kInvalidArgument,
       what + ": " + part_name + " " + shape_string(part) + " overlaps " + whole_name + " " +
           shape_string(whole) + " but is not its chunk " + std::to_string(rank) +
           " (this rank's); in place, the backend works only on that chunk: pass that chunk or "
           "disjoint tensors");
}

}  // namespace detail

/// Checks reduce_scatter's tensors: one dtype, input holding `size` times output's elements
/// (output gets chunk `rank` of the reduced input), and the overlaps `overlap` allows.
/// \param what     the operation's description
/// \param input    (size * n) elements
/// \param output   (n) elements
/// \param rank     this rank in the group
/// \param size     the group size
/// \param overlap  what the backend accepts when input and output share memory
inline void check_comm_reduce_scatter(const std::string& what, const TensorView& input,
                                      const TensorView& output, int32_t rank, int32_t size,
                                      ChunkOverlap overlap) {
  check_comm_same_dtype(what, input, output);
  detail::check_comm_chunks(what, "input", input, "output", output, rank, size, overlap);
}

/// Checks all_gather's tensors: one dtype, output holding `size` times input's elements
/// (input lands in chunk `rank` of output), and the overlaps `overlap` allows.
/// \param what     the operation's description
/// \param input    (n) elements
/// \param output   (size * n) elements
/// \param rank     this rank in the group
/// \param size     the group size
/// \param overlap  what the backend accepts when input and output share memory
inline void check_comm_all_gather(const std::string& what, const TensorView& input,
                                  const TensorView& output, int32_t rank, int32_t size,
                                  ChunkOverlap overlap) {
  check_comm_same_dtype(what, input, output);
  detail::check_comm_chunks(what, "output", output, "input", input, rank, size, overlap);
}

/// Checks a root: a rank of the group, 0 <= root < size.
/// \param what  the operation's description
/// \param root  the rank whose tensor is broadcast
/// \param size  the group size
inline void check_comm_root(const std::string& what, int32_t root, int32_t size) {
  if (root < 0 || root >= size)
    fail(Code::kInvalidArgument, what + ": root " + std::to_string(root) +
                                     " is not a rank of the group (0.." + std::to_string(size - 1) +
                                     ")");
}

/// Checks a peer of send / recv: another rank of the group, 0 <= peer < size, peer != rank.
/// \param what  the operation's description
/// \param peer  the rank sent to or received from
/// \param rank  this rank in the group
/// \param size  the group size
inline void check_comm_peer(const std::string& what, int32_t peer, int32_t rank, int32_t size) {
  if (peer < 0 || peer >= size || peer == rank)
    fail(Code::kInvalidArgument,
         what + ": peer " + std::to_string(peer) + " must be another rank of the group (0.." +
             std::to_string(size - 1) + ", not " + std::to_string(rank) + ")");
}

/// Checks all_to_all's arguments: one dtype, non-null counts and offsets (`size` entries
/// each, in elements), every rank's slice inside its tensor (offsets need not be packed), and
/// send_counts[rank] == recv_counts[rank]. Whether input and output may overlap is the
/// backend's own rule.
/// \param what          the operation's description
/// \param input         holds the slices sent: rank p's at send_offsets[p], send_counts[p] long
/// \param send_counts   (size) elements sent to each rank
/// \param send_offsets  (size) where in input each rank's slice starts
/// \param output        holds the slices received, likewise
/// \param recv_counts   (size) elements received from each rank
/// \param recv_offsets  (size) where in output each rank's slice starts
/// \param rank          this rank in the group
/// \param size          the group size
inline void check_comm_all_to_all(const std::string& what, const TensorView& input,
                                  const int64_t* send_counts, const int64_t* send_offsets,
                                  const TensorView& output, const int64_t* recv_counts,
                                  const int64_t* recv_offsets, int32_t rank, int32_t size) {
  check_comm_same_dtype(what, input, output);
  if (!send_counts || !send_offsets || !recv_counts || !recv_offsets)
    fail(Code::kInvalidArgument, what + ": counts and offsets must not be null");
  auto check_slices = [&](const char* name, const TensorView& t, const int64_t* counts,
                          const int64_t* offsets) {
    // Written so that no sum can overflow.
    for (int32_t p = 0; p < size; ++p)
      if (counts[p] < 0 || offsets[p] < 0 || offsets[p] > numel(t) ||
          counts[p] > numel(t) - offsets[p])
        fail(Code::kInvalidArgument, what + ": " + name + " slice for rank " + std::to_string(p) +
                                         " (offset " + std::to_string(offsets[p]) + ", count " +
                                         std::to_string(counts[p]) + ") is outside the " +
                                         shape_string(t) + " tensor of " +
                                         std::to_string(numel(t)) + " elements");
  };
  check_slices("input", input, send_counts, send_offsets);
  check_slices("output", output, recv_counts, recv_offsets);
  if (send_counts[rank] != recv_counts[rank])
    fail(Code::kInvalidArgument, what + ": send_counts[" + std::to_string(rank) + "] (" +
                                     std::to_string(send_counts[rank]) + ") and recv_counts[" +
                                     std::to_string(rank) + "] (" +
                                     std::to_string(recv_counts[rank]) +
                                     ") differ; what a rank sends itself it receives");
}

}  // namespace loom
