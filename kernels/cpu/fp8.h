// fp8_quantize's two loops over an (M, K) tensor, shared by fp8_quantize (fp8.cc) and the
// ops that quantise a result they compute (swiglu_fp8.cc), so that both write the same bits:
// Y = fp8(x * scale) (loom/cpp/fp8.h's f32_to_fp8), its transpose Yt, and the max of |x|
// (NaN wins) folded into amax.
#pragma once

#include <loom/types.h>
#include <stdint.h>

#include <functional>

namespace loom::kernels::cpu {

/// The reference's: one element at a time, x = value(i, j). y, yt, amax may be null (amax:
/// read, then written unless M K is 0).
void quantize_elements_ref(int64_t m, int64_t k, float scale, DType out_dtype, uint8_t* y,
                           uint8_t* yt, float* amax,
                           const std::function<float(int64_t, int64_t)>& value);
/// The fast one's: tiles of rows in parallel (OpenMP), row i's K values written by
/// row(i, out) (from several threads at once). y, yt, amax may be null.
void quantize_rows_fast(int64_t m, int64_t k, float scale, DType out_dtype, uint8_t* y, uint8_t* yt,
                        float* amax, const std::function<void(int64_t, float*)>& row);

}  // namespace loom::kernels::cpu
