// Elementwise reductions of the Gloo backend, one per (dtype, ReduceOp), in the shape
// gloo's allreduce wants (void pointers, element count), and the 1/size scaling of avg.
#pragma once

#include <loom/sdk.h>
#include <stddef.h>

#include <string>

namespace loom::comm_gloo {

/// out[i] = a[i] (op) b[i] for i < n, elements of one dtype. `out` may alias `a` or `b`
/// (gloo reduces in place). bf16/f16 pairs are combined in f32 and rounded back to nearest
/// even. Integer sums wrap around (two's complement), as NCCL's do.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

/// The reduction for (dtype, op); kAvg reduces as kSum (the caller then calls `scale`).
/// Throws kInvalidArgument, naming `what` ("all_reduce on group 'dp/0' (rank 1 of 2)"),
/// for what check_comm_reduction (loom/cpp/comm_checks.h) refuses: a dtype that cannot be
/// reduced, avg on an integer dtype, an unknown op.
/// \param dtype  element type of the tensors
/// \param op     the reduction
/// \param what   the operation and group, for the message
ReduceFn reduce_function(DType dtype, ReduceOp op, const std::string& what);

/// data[i] *= factor for a floating dtype (bf16/f16 in f32, rounded to nearest even; f32
/// multiplies by the factor rounded to f32).
/// \param data    n elements of `dtype`
/// \param dtype   f32, f64, bf16 or f16
/// \param n       element count
/// \param factor  the multiplier (1/size for avg)
void scale(void* data, DType dtype, size_t n, double factor);

}  // namespace loom::comm_gloo
