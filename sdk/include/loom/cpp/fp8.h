// Host conversions between f32 and the OCP FP8 formats (E4M3 "fn": bias 7, no infinities,
// max 448, NaN = S.1111.111; E5M2: bias 15, IEEE-like, max 57344), as loom/ops.h defines
// them for "fp8_quantize": round to nearest even, saturate finite and infinite values to the
// largest magnitude, NaN to NaN. Header-only.
#pragma once

#include <stdint.h>

#include <cstring>

#include "loom/types.h"

namespace loom {

/// Mantissa bits, exponent bias and largest finite value of an FP8 format.
struct Fp8Format {
  int32_t mantissa_bits;
  int32_t bias;
  float max;
};

/// The format of `dtype` (kF8E4M3 or kF8E5M2; anything else gives E4M3's).
inline constexpr Fp8Format fp8_format(DType dtype) noexcept {
  return dtype == DType::kF8E5M2 ? Fp8Format{2, 15, 57344.0f} : Fp8Format{3, 7, 448.0f};
}

/// True for the two FP8 storage formats that GEMMs take.
inline constexpr bool is_fp8_dtype(DType dtype) noexcept {
  return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
}

/// The value of the byte `code` in `dtype`.
inline float fp8_to_f32(uint8_t code, DType dtype) noexcept {
  const Fp8Format f = fp8_format(dtype);
  const bool negative = (code & 0x80u) != 0;
  const uint32_t exp_bits = 7u - static_cast<uint32_t>(f.mantissa_bits);
  const uint32_t e = (code >> f.mantissa_bits) & ((1u << exp_bits) - 1u);
  const uint32_t m = code & ((1u << f.mantissa_bits) - 1u);
  const uint32_t e_max = (1u << exp_bits) - 1u;
  float v;
  if (dtype == DType::kF8E5M2 && e == e_max) {
    uint32_t bits = m == 0 ? 0x7f800000u : 0x7fc00000u;  // inf or NaN
    std::memcpy(&v, &bits, sizeof(v));
  } else if (dtype != DType::kF8E5M2 && e == e_max && m == ((1u << f.mantissa_bits) - 1u)) {
    uint32_t bits = 0x7fc00000u;  // E4M3's only NaN pattern
    std::memcpy(&v, &bits, sizeof(v));
  } else {
    // Subnormals have exponent 1 - bias and no implicit one; the rest 2^(e - bias) * 1.m.
    // Assemble the f32 bit pattern directly (every FP8 value is exact in f32).
    uint32_t bits;
    if (e == 0) {
      if (m == 0) {
        bits = 0;
      } else {
        int32_t shift = 0;  // normalise m
        uint32_t mm = m;
        while ((mm & (1u << f.mantissa_bits)) == 0) {
          mm <<= 1;
          ++shift;
        }
        mm &= (1u << f.mantissa_bits) - 1u;
        bits = static_cast<uint32_t>(1 - f.bias - shift + 127) << 23 | mm << (23 - f.mantissa_bits);
      }
    } else {
      bits = static_cast<uint32_t>(static_cast<int32_t>(e) - f.bias + 127) << 23 |
             m << (23 - f.mantissa_bits);
    }
    std::memcpy(&v, &bits, sizeof(v));
  }
  return negative ? -v : v;
}

/// `x` in `dtype`, rounded to nearest even and saturated (see the top of this file).
inline uint8_t f32_to_fp8(float x, DType dtype) noexcept {
  const Fp8Format f = fp8_format(dtype);
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u)
    return dtype == DType::kF8E5M2 ? uint8_t(sign | 0x7e) : uint8_t(sign | 0x7f);
  float a;
  std::memcpy(&a, &abs, sizeof(a));
  const int32_t mb = f.mantissa_bits;
  const uint8_t max_code = dtype == DType::kF8E5M2 ? 0x7b : 0x7e;
  if (a >= f.max) return static_cast<uint8_t>(sign | max_code);
  const int32_t f32_exp = static_cast<int32_t>(abs >> 23) - 127;
  const int32_t min_normal_exp = 1 - f.bias;
  uint32_t code;
  if (f32_exp < min_normal_exp) {
    // Subnormal range: a multiple of the quantum 2^(min_normal_exp - mb). Scale so that the
    // quantum is 1 and round the f32 to an integer, ties to even (exact: powers of two).
    float scaled = a;
    int32_t k = mb - min_normal_exp;  // multiply by 2^k
    while (k > 0) {
      int32_t step = k > 60 ? 60 : k;
      scaled *= static_cast<float>(uint64_t{1} << step);
      k -= step;
    }
    // Round half to even by hand (no dependence on the FP rounding mode).
    float fl = static_cast<float>(static_cast<uint32_t>(scaled));
    float frac = scaled - fl;
    uint32_t q = static_cast<uint32_t>(fl);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u) != 0)) ++q;
    code = q;  // q == 2^mb is the smallest normal, which this encoding also gives
  } else {
    // Normal: keep mb mantissa bits of the f32, rounding the dropped ones half to even; a
    // carry out of the mantissa bumps the exponent, as the encoding wants.
    const int32_t drop = 23 - mb;
    uint32_t mant = abs & 0x7fffffu;
    uint32_t q = (static_cast<uint32_t>(f32_exp - min_normal_exp + 1) << 23 | mant);
    const uint32_t half = 1u << (drop - 1);
    const uint32_t rest = q & ((1u << drop) - 1u);
    q >>= drop;
    if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
    code = q;
    if (code > max_code) code = max_code;  // rounding up past the largest value saturates
  }
  return static_cast<uint8_t>(sign | code);
}

}  // namespace loom
