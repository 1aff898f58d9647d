// What the per-tensor FP8 recipes share (Transformer Engine's delayed and current scaling):
// quantisers registered by (owner, role), each with its FP8 format and an f32 scale on the
// device, and the checks of a quantize call. The recipes differ in where a scale comes
// from: the amax history of past steps (DelayedScaling) or the tensor itself
// (TensorwiseScaling).
#pragma once

#include <loom/cpp/tensor.h>
#include <loom/sdk.h>

#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

namespace loom::fp8 {

class ScalingRecipe : public Object<IFp8Recipe> {
 public:
  /// Options shared by both recipes: format ("hybrid": E5M2 gradients, "e4m3"), margin.
  ScalingRecipe(const nlohmann::json& options, IBuildContext& ctx);
  ~ScalingRecipe() override;
  ScalingRecipe(const ScalingRecipe&) = delete;
  ScalingRecipe& operator=(const ScalingRecipe&) = delete;

  /// One quantiser per (owner, role); asking again returns the same id. E4M3 for
  /// activations and weights; gradients E5M2 with format "hybrid", else E4M3. Per-tensor
  /// f32 scales. Fails once quantisation has started (the state is sized by then).
  Status quantizer(const void* owner, Fp8Role role, int32_t* id,
                   Fp8QuantizerInfo* info) noexcept override;
  /// Checks the call (id, devices, dtypes; the kernels check the shapes) and runs the
  /// recipe's quantize_impl.
  Status quantize(int32_t id, const TensorView* input, TensorView* output, TensorView* output_t,
                  TensorView* scale_inv, uint32_t flags, void* stream) noexcept override;

  /// Checks the call (id, views) and runs the recipe's producer_impl: kUnimplemented unless
  /// the recipe overrides it.
  Status producer(int32_t id, Device device, uint32_t flags, TensorView* scale, TensorView* amax,
                  TensorView* scale_inv, void* stream) noexcept override;

  /// No state by default (a recipe whose scales carry over steps overrides both).
  int32_t state_count() const noexcept override { return 0; }
  Status state(int32_t index, Device device, const char** name, TensorView* view) noexcept override;
  /// No per-quantiser state by default (none at all).
  int32_t state_quantizer_dim(int32_t index) const noexcept override { return -1; }

  /// Number of quantisers registered.
  int32_t quantizer_count() const noexcept override { return static_cast<int32_t>(dtypes_.size()); }

 protected:
  /// Quantises x into y / yt (either may be empty) with quantiser `id`'s scale and writes
  /// its inverse into `scale_inv`; records x's amax in the recipe's state when `record`.
  /// The state exists (started() is true).
  virtual void quantize_impl(int32_t id, const TensorView& x, const TensorView& y,
                             const TensorView& yt, const TensorView& scale_inv, bool record,
                             void* stream) = 0;
  /// quantiser `id`'s scale and, when `record`, its amax slot (else an empty view), for a
  /// kernel that quantises its own result; writes the scale's inverse into `scale_inv`.
  /// The state exists. By default: fails with kUnimplemented (the scale needs the tensor).
  virtual void producer_impl(int32_t id, const TensorView& scale_inv, bool record, void* stream,
                             TensorView* scale, TensorView* amax);
  /// Allocates the recipe's own state on `device` (called once, at the first quantize).
  virtual void allocate_state() = 0;

  /// Allocates the shared state and the recipe's (allocate_state) on `device` the first
  /// time; afterwards checks that `device` is the same.
  void start(Device device);
  /// True once the first quantize has allocated the state.
  bool started() const { return started_; }
  Device device() const { return device_; }
  IHost& host() const { return host_; }
  float margin() const { return margin_; }
  /// fp8_max (Q) on the device: 448 or 57344 per quantiser, as fp8_scale_update takes it.
  const TensorView& fp8_max() const { return fp8_max_; }
  /// An f32 tensor of `shape` on the device, every element `value`; freed with the recipe.
  TensorView device_f32(std::initializer_list<int64_t> shape, float value);
  /// An f32 (n) tensor on the device holding `values`; freed with the recipe.
  TensorView device_f32(const std::vector<float>& values);
  /// Element `index` of an f32 tensor as a (1) view (a row-major flat index).
  static TensorView element(const TensorView& v, int64_t index);
  /// The kernels: fp8_quantize keyed on the input's dtype, amax likewise, and the f32 ones.
  const Kernel& quantize_kernel(DType input_dtype);
  const Kernel& amax_kernel(DType input_dtype);
  const Kernel& scale_update_kernel() const { return scale_update_; }
  /// Copies quantiser `id`'s scale_inv (an element of `from`) into the caller's view.
  void copy_scale_inv(const TensorView& from, const TensorView& to, void* stream) const;

 private:
  IHost& host_;
  bool hybrid_ = true;
  float margin_;
  std::map<std::pair<const void*, Fp8Role>, int32_t> ids_;
  std::vector<DType> dtypes_;  // per quantiser
  bool started_ = false;
  Device device_{};
  std::vector<void*> owned_;
  TensorView fp8_max_{};
  std::map<DType, Kernel> quantize_, amax_;
  /// cache's kernel of `op` for `input_dtype`, resolved on first use.
  const Kernel& kernel_for(std::map<DType, Kernel>& cache, const char* op, DType input_dtype);
  Kernel scale_update_, copy_;
};

}  // namespace loom::fp8
