// LOOM_HOST_DEVICE, LOOM_FORCEINLINE: for header-only functions that every kernel library
// shares bit for bit with the host (loom/cpp/philox.h, loom/cpp/adamw_coef.h,
// loom/cpp/step_scalars.h). Under nvcc (__CUDACC__) such a function is compiled for the host
// and the device, and a hot one always inlined; elsewhere it is a plain inline function.
#pragma once

#ifdef __CUDACC__
#define LOOM_HOST_DEVICE __host__ __device__
#define LOOM_FORCEINLINE __forceinline__
#else
#define LOOM_HOST_DEVICE
#define LOOM_FORCEINLINE inline
#endif
