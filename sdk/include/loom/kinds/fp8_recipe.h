// kinds::kFp8Recipe: how tensors are scaled into FP8 for GEMMs (delayed scaling with an
// amax history, current per-tensor scaling; blockwise and MXFP8 scales are described below
// for recipes to come).
//
// The core builds the recipe from spec /precision/fp8 and hands it to every component it
// builds (IBuildContext::fp8_recipe). A GEMM-bearing module asks it for a quantiser per
// operand (by role) when it is built; the recipe owns the scaling state (amax history,
// scale) of that quantiser. The module quantises with `quantize` and multiplies with the
// "fp8_gemm" op (loom/ops.h), scaling by the scale_inv each quantize wrote.
#pragma once

#include <stdint.h>

#include "loom/kinds/module.h"

namespace loom {

/// Which operand a quantiser serves; recipes may treat them differently (E4M3 forward,
/// E5M2 gradients in the "hybrid" format).
enum class Fp8Role : int32_t {
  kActivation = 0,
  kWeight = 1,
  kGradOutput = 2,
};

/// Scaling granularity of the quantised output.
enum class Fp8Granularity : int32_t {
  kPerTensor = 0,   ///< one scale
  kBlock1x128 = 1,  ///< one scale per 1x128 block (activations, blockwise recipe)
  kBlock128x128 = 2,
  kMx1x32 = 3,  ///< MXFP8: one E8M0 scale per 32 elements
};

/// Describes what `quantize` produces for one quantiser.
struct Fp8QuantizerInfo {
  uint32_t struct_size;
  DType dtype;  ///< kF8E4M3 or kF8E5M2
  Fp8Granularity granularity;
  DType scale_dtype;  ///< kF32 or kF8E8M0
};

class IFp8Recipe : public IObject {
 public:
  /// Creates (or returns) the quantiser for `role` of the module `owner`.
  /// \param owner      the module (its `this`)
  /// \param role       operand role
  /// \param[out] id    handle used in the calls below
  /// \param[out] info  output dtype and scale layout
  virtual Status quantizer(const void* owner, Fp8Role role, int32_t* id,
                           Fp8QuantizerInfo* info) noexcept = 0;
  /// Quantises `input` and writes the factor the GEMM must multiply by, recording the
  /// input's amax in the recipe's state. All views are the caller's memory on the input's
  /// device; the recipe keeps none of them.
  /// \param id        a quantiser from `quantizer`
  /// \param input     (M, K) f32/bf16/f16 (leading dimensions flatten into M), contiguous
  /// \param output    (M, K) of info.dtype, or a view with data == null when not wanted
  /// \param output_t  (K, M) of info.dtype, the transpose (for the GEMMs of backward), or
  ///                  empty; at least one of output and output_t is given
  /// \param scale_inv f32 (1): receives 1 / scale, so that input ~ output * scale_inv
  /// \param stream    the device's compute stream (null on the CPU)
  virtual Status quantize(int32_t id, const TensorView* input, TensorView* output,
                          TensorView* output_t, TensorView* scale_inv, void* stream) noexcept = 0;
  /// Called once per optimizer step, after the step, on every rank: updates amax
  /// histories and scales, the step's amaxes reduced (max) over `amax_group` first when it
  /// is not null (the data-parallel group, so that every replica quantises alike).
  virtual Status step_end(class ICommunicator* amax_group, void* stream) noexcept = 0;

 protected:
  ~IFp8Recipe() = default;
};

}  // namespace loom
