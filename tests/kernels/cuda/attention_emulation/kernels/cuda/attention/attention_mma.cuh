// Emulated tensor-core primitives: replaces kernels/cuda/attention/attention_mma.cuh (inline
// PTX) in the emulation test, implementing cp.async, ldmatrix(.trans) and mma.sync m16n8k16
// from the fragment layouts of the PTX ISA (the f32 products are exact sums of 16 terms).
#pragma once
// emu_main.cc checks that this file, not the inline-PTX one, was included.
#define LOOM_ATTENTION_MMA_EMULATED 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace loom::kernels::cuda::attn {

inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  if (emu::g_deferred_cp) {
    emu::g_cur->pending.push_back({smem, gmem, valid});
    return;
  }
  if (valid)
    memcpy(smem, gmem, 16);
  else
    memset(smem, 0, 16);
}
inline void cp_async_commit() {}
inline void cp_async_wait_all() {
  for (auto& q : emu::g_cur->pending) {
    if (q.valid)
      memcpy(q.dst, q.src, 16);
    else
      memset(q.dst, 0, 16);
  }
  emu::g_cur->pending.clear();
}

inline uint16_t ld16(const void* base, int elem) {
  return static_cast<const uint16_t*>(base)[elem];
}

// Matrix i's rows come from the addresses of lanes 8i..8i+7.
inline void ldmatrix_impl(uint32_t (&r)[4], const void* smem, bool trans) {
  emu::my_slot().ptr = smem;
  emu::warp_barrier();
  int lane = emu::lane_of();
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      const void* row = emu::slot(8 * i + lane / 4).ptr;
      lo = ld16(row, 2 * (lane % 4));
      hi = ld16(row, 2 * (lane % 4) + 1);
    } else {
      lo = ld16(emu::slot(8 * i + 2 * (lane % 4)).ptr, lane / 4);
      hi = ld16(emu::slot(8 * i + 2 * (lane % 4) + 1).ptr, lane / 4);
    }
    r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  emu::warp_barrier();
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { ldmatrix_impl(r, smem, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) { ldmatrix_impl(r, smem, true); }

template <class T>
float bits_to_f32(uint16_t b);
template <>
inline float bits_to_f32<__nv_bfloat16>(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
template <>
inline float bits_to_f32<__half>(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}

template <class T>
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::Slot& me = emu::my_slot();
  for (int i = 0; i < 4; ++i) me.a[i] = a[i];
  me.b[0] = b0, me.b[1] = b1;
  emu::warp_barrier();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const emu::Slot& s = emu::slot(l);
    int gid = l / 4, tig = l % 4;
    auto el = [](uint32_t reg, int half) {
      return static_cast<uint16_t>(half ? reg >> 16 : reg & 0xffff);
    };
    for (int h = 0; h < 2; ++h) {
      A[gid][2 * tig + h] = bits_to_f32<T>(el(s.a[0], h));
      A[gid + 8][2 * tig + h] = bits_to_f32<T>(el(s.a[1], h));
      A[gid][8 + 2 * tig + h] = bits_to_f32<T>(el(s.a[2], h));
      A[gid + 8][8 + 2 * tig + h] = bits_to_f32<T>(el(s.a[3], h));
      B[2 * tig + h][gid] = bits_to_f32<T>(el(s.b[0], h));
      B[8 + 2 * tig + h][gid] = bits_to_f32<T>(el(s.b[1], h));
    }
  }
  int lane = emu::lane_of(), gid = lane / 4, tig = lane % 4;
  for (int e = 0; e < 4; ++e) {
    int row = gid + (e >= 2 ? 8 : 0), col = 2 * tig + (e & 1);
    float acc = 0.0f;
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    c[e] += acc;
  }
  emu::warp_barrier();
}

}  // namespace loom::kernels::cuda::attn
