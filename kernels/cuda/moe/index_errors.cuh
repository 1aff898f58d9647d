// Indices out of range in the moe ops, found on the device and reported without a host sync
// (the scheme of the cross-entropy labels, kernels/cuda/loss/label_errors.cuh).
//
// The indices (moe_topk_bwd's expert ids, moe_permute's src rows, the slot_rows and
// row_slots of the unpermutations) live in device memory; checking them on the host would
// cost a sync per call. So each kernel checks an index where it reads it: a bad one never
// addresses memory (it counts as a dropped choice: a zero row, no term), and the first one
// of the device is recorded:
//   - a device word `claim` (0: none), taken by atomicCAS so that one thread records;
//   - that thread writes the op, position, value and valid range into a record in mapped
//     pinned host memory, then, after __threadfence_system, its `set` flag.
// Every later call of these ops on the device first looks at the record (a host memory
// read) and, when it is set, fails with Error(kOutOfRange) and clears it;
// take_moe_index_error (moe.h) reports it after a sync (a device runtime's `synchronize`,
// a test).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <string>

namespace loom::kernels::cuda::moe {

/// The index tensors that are checked (index into the names of index_errors.cu).
enum class IndexOp : int32_t {
  kTopkBwdExperts = 0,        // moe_topk_bwd experts (N, K), valid [0, E); index: the row
  kPermuteSrc = 1,            // moe_permute src (M), valid [0, N)
  kUnpermuteSlotRows = 2,     // moe_unpermute slot_rows (N, K) flat, valid [-1, M)
  kUnpermuteBwdSlotRows = 3,  // moe_unpermute_bwd slot_rows (N, K) flat, valid [-1, M)
  kUnpermuteBwdRowSlots = 4,  // moe_unpermute_bwd row_slots (M), valid [-1, N * K)
};

/// What the device writes, in mapped pinned host memory.
struct IndexErrorRecord {
  int32_t set;  // written last
  int32_t op;
  int32_t value;
  int32_t unused;
  int64_t index;  // where, as the CPU kernels' messages say it (kernels/cpu/moe_*.cc)
  int64_t bound;  // the exclusive upper end of the valid range
};

/// Device pointers the kernels report through.
struct IndexErrorSink {
  unsigned int* claim;       // device memory
  IndexErrorRecord* record;  // mapped host memory (UVA: the host address)
};

/// Records the first out-of-range index of the device (cheap when another one already did).
/// The first to claim wins: with several bad indices it may not be the lowest one, which
/// the CPU kernels name.
__device__ __forceinline__ void report_index_error(IndexErrorSink sink, IndexOp op, int64_t index,
                                                   int32_t value, int64_t bound) {
  if (atomicCAS(sink.claim, 0u, 1u) != 0u) return;
  volatile IndexErrorRecord* r = sink.record;
  r->op = static_cast<int32_t>(op);
  r->value = value;
  r->index = index;
  r->bound = bound;
  __threadfence_system();
  r->set = 1;
}

/// The sink of `device` (the current device), created on first use. Before handing it out,
/// throws Error(kOutOfRange) for an index error that earlier work on the device recorded,
/// and re-arms the claim on `stream`.
IndexErrorSink index_error_sink(int device, cudaStream_t stream);

}  // namespace loom::kernels::cuda::moe
