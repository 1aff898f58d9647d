// Emulation prelude (g++ -include): lets CUDA kernel headers compile as host C++ and
// runs each CUDA thread of a block as a fiber (ucontext). Fibers switch only at barriers;
// warp collectives (shuffles, ldmatrix, mma) meet through per-lane slots between two warp
// barriers. The CUDA headers come first, before threadIdx & co. become macros.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <ucontext.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#define __launch_bounds__(...)

namespace emu {
struct Barrier {
  int arrived = 0;
  int gen = 0;
};
struct Pending {
  void* dst;
  const void* src;
  bool valid;
  int bytes = 16;  // a cp.async's size
  int group = 0;   // the commit group it joins (the fiber's commits before it)
};
struct Fiber {
  ucontext_t ctx;
  uint3 tidx, bidx;
  bool done = false;
  std::vector<Pending> pending;
  int committed = 0;  // cp.async.commit_group calls so far
};
inline Fiber* g_cur = nullptr;
inline ucontext_t g_sched;
inline uint3 g_block_dim, g_grid_dim;
inline Barrier g_block_bar;
inline std::vector<Barrier> g_warp_bar;
inline int g_live = 0;
inline bool g_deferred_cp = false;
inline long g_progress = 0;
// Per-warp exchange slots for collectives.
struct Slot {
  const void* ptr;
  uint32_t a[4];
  uint32_t b[2];
  float f;
};
inline std::vector<Slot> g_slots;  // [warp * 32 + lane]

// A stored value of a kernel's dtype as f32, and f32 rounded to nearest into one: the
// emulation tests' conversions of their inputs and results.
template <class T>
float to_f(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return __half2float(v);
}
template <class T>
T from_f(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return __float2half_rn(v);
}

inline void yield() { swapcontext(&g_cur->ctx, &g_sched); }
inline int warp_of() { return g_cur->tidx.x / 32; }
inline int lane_of() { return g_cur->tidx.x % 32; }
inline void wait(Barrier& b, int count) {
  int gen = b.gen;
  g_progress++;
  if (++b.arrived == count) {
    b.arrived = 0;
    b.gen++;
    return;
  }
  while (b.gen == gen) yield();
}
inline void warp_barrier() { wait(g_warp_bar[warp_of()], 32); }
inline Slot& my_slot() { return g_slots[g_cur->tidx.x]; }
inline Slot& slot(int lane) { return g_slots[warp_of() * 32 + lane]; }
}  // namespace emu

#define threadIdx (::emu::g_cur->tidx)
#define blockIdx (::emu::g_cur->bidx)
#define blockDim (::emu::g_block_dim)
#define gridDim (::emu::g_grid_dim)

inline void __syncthreads() { emu::wait(emu::g_block_bar, emu::g_live); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barrier(); }
inline float __shfl_xor_sync(unsigned, float x, int m) {
  emu::my_slot().f = x;
  emu::warp_barrier();
  float r = emu::slot(emu::lane_of() ^ m).f;
  emu::warp_barrier();
  return r;
}
// CUDA's device overloads of max and isnan (kernels/cuda/common/amax.cuh and the fp8 kernels).
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
using std::isnan;
inline unsigned __reduce_max_sync(unsigned, unsigned x) {
  emu::my_slot().a[0] = x;
  emu::warp_barrier();
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r = r > emu::slot(l).a[0] ? r : emu::slot(l).a[0];
  emu::warp_barrier();
  return r;
}
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// One block runs at a time and fibers switch only at barriers: every atomic is uncontended.
inline unsigned atomicCAS(unsigned* p, unsigned compare, unsigned value) {
  const unsigned old = *p;
  if (old == compare) *p = value;
  return old;
}
inline float atomicAdd(float* p, float x) {
  float o = *p;
  *p += x;
  return o;
}
inline float2 atomicAdd(float2* p, float2 x) {
  float2 o = *p;
  p->x += x.x;
  p->y += x.y;
  return o;
}
