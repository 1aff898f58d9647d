// kinds::kFp8Recipe: how tensors are scaled into FP8 for GEMMs (delayed scaling with an
// amax history, current per-tensor scaling; blockwise and MXFP8 scales are described below
// for recipes to come).
//
// The core builds the recipe from spec /precision/fp8 and hands it to every component it
// builds (IBuildContext::fp8_recipe). A GEMM-bearing module asks it for a quantiser per
// operand (by role) when it is built; the recipe owns the scaling state (amax history,
// scale) of that quantiser. The module quantises with `quantize` and multiplies with the
// "fp8_gemm" op (loom/ops.h), scaling by the scale_inv each quantize wrote. Under a recipe
// whose scales are known in advance (1.1's `producer`), the kernel that computes a tensor may
// quantise it itself.
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

/// Flags of IFp8Recipe::quantize.
enum Fp8QuantizeFlags : uint32_t {
  kFp8QuantizeDefault = 0,
  /// Evaluation: quantise with the current scale but record nothing, so that the recipe's
  /// state (amax history) stays as training left it.
  kFp8NoAmaxRecord = 1u << 0,
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
  /// \param flags     Fp8QuantizeFlags
  /// \param stream    the device's compute stream (null: the default)
  virtual Status quantize(int32_t id, const TensorView* input, TensorView* output,
                          TensorView* output_t, TensorView* scale_inv, uint32_t flags,
                          void* stream) noexcept = 0;
  /// Called once per optimizer step, after the step, on every rank: updates amax
  /// histories and scales, the step's amaxes reduced (max) over `amax_group` first when it
  /// is not null (the data-parallel group, so that every replica quantises alike).
  virtual Status step_end(class ICommunicator* amax_group, void* stream) noexcept = 0;
  /// Number of state tensors a checkpoint keeps for an exact resume (amax histories,
  /// scales; 0 when the recipe carries nothing from one step to the next).
  virtual int32_t state_count() const noexcept = 0;
  /// State tensor `index` in [0, state_count()): an f32 view of the recipe's own memory on
  /// `device`, allocated now if need be (call it once the model is built: every quantiser
  /// is known then). Alike on every rank after step_end. The caller may read it (to save a
  /// checkpoint) or write it (to restore one) between steps; the recipe takes written
  /// values into account from its next quantize or step_end on.
  /// \param index      which tensor
  /// \param device     the run's device
  /// \param[out] name  its name in checkpoints, e.g. "amax_history"; static or the recipe's
  /// \param[out] view  the tensor
  virtual Status state(int32_t index, Device device, const char** name,
                       TensorView* view) noexcept = 0;

  /// 1.1 (check interface_info().minor first). What a producer needs to quantise its own
  /// result with quantiser `id` in the same kernel (the "swiglu_fp8_fwd" family of ops):
  /// `quantize`'s work without its input. Only a recipe whose scale is known before the data
  /// (delayed scaling) can give it; one that computes the scale from the tensor (current
  /// scaling) returns kUnimplemented, and the caller quantises with `quantize` instead.
  /// \param id          a quantiser from `quantizer`
  /// \param device      the device the producer runs on
  /// \param flags       Fp8QuantizeFlags, as for `quantize`
  /// \param[out] scale  f32 (1), the recipe's memory: the factor to multiply by (step_end
  ///                    updates it in place, so a captured graph may keep the view)
  /// \param[out] amax   f32 (1), the recipe's memory: where the producer folds max |x| (the
  ///                    op's amax output, read and written), or an empty view when `flags`
  ///                    has kFp8NoAmaxRecord
  /// \param scale_inv   f32 (1), the caller's: receives 1 / scale, as `quantize` writes it;
  ///                    or an empty view: nothing written (a caller asking whether the
  ///                    recipe gives producers at all, or one whose op writes scale_inv
  ///                    itself: the quantising ops' output [3], ABI 1.14)
  /// \param stream      the device's compute stream (null: the default)
  virtual Status producer(int32_t id, Device device, uint32_t flags, TensorView* scale,
                          TensorView* amax, TensorView* scale_inv, void* stream) noexcept = 0;

  /// 1.2 (check interface_info().minor first). The dimension of state tensor `index` that
  /// runs over the quantisers, one entry each in the order `quantizer` handed out their ids;
  /// -1 for a tensor that holds no per-quantiser entries (a history position, alike on every
  /// rank). A pipeline stage holds the quantisers of its own layers, so a checkpoint keeps
  /// the stages' tensors concatenated along this dimension, in stage order: the whole
  /// model's quantisers in its build order, which reshards across pipeline layouts.
  /// \param index  which state tensor, in [0, state_count())
  virtual int32_t state_quantizer_dim(int32_t index) const noexcept = 0;
  /// 1.2. Quantisers handed out so far (ids 0 .. count - 1). The core asks it after building
  /// each virtual pipeline chunk of a rank: which ids (and so which state entries) are that
  /// chunk's.
  virtual int32_t quantizer_count() const noexcept = 0;

 protected:
  ~IFp8Recipe() = default;
};

}  // namespace loom
