// Argument checks of the NCCL communicator. They use no CUDA, so they run (and are tested) on
// machines without a GPU. Each throws loom::Error(kInvalidArgument) with a message that starts
// with the operation's description, e.g. "all_reduce on group 'tp/0' (rank 0 of 2)", and leaves
// the communicator usable: nothing has been sent when they fail.
#pragma once

#include <loom/sdk.h>
#include <stddef.h>
#include <stdint.h>

#include <string>

namespace loom::comm_nccl {

/// A contiguous CUDA tensor on device `device`, with data (or no elements) and a dtype.
/// A CPU tensor is refused with the hint to move it over comm_backend 'gloo'.
/// \param what    the operation's description
/// \param name    the argument's name ("tensor", "input", "output")
/// \param tensor  the view; may be null (refused)
/// \param device  the CUDA device the communicator serves
void check_cuda_tensor(const std::string& what, const char* name, const TensorView* tensor,
                       int32_t device);

/// input and output have one dtype.
void check_same_dtype(const std::string& what, const TensorView& input, const TensorView& output);

/// True for the dtypes the backend reduces: f32, f64, bf16, f16, i32, i64, u8 (those
/// comm_gloo reduces, so a spec behaves the same on both backends).
bool reducible(DType dtype);

/// A reduction NCCL can do here: a reducible dtype, avg only on f32/f64/bf16/f16, and a known
/// ReduceOp.
void check_reduction(const std::string& what, DType dtype, ReduceOp op);

/// reduce_scatter's shapes: input (size * n) and output (n) of one dtype, either disjoint or
/// with output at chunk `rank` of input (NCCL's in-place form); any other overlap is refused.
void check_reduce_scatter(const std::string& what, const TensorView& input,
                          const TensorView& output, int32_t rank, int32_t size);

/// all_gather's shapes: input (n) and output (size * n) of one dtype, either disjoint or with
/// input at chunk `rank` of output (NCCL's in-place form); any other overlap is refused.
void check_all_gather(const std::string& what, const TensorView& input, const TensorView& output,
                      int32_t rank, int32_t size);

/// A root of the group, 0 <= root < size.
void check_root(const std::string& what, int32_t root, int32_t size);

/// Another rank of the group: 0 <= peer < size and peer != rank.
void check_peer(const std::string& what, int32_t peer, int32_t rank, int32_t size);

/// all_to_all's arguments: non-null counts and offsets (size entries each), every slice
/// inside its tensor, send_counts[rank] == recv_counts[rank], one dtype, and input and
/// output disjoint (NCCL reads the one while writing the other).
void check_all_to_all(const std::string& what, const TensorView& input, const int64_t* send_counts,
                      const int64_t* send_offsets, const TensorView& output,
                      const int64_t* recv_counts, const int64_t* recv_offsets, int32_t rank,
                      int32_t size);

/// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes);

}  // namespace loom::comm_nccl
