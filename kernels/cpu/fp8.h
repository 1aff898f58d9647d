// fp8_quantize's two loops over an (M, K) tensor, shared by fp8_quantize (fp8.cc) and the
// ops that quantise a result they compute (swiglu_fp8.cc), so that both write the same bits:
// Y = fp8(x * scale) (loom/cpp/fp8.h's f32_to_fp8), its transpose Yt, and the max of |x|
// (NaN wins) folded into amax; and, for the ops' optional output [3], scale_inv = 1 / scale
// (the f32 division fp8_scale_update uses), written also when M K is 0.
#pragma once

#include <loom/cpp/op_checks/fp8.h>
#include <loom/kernel.h>
#include <loom/types.h>
#include <stdint.h>

#include <functional>
#include <vector>

namespace loom::kernels::cpu {

/// The reference's: one element at a time, x = value(i, j). y, yt, amax, scale_inv may be
/// null (amax: read, then written unless M K is 0).
void quantize_elements_ref(int64_t m, int64_t k, float scale, DType out_dtype, uint8_t* y,
                           uint8_t* yt, float* amax, float* scale_inv,
                           const std::function<float(int64_t, int64_t)>& value);
/// The fast one's: tiles of rows in parallel (OpenMP), row i's K values written by
/// row(i, out) (from several threads at once). y, yt, amax, scale_inv may be null.
void quantize_rows_fast(int64_t m, int64_t k, float scale, DType out_dtype, uint8_t* y, uint8_t* yt,
                        float* amax, float* scale_inv,
                        const std::function<void(int64_t, float*)>& row);
/// Output [3] of a quantising op's call (its scale_inv, ABI 1.14), or null where the call has
/// none.
float* scale_inv_out(const OpCall* call, bool present);

/// The outputs of a quantising op's call (Y, Yt, amax, scale_inv), null where absent.
struct Fp8Outs {
  uint8_t* y;
  uint8_t* yt;
  float* amax;
  float* scale_inv;
};
Fp8Outs fp8_outs(const OpCall* call, const op_checks::Fp8QuantizeShape& s);

/// For the ops that quantise a result they compute: v as a tensor of dtype t stores it (what
/// the unfused op's output holds), one value (the references') or a row of n through
/// store_row / load_row as the fast kernels convert (scratch: the thread's buffer).
float rounded_to(DType t, float v);
void round_row(DType t, float* v, int64_t n, std::vector<uint16_t>& scratch);

}  // namespace loom::kernels::cpu
