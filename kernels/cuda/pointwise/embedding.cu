// embedding_fwd: Y[n] = table[ids[n]]; embedding_bwd: dtable[ids[n]] += dY[n] (loom/ops.h),
// optionally as one vocab-parallel shard (EmbeddingAttrs: rows [start, start + V) of a
// vocabulary of vocab_size; another shard's id gives a zero row / adds nothing).
//
// Launch: 2-D blocks of 256 threads, threadIdx.x across a row's chunks of 4 elements (a
// power of two in [32, 256] that leaves about 4 chunks per thread), threadIdx.y over rows;
// the grid strides over the rows with 64-bit offsets. A chunk is one vector access when C
// is a multiple of 4 and the tensors are aligned.
//
// Backward adds with atomics (one 16-byte red.global.add.v4.f32 per chunk on sm_90 when
// aligned): repeated ids in a batch add into the same dtable row in whatever order the rows
// run, so the low bits of such rows may differ from run to run (the CPU sums in id order).
// A deterministic order needs the ids sorted (or one owner per column scanning every id,
// which leaves the GPU mostly idle); embedding gradients are summed over a whole batch and
// then over data-parallel ranks anyway, so the rounding order is not worth a sort.
//
// Ids outside [0, vocab): no kernel ever dereferences such an id (the row is zero in forward
// and skipped in backward), and the call must fail with kOutOfRange. The ids live in GPU
// memory, so the host could only check them after waiting for the GPU, which would stall the
// launch queue at every step. Instead the kernel validates them on the device and records the
// first offending (index, id) of the first failing call in a small persistent device record
// (IdErrorRecord, one per GPU, allocated once), and raises a flag in mapped host memory. Each
// later embedding call on that GPU reads the flag (a host memory read, no synchronisation)
// and, when it is raised, waits for the GPU, reads and clears the record and fails with the
// CPU kernels' message, marked as found by an earlier call. embedding_id_status()
// (pointwise.h) reports at once, waiting for the GPU, for tests and for the end of a run.
#include <loom/cpp/op_checks/embedding.h>

#include <atomic>
#include <mutex>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/device_util.cuh"
#include "kernels/cuda/pointwise/pointwise.h"

namespace loom::kernels::cuda::pointwise {
namespace {

// The first out-of-range id found on a GPU since the last report.
struct IdErrorRecord {
  unsigned long long key;  // (index << 32) | uint32(id), the smallest index; ~0 when none
  unsigned int owner;      // sequence number of the call that found it; 0 when none
  int bwd;                 // 1: embedding_bwd; the rest describes that call
  long long rows, start, vocab;
  int sharded;
};

constexpr IdErrorRecord kCleanRecord{~0ull, 0u, 0, 0, 0, 0, 0};

// What a call passes to its kernel for the id checks.
struct IdCheck {
  IdErrorRecord* record;  // device memory
  volatile int* flag;     // mapped host memory, raised on an error
  unsigned int seq;       // this call's sequence number (never 0)
  int bwd;
  long long rows, start, vocab;
  int sharded;
};

// Table row of ids[n] (or -1: another shard's row, or out of range, then recorded).
__device__ __forceinline__ int64_t table_row(const int32_t* ids, int64_t n, int64_t rows,
                                             const IdCheck& chk, bool report) {
  const int32_t id = ids[n];
  if (id < 0 || id >= chk.vocab) {
    if (report) {
      unsigned int prev = atomicCAS(&chk.record->owner, 0u, chk.seq);
      if (prev == 0u) {  // this call owns the record: describe it
        chk.record->bwd = chk.bwd;
        chk.record->rows = chk.rows;
        chk.record->start = chk.start;
        chk.record->vocab = chk.vocab;
        chk.record->sharded = chk.sharded;
      }
      if (prev == 0u || prev == chk.seq) {
        unsigned long long index = n < 0xffffffffll ? static_cast<unsigned long long>(n)
                                                    : 0xffffffffull;  // N >= 2^32: saturated
        atomicMin(&chk.record->key, index << 32 | static_cast<uint32_t>(id));
      }
      *chk.flag = 1;
    }
    return -1;
  }
  const int64_t r = static_cast<int64_t>(id) - chk.start;
  return r >= 0 && r < rows ? r : -1;
}

// Y (N, C) = table (V, C) rows; zero rows for ids outside the table.
__global__ void embedding_fwd_kernel(const void* table, DType tt, const int32_t* ids, void* y,
                                     DType yt, int64_t n, int64_t v, int64_t c, IdCheck chk,
                                     bool vec) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < n;
       row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t r = table_row(ids, row, v, chk, threadIdx.x == 0);
    for (int64_t j = static_cast<int64_t>(threadIdx.x) * 4; j < c; j += 4 * blockDim.x) {
      float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (r >= 0) load4(table, tt, r * c + j, (r + 1) * c, vec, e);
      store4(y, yt, row * c + j, (row + 1) * c, vec, e);
    }
  }
}

// dtable (V, C) f32 += dY (N, C) rows, by atomics.
__global__ void embedding_bwd_kernel(const void* dy, DType dyt, const int32_t* ids, float* dtable,
                                     int64_t n, int64_t v, int64_t c, IdCheck chk, bool vec) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < n;
       row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t r = table_row(ids, row, v, chk, threadIdx.x == 0);
    if (r < 0) continue;
    for (int64_t j = static_cast<int64_t>(threadIdx.x) * 4; j < c; j += 4 * blockDim.x) {
      float g[4];
      load4(dy, dyt, row * c + j, (row + 1) * c, vec, g);
      float* dst = dtable + r * c + j;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (vec && j + 4 <= c) {
        atomicAdd(reinterpret_cast<float4*>(dst), make_float4(g[0], g[1], g[2], g[3]));
        continue;
      }
#endif
      for (int e = 0; e < 4 && j + e < c; ++e) atomicAdd(dst + e, g[e]);
    }
  }
}

// ---- The per-GPU error record --------------------------------------------------------

constexpr int kMaxDevices = 64;

struct DeviceIdState {
  IdErrorRecord* record = nullptr;  // device memory; set once, under g_mutex
  int* device_flag = nullptr;       // the flag as the device addresses it
  std::atomic<int*> flag{nullptr};  // mapped, page-locked host memory; published last
  std::atomic<unsigned int> seq{0};
};

std::mutex g_mutex;  // guards creation and reports
DeviceIdState g_states[kMaxDevices];

int current_device() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  if (device < 0 || device >= kMaxDevices)
    throw Error(Code::kUnimplemented, "embedding: CUDA device " + std::to_string(device) +
                                          " is past the " + std::to_string(kMaxDevices) +
                                          " devices the id checks keep records for");
  return device;
}

// The state of GPU `device`, created at its first use (the only allocations, once per GPU).
DeviceIdState& ensure_state(int device) {
  DeviceIdState& st = g_states[device];
  if (st.flag.load(std::memory_order_acquire) != nullptr) return st;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (st.record == nullptr) {
    void* flag = nullptr;
    cuda_check(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
               "cudaHostAlloc (embedding id error flag)");
    *static_cast<volatile int*>(flag) = 0;
    void* device_flag = nullptr;
    cuda_check(cudaHostGetDevicePointer(&device_flag, flag, 0),
               "cudaHostGetDevicePointer (embedding id error flag)");
    IdErrorRecord* record = nullptr;
    cuda_check(cudaMalloc(&record, sizeof(IdErrorRecord)), "cudaMalloc (embedding id record)");
    cuda_check(cudaMemcpy(record, &kCleanRecord, sizeof kCleanRecord, cudaMemcpyHostToDevice),
               "cudaMemcpy (embedding id record)");
    // Once per GPU: the record must be clean before a kernel on any stream sees it.
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (embedding id record)");
    st.record = record;
    st.device_flag = static_cast<int*>(device_flag);
    st.flag.store(static_cast<int*>(flag), std::memory_order_release);
  }
  return st;
}

// Fails with the error recorded on GPU `device`, if any, and clears it. Without `wait`,
// returns at once while the flag is down (no error seen yet); with it, waits for the GPU.
void report(int device, bool wait) {
  DeviceIdState& st = g_states[device];
  int* flag = st.flag.load(std::memory_order_acquire);
  if (flag == nullptr) return;  // no embedding kernel ran on this GPU
  if (!wait && *static_cast<volatile int*>(flag) == 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (embedding id check)");
  // Every kernel has finished: a flag still down means no error (the kernels raise it after
  // a system fence), and the record need not be read.
  if (*static_cast<volatile int*>(flag) == 0) return;
  IdErrorRecord rec;
  cuda_check(cudaMemcpy(&rec, st.record, sizeof rec, cudaMemcpyDeviceToHost),
             "cudaMemcpy (embedding id record)");
  *static_cast<volatile int*>(flag) = 0;
  if (rec.owner == 0u) return;  // another thread reported it already
  cuda_check(cudaMemcpy(st.record, &kCleanRecord, sizeof kCleanRecord, cudaMemcpyHostToDevice),
             "cudaMemcpy (embedding id record)");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (embedding id record)");
  op_checks::EmbShape s{rec.rows, 0, 0, rec.start, rec.vocab, rec.sharded != 0};
  int64_t index = static_cast<int64_t>(rec.key >> 32);
  int32_t id = static_cast<int32_t>(static_cast<uint32_t>(rec.key & 0xffffffffull));
  throw Error(Code::kOutOfRange,
              op_checks::out_of_range_id_message(rec.bwd ? ops::kEmbeddingBwd : ops::kEmbeddingFwd,
                                                 index, id, s) +
                  " [found on the GPU by an earlier embedding call, reported now: the CUDA "
                  "kernels check ids without waiting for the GPU]");
}

// ---- Kernels ---------------------------------------------------------------------------

void launch_embedding(const OpCall* call, const op_checks::EmbShape& s, bool bwd) {
  const char* op = bwd ? ops::kEmbeddingBwd : ops::kEmbeddingFwd;
  const int device = current_device();
  report(device, false);  // an error of an earlier call fails this one, before it runs
  if (s.n == 0) return;   // with C == 0 the ids are still checked, as on the CPU
  DeviceIdState& st = ensure_state(device);
  unsigned int seq = ++st.seq;
  if (seq == 0u) seq = ++st.seq;  // 0 means "no owner"
  IdCheck chk{st.record, st.device_flag, seq,     bwd ? 1 : 0,
              s.v,       s.start,        s.vocab, s.sharded ? 1 : 0};
  int64_t chunks = (s.c + 3) / 4;
  unsigned tx = 32;
  while (tx < 256 && tx * 4 < chunks) tx *= 2;
  dim3 block(tx, 256 / tx);
  unsigned grid =
      static_cast<unsigned>(std::clamp<int64_t>((s.n + block.y - 1) / block.y, 1, kMaxGridBlocks));
  const TensorView& rows = bwd ? call->inputs[0] : call->outputs[0];
  const TensorView& table = bwd ? call->outputs[0] : call->inputs[0];
  const int32_t* ids = static_cast<const int32_t*>(call->inputs[1].data);
  bool vec = s.c % 4 == 0 && aligned4(rows) && aligned4(table);
  if (bwd)
    embedding_bwd_kernel<<<grid, block, 0, stream_of(call)>>>(
        rows.data, rows.dtype, ids, static_cast<float*>(table.data), s.n, s.v, s.c, chk, vec);
  else
    embedding_fwd_kernel<<<grid, block, 0, stream_of(call)>>>(
        table.data, table.dtype, ids, rows.data, rows.dtype, s.n, s.v, s.c, chk, vec);
  launch_check(op);
}

op_checks::EmbShape check_fwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_embedding_fwd(c, s, d);
}
op_checks::EmbShape check_bwd(const OpCall* c, bool s, DeviceType d) {
  return op_checks::check_embedding_bwd(c, s, d);
}

Status embedding_fwd(const OpCall* call) {
  return guard([&] { launch_embedding(call, check_fwd(call, false, DeviceType::kCuda), false); });
}

Status embedding_bwd(const OpCall* call) {
  return guard([&] { launch_embedding(call, check_bwd(call, false, DeviceType::kCuda), true); });
}

LOOM_CUDA_HOOKS(embedding_fwd, check_fwd, 0)
LOOM_CUDA_HOOKS(embedding_bwd, check_bwd, 1)

}  // namespace

void add_embedding_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kEmbeddingFwd, embedding_fwd, embedding_fwd_supports,
                   embedding_fwd_cost);
  add_cuda_kernels(out, ops::kEmbeddingBwd, embedding_bwd, embedding_bwd_supports,
                   embedding_bwd_cost);
}

}  // namespace loom::kernels::cuda::pointwise

namespace loom::kernels::cuda {

Status embedding_id_status() noexcept {
  return guard([] { pointwise::report(pointwise::current_device(), true); });
}

}  // namespace loom::kernels::cuda
