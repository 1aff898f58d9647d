// The tensor-core primitives of the in-register 3xTF32 GEMM (tf32x3_mma.cuh) as inline PTX:
// cp.async of 16 or 4 bytes (global to shared, zero-filled when invalid), its commit groups
// and their waits, and mma.sync
// m16n8k8 on TF32 operands with f32 accumulation. The emulation test replaces this file with
// tests/kernels/cuda/gemm_emulation/kernels/cuda/gemm/tf32_mma.cuh, which implements the
// same from the PTX ISA's fragment layouts on the CPU.
#pragma once

#include <stdint.h>

namespace loom::kernels::cuda::gemm {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared (both 16-byte aligned), bypassing L1; zeros when !valid (src is
// then not read, but must still be a valid address).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}

// 4 bytes global -> shared; zeros when !valid (as cp_async_16).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most the newest N commit groups of this thread's cp.async are in flight
// (the block's barrier must follow before other threads read what it copied); copies not
// yet committed are not waited for.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// c (16 x 8) += a (16 x 8, row) . b (8 x 8, col) on TF32 operands, f32 accumulation. The
// operands are f32 bit patterns; the tensor cores read their TF32 part (sign, exponent and the
// top 10 mantissa bits). Fragments, with g = lane / 4 and t = lane % 4:
//   a[0] = (g, t), a[1] = (g + 8, t), a[2] = (g, t + 4), a[3] = (g + 8, t + 4)   (row, k)
//   b0 = (t, g), b1 = (t + 4, g)                                                  (k, column)
//   c[0] = (g, 2t), c[1] = (g, 2t + 1), c[2] = (g + 8, 2t), c[3] = (g + 8, 2t + 1)
__device__ __forceinline__ void mma_1688_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace loom::kernels::cuda::gemm
