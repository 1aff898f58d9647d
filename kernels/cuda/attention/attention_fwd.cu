// attention_fwd on tensor cores (bf16 / f16, D in {64, 128}): FlashAttention-2 forward.
//
// Launch geometry: one block of kWarps warps per (query tile of kBr = 16 kWarps rows, b, h),
// flattened into blockIdx.x with the query tile slowest and numbered from the last tile
// down, so that under the causal mask the longest blocks start first. Warp w owns query
// rows [16 w, 16 w + 16) of the tile and keeps them in registers throughout: its Q
// fragments, its (16, D) f32 output accumulator and its running max / sum.
//
// Loop over key tiles of kBc keys [0, n_end), n_end cutting off the tiles that the causal
// mask hides from every row of the block. K and V tiles are double-buffered in shared memory
// (cp.async of tile j + 1 overlaps the math of tile j). Per tile and warp:
//   S = Q K^T (16, kBc) by mma.sync m16n8k16, f32 accumulators in registers;
//   mask (only on tiles that cross the causal diagonal, the end of the keys, or with segment
//   ids), online softmax in the log2 domain (row max / sum over the quad of lanes that
//   share a row), rescale of the output accumulator;
//   dropout on the probabilities (Philox, index ((b H + h) T + t) S + s, the reference's);
//   O += P V with P converted to 16-bit in registers (C fragments reused as A fragments).
// The row sum l is accumulated before dropout, so O = sum(P keep V) / (1 - p) / l, as the
// reference computes. Output: O = acc / l, lse = (m + log2 l) ln 2; a row that sees no key
// gets O = 0 and lse = -inf.
//
// Shared memory: Q (kBr, D + 8), K and V (2, kBc, D + 8), rows padded by 16 bytes so that
// the 8 row addresses of an ldmatrix fall in distinct bank groups. D = 128: 86 KB (needs the
// raised dynamic limit), D = 64: 46 KB. ptxas (sm_90a, CUDA 13.0): 157 (D = 64) and 220
// (D = 128) registers, no spills.
//
// Expected bottleneck (for tuning): with kBr = 64 every key tile is read from L2 by T / 64
// blocks per head and the softmax between the two matmuls stalls the tensor cores (mma.sync
// issues synchronously); the next steps are kBr = 128 with 8 warps, sharing a K/V tile
// between the H / G query heads of a group, and wgmma with a producer warp (sm_90a).
#include "kernels/cuda/attention/attention_fwd_kernel.cuh"
#include "kernels/cuda/attention/attention_params.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/resources.cuh"

namespace loom::kernels::cuda {
namespace {

using namespace attn;

template <class T, int D, int kWarps, int kBc>
void launch_fwd(const AttentionParams& p, cudaStream_t stream) {
  using Tile = FwdTile<D, kWarps, kBc>;
  const int64_t blocks = (p.t + Tile::kBr - 1) / Tile::kBr * p.b * p.h;
  if (blocks == 0) return;
  const size_t smem = Tile::template smem_bytes<T>();
  auto kernel = attention_fwd_tc_kernel<T, D, kWarps, kBc>;
  allow_dynamic_smem(kernel, smem, "attention_fwd");
  kernel<<<static_cast<unsigned>(blocks), Tile::kThreads, smem, stream>>>(p);
  launch_check("attention_fwd");
}

template <class T>
void launch_fwd_dtype(const AttentionParams& p, cudaStream_t stream) {
  // (kWarps, kBc): 64 query rows by 64 keys per step for both head dims.
  if (p.d == 64)
    launch_fwd<T, 64, 4, 64>(p, stream);
  else
    launch_fwd<T, 128, 4, 64>(p, stream);
}

}  // namespace

void launch_attention_fwd_tc(const AttentionParams& p, DType dt, cudaStream_t stream) {
  if (dt == DType::kBF16)
    launch_fwd_dtype<__nv_bfloat16>(p, stream);
  else
    launch_fwd_dtype<__half>(p, stream);
}

}  // namespace loom::kernels::cuda
