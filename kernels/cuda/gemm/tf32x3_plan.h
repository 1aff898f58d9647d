// The chunks of the 3xTF32 GEMM (tf32x3.cuh explains the method and the layout): how much of
// K the split operands of one chunk may hold in a workspace. Plain C++ (no CUDA types): the
// kernels' workspace functions and the tests use it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::kernels::cuda::gemm {

// How a 3xTF32 call runs: the split in registers, inside one GEMM kernel of loom's own
// (tf32x3_mma.cuh: no workspace), or the split written to memory and summed by cuBLASLt's TF32
// GEMMs (tf32x3.cuh: `segments` says in which form). kAuto: as LOOM_TF32X3 says, or the
// default (gemm_tf32x3.cu's with_form).
enum class Tf32x3Form { kAuto, kInRegisters, kSplit };

// A gemm in the split's terms: Y (batch, M, N) = op(A) (batch, M, K) op(B) ((batch,) K, N).
struct Tf32x3Shape {
  int64_t batch = 1;  // Y matrices
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;  // A stored (K, M) per batch
  bool trans_b = false;  // B stored (N, K) (else (K, N))
  bool shared_b = true;  // one B for every batch index
  Tf32x3Form form = Tf32x3Form::kAuto;
  // The split form's: 2: A2 = [A_hi | A_lo], B2 = [B_lo | B_hi] and two matmuls; 3: A2 =
  // [A_hi | A_lo | A_hi], B2 = [B_lo | B_hi | B_hi] and one (tf32x3.cuh); 0: as
  // tf32x3_segments chooses (or LOOM_TF32X3 forces). The plan functions below take 2 or 3.
  int segments = 0;
};

struct Tf32x3Chunk {
  int64_t k0, kc, kp;  // columns [k0, k0 + kc) of K, padded to kp (a multiple of 4)
};

struct Tf32x3Plan {
  int64_t rows_a = 0, rows_b = 0;   // rows of A2 (batch * M) and B2 (N, or batch * N)
  int64_t kp_max = 0;               // the widest chunk's kp
  std::vector<Tf32x3Chunk> chunks;  // empty when K == 0, or when even 4 columns do not fit
  // Bytes of the widest chunk's A2 and B2 (B2 starts at b2_offset, 256-byte aligned).
  size_t b2_offset = 0, bytes = 0;
};

inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// The workspace bytes of chunks kp columns wide for `s`: A2 at 0, B2 at a 256-byte boundary,
// each row s.segments * kp floats.
inline size_t tf32x3_chunk_bytes(const Tf32x3Shape& s, int64_t kp, size_t* b2_offset = nullptr) {
  const int64_t rows_a = s.batch * s.m, rows_b = (s.shared_b ? 1 : s.batch) * s.n;
  const size_t off = static_cast<size_t>(round_up(rows_a * s.segments * kp * 4, 256));
  if (b2_offset != nullptr) *b2_offset = off;
  return off + static_cast<size_t>(rows_b * s.segments * kp * 4);
}

// Bytes a matmul launch is taken to cost (about 4 us of a small kernel's start and tail at
// ~3 TB/s): an estimate, not measured; LOOM_TF32X3 forces either form to measure them.
inline constexpr double kTf32x3LaunchBytes = 12e6;

// The form of a call: 3 segments (one matmul) when writing the third segment of every row of
// A2 and B2 costs less than what the second matmul costs (reading and writing Y once more,
// and a launch); else 2. `force` 2 or 3 overrides (0: choose).
inline int tf32x3_segments(const Tf32x3Shape& s, int force = 0) {
  if (force == 2 || force == 3) return force;
  const double rows = static_cast<double>(s.batch * s.m + (s.shared_b ? 1 : s.batch) * s.n);
  const double third = rows * static_cast<double>(s.k) * 4.0;
  const double second_matmul = static_cast<double>(s.batch * s.m * s.n) * 8.0 + kTf32x3LaunchBytes;
  return third < second_matmul ? 3 : 2;
}

// Chunks of K that fit `capacity` bytes: as few as fit, of near-equal width (a multiple of 4
// columns, the last one the rest).
inline Tf32x3Plan plan_tf32x3(const Tf32x3Shape& s, size_t capacity) {
  Tf32x3Plan plan;
  plan.rows_a = s.batch * s.m;
  plan.rows_b = (s.shared_b ? 1 : s.batch) * s.n;
  if (s.k <= 0) return plan;
  // The widest kp that fits, a multiple of 4 and at most K rounded up.
  const int64_t k4 = round_up(s.k, 4);
  int64_t fit = 0;
  if (tf32x3_chunk_bytes(s, k4) <= capacity) {
    fit = k4;
  } else {
    int64_t step = 4;
    while (step * 2 <= k4) step *= 2;
    for (; step >= 4; step /= 2)
      if (fit + step <= k4 && tf32x3_chunk_bytes(s, fit + step) <= capacity) fit += step;
  }
  if (fit < 4) return plan;
  const int64_t count = (k4 + fit - 1) / fit;
  const int64_t width = round_up((s.k + count - 1) / count, 4);
  for (int64_t k0 = 0; k0 < s.k; k0 += width) {
    const int64_t kc = s.k - k0 < width ? s.k - k0 : width;
    plan.chunks.push_back({k0, kc, round_up(kc, 4)});
    if (plan.chunks.back().kp > plan.kp_max) plan.kp_max = plan.chunks.back().kp;
  }
  plan.bytes = tf32x3_chunk_bytes(s, plan.kp_max, &plan.b2_offset);
  return plan;
}

// ---- The in-register form (tf32x3_mma.cuh) ------------------------------------------------

// What the in-register form applies to each element of Y after alpha, beta and the bias:
// nothing, GELU (gemm_epilogue's kEpilogueGelu: P = the element, Y = gelu(P), P kept in
// `aux` when given), or GELU's derivative (kEpilogueDGelu: Y = gelu'(P) times the element,
// P read from `p`). `aux` and `p` are laid out as Y (batch, M, N).
struct Tf32x3Activation {
  enum Kind { kNone, kGelu, kDGelu };
  Kind kind = kNone;
  bool tanh = false;         // GELU's tanh form (else erf's)
  float* aux = nullptr;      // kGelu: where P goes, or null
  const float* p = nullptr;  // kDGelu: P
};

// Its two block tiles (M x N of Y), its columns of K per stage, and the least K a range of a
// split contraction gets.
inline constexpr int64_t kTf32x3LargeTileM = 128, kTf32x3LargeTileN = 64;
inline constexpr int64_t kTf32x3SmallTileM = 64, kTf32x3SmallTileN = 32;
inline constexpr int64_t kTf32x3TileK = 16;
inline constexpr int64_t kTf32x3MinSplitK = 256;

// One launch geometry of the in-register form.
struct Tf32x3MmaPlan {
  bool large = true;    // 128 x 64 tiles, else 64 x 32
  int64_t tiles = 0;    // blocks over one Y matrix (one range of K)
  int64_t splits = 1;   // ranges of K; > 1: partial sums, then a second kernel adds them
  int64_t k_split = 0;  // columns of K per range (a multiple of kTf32x3TileK; the last the rest)
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The geometry of a call over `batch` Y matrices (M, N), contracting over K (> 0), on a GPU of
// `sm_count` multiprocessors, with `partial_capacity` bytes for partial sums:
//  - the large tiles when they alone give every multiprocessor a block, else the small ones;
//  - when even those leave multiprocessors idle and K is long, K in ranges of at least
//    kTf32x3MinSplitK columns (as many as fill the GPU once and whose partial sums, splits x
//    batch x M x N floats, fit the capacity).
// The ranges change the order of the sums (a result's bits depend on the plan, which depends on
// the GPU); the tile size does not (each Y element is summed in the same order in both).
inline Tf32x3MmaPlan plan_tf32x3_mma(int64_t batch, int64_t m, int64_t n, int64_t k, int sm_count,
                                     size_t partial_capacity) {
  Tf32x3MmaPlan plan;
  plan.k_split = round_up(k, kTf32x3TileK);
  plan.tiles = ceil_div(m, kTf32x3LargeTileM) * ceil_div(n, kTf32x3LargeTileN);
  if (batch * plan.tiles >= sm_count) return plan;
  plan.large = false;
  plan.tiles = ceil_div(m, kTf32x3SmallTileM) * ceil_div(n, kTf32x3SmallTileN);
  const int64_t blocks = batch * plan.tiles;
  if (blocks >= sm_count) return plan;
  int64_t splits = ceil_div(sm_count, blocks);
  splits = std::min(splits, k / kTf32x3MinSplitK);
  const double partial = 4.0 * static_cast<double>(batch * m * n);
  splits = std::min(splits, static_cast<int64_t>(static_cast<double>(partial_capacity) / partial));
  if (splits <= 1) return plan;
  plan.k_split = round_up(ceil_div(k, splits), kTf32x3TileK);
  plan.splits = ceil_div(k, plan.k_split);
  return plan;
}

}  // namespace loom::kernels::cuda::gemm
