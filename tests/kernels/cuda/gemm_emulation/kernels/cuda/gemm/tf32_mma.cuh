// Emulated tensor-core primitives: replaces kernels/cuda/gemm/tf32_mma.cuh (inline PTX) in
// the emulation test, implementing cp.async (16 and 4 bytes; immediate, or deferred to the
// wait of their commit group as emu::g_deferred_cp says) and mma.sync m16n8k8 on TF32
// operands from the PTX ISA's fragment layouts. The tensor cores' view of an f32 operand is
// emu_tf32_mode's (truncated or rounded to nearest even: the hardware's is not documented);
// products are exact. How an mma adds its eight products to the accumulator is emu_tc_sum's:
// by default as the tensor cores are measured to add them (Fasi et al., "Numerical behavior of
// NVIDIA tensor cores", PeerJ CS 2021, on the A100; the H200 runs of 2026-11-29 agree, see
// BENCHMARKS.md): the nine addends aligned to the largest one's exponent with a few bits
// below f32's 24, the bits beyond truncated, summed exactly, and the sum truncated to f32
// (toward zero: a bias of up to one unit of the accumulator's last place per mma, which a
// long chain of mma on one accumulator adds up); or, for comparison, summed in f32 and then
// rounded into the accumulator.
#pragma once
// mma_main.cc checks that this file, not the inline-PTX one, was included.
#define LOOM_TF32_MMA_EMULATED 1
#include <stdint.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

namespace loom::kernels::cuda::gemm {

// How the emulated tensor cores read an f32 operand as TF32.
enum class EmuTf32 { kTruncate, kNearest };
inline EmuTf32 emu_tf32_mode = EmuTf32::kTruncate;
// How the emulated tensor cores add an mma's products to its accumulator.
enum class EmuTcSum { kTruncated, kRoundedF32 };
inline EmuTcSum emu_tc_sum_mode = EmuTcSum::kTruncated;
// Bits kept below f32's 24 when kTruncated aligns the addends (an assumption: the published
// models of the A100 and H100 differ in such details; the truncation of the sum is what
// dominates the error).
inline int emu_tc_align_bits = 3;
// mma calls so far (the test checks that the kernel ran on the tensor-core path).
inline long emu_mma_count = 0;

inline void emu_cp_async(void* smem, const void* gmem, bool valid, int bytes) {
  if (emu::g_deferred_cp) {
    emu::g_cur->pending.push_back({smem, gmem, valid, bytes, emu::g_cur->committed});
    return;
  }
  if (valid)
    std::memcpy(smem, gmem, static_cast<size_t>(bytes));
  else
    std::memset(smem, 0, static_cast<size_t>(bytes));
}
inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  emu_cp_async(smem, gmem, valid, 16);
}
inline void cp_async_4(void* smem, const void* gmem, bool valid) {
  emu_cp_async(smem, gmem, valid, 4);
}
inline void cp_async_commit() { ++emu::g_cur->committed; }
// Lands this fiber's copies of every commit group but the newest `newest` ones (copies after
// the last commit belong to no group yet and stay pending too, as on the GPU).
inline void emu_cp_async_wait(int newest) {
  auto& q = emu::g_cur->pending;
  const int limit = emu::g_cur->committed - newest;  // groups [0, limit) must have landed
  size_t kept = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i].group < limit) {
      if (q[i].valid)
        std::memcpy(q[i].dst, q[i].src, static_cast<size_t>(q[i].bytes));
      else
        std::memset(q[i].dst, 0, static_cast<size_t>(q[i].bytes));
    } else {
      q[kept++] = q[i];
    }
  }
  q.resize(kept);
}
template <int N>
inline void cp_async_wait_group() {
  emu_cp_async_wait(N);
}

inline float emu_tf32(uint32_t u) {
  if ((u & 0x7f800000u) != 0x7f800000u && emu_tf32_mode == EmuTf32::kNearest)
    u += 0xfffu + ((u >> 13) & 1u);
  if ((u & 0x7f800000u) != 0x7f800000u) u &= 0xffffe000u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// c + the eight products (exact in double: 11-bit significands) as kTruncated adds them.
inline float emu_tc_sum(float c, const double (&prod)[8]) {
  double terms[9] = {c};
  for (int k = 0; k < 8; ++k) terms[k + 1] = prod[k];
  int emax = INT_MIN;
  double plain = 0.0;
  for (double v : terms) {
    plain += v;
    if (v != 0.0 && std::isfinite(v)) emax = std::max(emax, std::ilogb(v));
  }
  if (!std::isfinite(plain) || emax == INT_MIN) return static_cast<float>(plain);
  // Every addend to a multiple of q, toward zero; their sum is exact (under 2^53 units of q).
  const double q = std::ldexp(1.0, emax - 23 - emu_tc_align_bits);
  double sum = 0.0;
  for (double v : terms) sum += std::trunc(v / q) * q;
  if (sum == 0.0) return 0.0f;
  const double ulp = std::ldexp(1.0, std::ilogb(sum) - 23);
  return static_cast<float>(std::trunc(sum / ulp) * ulp);
}

inline void mma_1688_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::Slot& me = emu::my_slot();
  for (int i = 0; i < 4; ++i) me.a[i] = a[i];
  me.b[0] = b0, me.b[1] = b1;
  emu::warp_barrier();
  float A[16][8], B[8][8];
  for (int l = 0; l < 32; ++l) {
    const emu::Slot& s = emu::slot(l);
    const int g = l / 4, t = l % 4;
    A[g][t] = emu_tf32(s.a[0]);
    A[g + 8][t] = emu_tf32(s.a[1]);
    A[g][t + 4] = emu_tf32(s.a[2]);
    A[g + 8][t + 4] = emu_tf32(s.a[3]);
    B[t][g] = emu_tf32(s.b[0]);
    B[t + 4][g] = emu_tf32(s.b[1]);
  }
  const int lane = emu::lane_of(), g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    if (emu_tc_sum_mode == EmuTcSum::kTruncated) {
      double prod[8];
      for (int k = 0; k < 8; ++k) prod[k] = static_cast<double>(A[row][k]) * B[k][col];
      c[e] = emu_tc_sum(c[e], prod);
    } else {
      float sum = 0.0f;
      for (int k = 0; k < 8; ++k) sum += A[row][k] * B[k][col];
      c[e] += sum;
    }
  }
  if (lane == 0) ++emu_mma_count;
  emu::warp_barrier();
}

}  // namespace loom::kernels::cuda::gemm
