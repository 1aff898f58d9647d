// Labels outside the vocabulary, found on the device and reported without a host sync.
//
// The CPU kernels read the labels before computing and throw kOutOfRange. A CUDA kernel
// cannot throw, and reading the labels on the host would cost a device sync on every call.
// So the row kernels check each label where they read it: an out-of-range label whose mask
// is not 0 never indexes the logits (its row's loss is NaN in the forward, and its one-hot
// term is dropped in the backward), and the first such label of the device is recorded:
//   - a device word `claim` (0: none), taken by atomicCAS so that one thread records;
//   - that thread writes the op, row, label and vocabulary into a record in mapped pinned
//     host memory, then, after __threadfence_system, its `set` flag.
// The host reads the record without synchronising: every later call of a cross-entropy op
// on the device first looks at it and, when set, fails with Error(kOutOfRange) and the
// CPU's message (plus where it was found), and clears it. The error thus surfaces one call
// (or, while the faulty kernel is still running, a few calls) late, always before the
// optimizer's next synchronising read of the loss; `take_label_error` (loss.h) lets a
// device runtime's `synchronize` report it too.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <string>

namespace loom::kernels::cuda::loss {

/// The ops that check labels (index into the names of label_errors.cu).
enum class LabelOp : int32_t { kFwd = 0, kBwd = 1, kShardStats = 2, kCombine = 3, kFwdBwd = 4 };

/// What the device writes, in mapped pinned host memory.
struct LabelErrorRecord {
  int32_t set;  // written last
  int32_t op;
  int32_t label;
  int32_t unused;
  int64_t row;
  int64_t vocab;
};

/// Device pointers the kernels report through.
struct LabelErrorSink {
  unsigned int* claim;       // device memory
  LabelErrorRecord* record;  // mapped host memory (UVA: the host address)
};

/// Records the first out-of-range label of the device (cheap when another one already did).
__device__ __forceinline__ void report_label_error(LabelErrorSink sink, LabelOp op, int64_t row,
                                                   int32_t label, int64_t vocab) {
  if (atomicCAS(sink.claim, 0u, 1u) != 0u) return;
  volatile LabelErrorRecord* r = sink.record;
  r->op = static_cast<int32_t>(op);
  r->label = label;
  r->row = row;
  r->vocab = vocab;
  __threadfence_system();
  r->set = 1;
}

/// The sink of `device` (the current device), created on first use. Before handing it out,
/// throws Error(kOutOfRange) for a label error that earlier work on the device recorded,
/// and re-arms the claim on `stream`.
LabelErrorSink label_error_sink(int device, cudaStream_t stream);

/// The message of a recorded error of `device`, cleared, or "" (see loss.h).
std::string take_label_error_of(int device);

}  // namespace loom::kernels::cuda::loss
