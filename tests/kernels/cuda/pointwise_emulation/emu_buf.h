// What the pointwise emulation tests share (emu_main.cc, fp8_quantize_emu.cc,
// swiglu_fp8_emu.cc): host buffers of any float dtype and of FP8 codes placed off a 16-byte
// boundary on purpose, and a switch from a run-time DType to its storage type. Compiled with
// emu_prelude.h forced in first, like the kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <loom/kernel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace loom::kernels::cuda::pointwise::emu_test {

// ---- Buffers of any float dtype, placed `off` elements past a 16-byte boundary -----------

struct Buf {
  DType dt = DType::kF32;
  int64_t n = 0;
  std::vector<unsigned char> raw;
  unsigned char* p = nullptr;

  Buf() = default;
  Buf(DType dtype, int64_t count, int off) : dt(dtype), n(count) {
    const size_t e = dtype_size(dt);
    raw.assign((n + off) * e + 32, 0);
    uintptr_t a = reinterpret_cast<uintptr_t>(raw.data());
    p = raw.data() + (16 - a % 16) % 16 + off * e;
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept { *this = std::move(o); }
  Buf& operator=(Buf&& o) noexcept {
    const ptrdiff_t at = o.p - o.raw.data();
    dt = o.dt, n = o.n, raw = std::move(o.raw);
    p = raw.data() + at;
    return *this;
  }
  double get(int64_t i) const {
    switch (dt) {
      case DType::kF32:
        return reinterpret_cast<const float*>(p)[i];
      case DType::kBF16:
        return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
      default:
        return __half2float(reinterpret_cast<const __half*>(p)[i]);
    }
  }
  // Stores v rounded to f32, then to the dtype.
  void set(int64_t i, double v) {
    const float f = static_cast<float>(v);
    switch (dt) {
      case DType::kF32:
        reinterpret_cast<float*>(p)[i] = f;
        break;
      case DType::kBF16:
        reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(f);
        break;
      default:
        reinterpret_cast<__half*>(p)[i] = __float2half_rn(f);
        break;
    }
  }
  void fill_nan() {
    for (int64_t i = 0; i < n; ++i) set(i, NAN);
  }
  bool same_bits(const Buf& o) const {
    return n == o.n && dt == o.dt && std::memcmp(p, o.p, n * dtype_size(dt)) == 0;
  }
};

inline const char* name(DType dt) {
  return dt == DType::kF32 ? "f32" : dt == DType::kBF16 ? "bf16" : "f16";
}
// ---- FP8 codes `off` bytes past a 16-byte boundary --------------------------------------
// The rest of the buffer holds 0xAB, which a correct kernel never writes where it must not:
// the FP8 tests check those bytes.
struct Codes {
  std::vector<uint8_t> raw;
  uint8_t* p = nullptr;
  int64_t n = 0;
  Codes(int64_t count, int off) : raw(count + off + 32, 0xAB), n(count) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(raw.data());
    p = raw.data() + (16 - a % 16) % 16 + off;
  }
  // True when no byte outside the first `written` codes at p was written.
  bool untouched_outside(int64_t written) const {
    const int64_t at = p - raw.data();
    for (int64_t i = 0; i < static_cast<int64_t>(raw.size()); ++i)
      if ((i < at || i >= at + written) && raw[i] != 0xAB) return false;
    return true;
  }
};

// Runs `fn(T*)` with T the storage type of dt (a null T* only picks the type).
template <class F>
void with_type(DType dt, F&& fn) {
  switch (dt) {
    case DType::kF32:
      return fn(static_cast<float*>(nullptr));
    case DType::kBF16:
      return fn(static_cast<__nv_bfloat16*>(nullptr));
    default:
      return fn(static_cast<__half*>(nullptr));
  }
}

}  // namespace loom::kernels::cuda::pointwise::emu_test
