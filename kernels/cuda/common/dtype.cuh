// Element types on the device: loads convert f32 / bf16 / f16 to f32, stores round back
// (to nearest even, as the CPU's f32_to_bf16 / f32_to_f16 do), and LOOM_CUDA_FLOAT_SWITCH
// instantiates a templated launch for the storage type of a runtime DType.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <loom/cpp/error.h>
#include <loom/types.h>

namespace loom::kernels::cuda {

template <class T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half x) {
  return __half2float(x);
}

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// f64 (the ops that take it: gemm's Y, add, cast, the router ops): to_f64 is exact for every
// float dtype; from_f64 rounds to f32 once, and to bf16 / f16 through f32 (the CPU's cast, and
// PyTorch's double -> bfloat16 / half).
template <class T>
__device__ __forceinline__ double to_f64(T x) {
  return static_cast<double>(to_f32<T>(x));
}
template <>
__device__ __forceinline__ double to_f64<double>(double x) {
  return x;
}
template <class T>
__device__ __forceinline__ T from_f64(double x) {
  return from_f32<T>(static_cast<float>(x));
}
template <>
__device__ __forceinline__ double from_f64<double>(double x) {
  return x;
}

}  // namespace loom::kernels::cuda

// Runs the statement list that follows with `T` bound to the storage type of DType `dt`
// (float, __nv_bfloat16, __half); any other dtype throws kInvalidArgument naming `op`.
//   LOOM_CUDA_FLOAT_SWITCH(x.dtype, T, "gelu_fwd", { gelu_kernel<T><<<...>>>(...); });
#define LOOM_CUDA_FLOAT_SWITCH(dt, T, op, ...)                                             \
  do {                                                                                     \
    switch (dt) {                                                                          \
      case ::loom::DType::kF32: {                                                          \
        using T = float;                                                                   \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      case ::loom::DType::kBF16: {                                                         \
        using T = __nv_bfloat16;                                                           \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      case ::loom::DType::kF16: {                                                          \
        using T = __half;                                                                  \
        __VA_ARGS__;                                                                       \
      } break;                                                                             \
      default:                                                                             \
        throw ::loom::Error(::loom::Code::kInvalidArgument,                                \
                            std::string(op) + ": dtype " + ::loom::dtype_name(dt) +        \
                                " is not a float dtype (f32, bf16, f16)");                 \
    }                                                                                      \
  } while (0)

// LOOM_CUDA_FLOAT_SWITCH with f64 too (T = double), for the ops that take f64.
#define LOOM_CUDA_FLOAT_OR_F64_SWITCH(dt, T, op, ...) \
  do {                                                \
    if ((dt) == ::loom::DType::kF64) {                \
      using T = double;                               \
      __VA_ARGS__;                                    \
    } else {                                          \
      LOOM_CUDA_FLOAT_SWITCH(dt, T, op, __VA_ARGS__); \
    }                                                 \
  } while (0)
