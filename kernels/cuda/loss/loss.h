// The loss family of the CUDA kernel library: cross entropy on CUDA tensors in f32, bf16 and
// f16, whole (cross_entropy_fwd / cross_entropy_bwd) and vocab-parallel
// (cross_entropy_shard_stats / cross_entropy_combine), with out-of-range labels found on the
// device and reported lazily (label_errors.cuh), and masked_sum (f32).
//
// Plain C++ (no CUDA types): the kernels_cuda plugin and the tests include it without nvcc.
#pragma once

#include <loom/kernel.h>

#include <string>
#include <vector>

namespace loom::kernels::cuda {

/// Appends a KernelDesc for every op and dtype of the family: name "cuda", priority 20
/// (kernels/cuda/common/registration.h). Each has `supports` (shapes, dtypes and attributes
/// only, never throws) and `cost`. The kernels launch on the current device, which must be
/// the device of the call's tensors, on the call's stream; none of them synchronises the
/// device.
/// \param out  the list to append to
void add_loss_kernels(std::vector<KernelDesc>& out);

/// Out-of-range labels of the cross-entropy kernels are found on the device, so the call
/// that met them cannot fail; the next cross-entropy call on that device does, with
/// kOutOfRange (kernels/cuda/loss/label_errors.cuh). This returns the message of such an
/// error that no call has reported yet, and clears it, or "" when there is none. Call it
/// after synchronising (a device runtime's `synchronize`, a test) to report the error at
/// once; errors of work still running are not seen.
std::string take_label_error();

}  // namespace loom::kernels::cuda
