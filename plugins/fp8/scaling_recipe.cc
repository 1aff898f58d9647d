#include "plugins/fp8/scaling_recipe.h"

#include <loom/cpp/fp8.h>

#include <string>

namespace loom::fp8 {

ScalingRecipe::ScalingRecipe(const nlohmann::json& options, IBuildContext& ctx)
    : host_(*ctx.host()), margin_(options.value("margin", 0.0f)) {
  const std::string format = options.value("format", "hybrid");
  hybrid_ = format == "hybrid";
  if (format != "hybrid" && format != "e4m3")
    fail(Code::kInvalidArgument,
         "/format: '" + format + "' is not an FP8 format of this recipe: use hybrid or e4m3");
  if (!(margin_ >= 0.0f && margin_ <= 64.0f))
    fail(Code::kInvalidArgument, "/margin: must be in [0, 64], e.g. 0");
}

ScalingRecipe::~ScalingRecipe() {
  for (void* p : owned_) host_.deallocate(device_, p);
}

Status ScalingRecipe::quantizer(const void* owner, Fp8Role role, int32_t* id,
                                Fp8QuantizerInfo* info) noexcept {
  return guard([&] {
    if (id == nullptr || info == nullptr)
      fail(Code::kInvalidArgument, "fp8 quantizer: id and info must not be null");
    if (role != Fp8Role::kActivation && role != Fp8Role::kWeight && role != Fp8Role::kGradOutput)
      fail(Code::kInvalidArgument,
           "fp8 quantizer: unknown role " + std::to_string(static_cast<int>(role)));
    auto key = std::make_pair(owner, role);
    auto it = ids_.find(key);
    if (it == ids_.end()) {
      if (started_)
        fail(Code::kFailedPrecondition,
             "fp8 quantizer: asked for a new quantiser after quantisation started; modules "
             "must ask for theirs while they are built");
      it = ids_.emplace(key, static_cast<int32_t>(dtypes_.size())).first;
      dtypes_.push_back(role == Fp8Role::kGradOutput && hybrid_ ? DType::kF8E5M2 : DType::kF8E4M3);
    }
    *id = it->second;
    info->struct_size = sizeof(Fp8QuantizerInfo);
    info->dtype = dtypes_[static_cast<size_t>(it->second)];
    info->granularity = Fp8Granularity::kPerTensor;
    info->scale_dtype = DType::kF32;
  });
}

Status ScalingRecipe::quantize(int32_t id, const TensorView* input, TensorView* output,
                               TensorView* output_t, TensorView* scale_inv, uint32_t flags,
                               void* stream) noexcept {
  return guard([&] {
    if (input == nullptr || output == nullptr || output_t == nullptr || scale_inv == nullptr)
      fail(Code::kInvalidArgument, "fp8 quantize: null view pointer (pass empty views instead)");
    if (id < 0 || id >= quantizer_count())
      fail(Code::kInvalidArgument, "fp8 quantize: quantiser id " + std::to_string(id) +
                                       " was not handed out by this recipe (it has " +
                                       std::to_string(quantizer_count()) + ")");
    DType want = dtypes_[static_cast<size_t>(id)];
    for (const TensorView* v : std::initializer_list<const TensorView*>{output, output_t})
      if (present(*v) && v->dtype != want)
        fail(Code::kInvalidArgument, std::string("fp8 quantize: output of dtype ") +
                                         dtype_name(v->dtype) + " for a quantiser of " +
                                         dtype_name(want) + " (see its Fp8QuantizerInfo)");
    if (!started_) start(input->device);
    for (const TensorView* v :
         std::initializer_list<const TensorView*>{input, output, output_t, scale_inv})
      if (present(*v) && (v->device.type != device_.type || v->device.index != device_.index))
        fail(Code::kInvalidArgument,
             "fp8 quantize: tensors on two devices; the recipe keeps its scales on the device "
             "of the first tensor it quantised");
    quantize_impl(id, *input, *output, *output_t, *scale_inv, (flags & kFp8NoAmaxRecord) == 0,
                  stream);
  });
}

Status ScalingRecipe::producer(int32_t id, Device device, uint32_t flags, TensorView* scale,
                               TensorView* amax, TensorView* scale_inv, void* stream) noexcept {
  return guard([&] {
    if (scale == nullptr || amax == nullptr || scale_inv == nullptr)
      fail(Code::kInvalidArgument, "fp8 producer: null view pointer");
    if (id < 0 || id >= quantizer_count())
      fail(Code::kInvalidArgument, "fp8 producer: quantiser id " + std::to_string(id) +
                                       " was not handed out by this recipe (it has " +
                                       std::to_string(quantizer_count()) + ")");
    if (!started_) start(device);
    if (device.type != device_.type || device.index != device_.index ||
        (present(*scale_inv) &&
         (scale_inv->device.type != device_.type || scale_inv->device.index != device_.index)))
      fail(Code::kInvalidArgument,
           "fp8 producer: tensors on two devices; the recipe keeps its scales on the device of "
           "the first tensor it quantised");
    producer_impl(id, *scale_inv, (flags & kFp8NoAmaxRecord) == 0, stream, scale, amax);
  });
}

void ScalingRecipe::producer_impl(int32_t, const TensorView&, bool, void*, TensorView*,
                                  TensorView*) {
  fail(Code::kUnimplemented,
       "fp8 producer: this recipe computes a tensor's scale from the tensor itself, so no kernel "
       "can quantise its own result with it; quantise with `quantize`");
}

void ScalingRecipe::start(Device device) {
  if (started_) {
    if (device.type != device_.type || device.index != device_.index)
      fail(Code::kInvalidArgument,
           "fp8 recipe: asked for another device than the one its state lives on");
    return;
  }
  device_ = device;
  std::vector<float> max(dtypes_.size());
  for (size_t q = 0; q < dtypes_.size(); ++q) max[q] = fp8_format(dtypes_[q]).max;
  fp8_max_ = device_f32(max);
  scale_update_ = Kernel(host_, ops::kFp8ScaleUpdate, device_, DType::kF32);
  copy_ = Kernel(host_, ops::kScale, device_, DType::kF32);
  allocate_state();
  started_ = true;
}

Status ScalingRecipe::state(int32_t index, Device, const char**, TensorView*) noexcept {
  return make_status(Code::kOutOfRange,
                     ("fp8 recipe: no state tensor " + std::to_string(index)).c_str());
}

TensorView ScalingRecipe::device_f32(std::initializer_list<int64_t> shape, float value) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return reshape(device_f32(std::vector<float>(static_cast<size_t>(n), value)), shape);
}

TensorView ScalingRecipe::device_f32(const std::vector<float>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  if (n == 0) return make_view(nullptr, DType::kF32, {0}, device_);  // no quantisers
  void* p = nullptr;
  throw_if_error(host_.allocate(device_, static_cast<uint64_t>(n) * 4, 64, &p), "fp8 recipe state");
  owned_.push_back(p);
  throw_if_error(host_.copy(device_, p, kCpu, values.data(), values.size() * 4),
                 "fp8 recipe state");
  return make_view(p, DType::kF32, {n}, device_);
}

TensorView ScalingRecipe::element(const TensorView& v, int64_t index) {
  return make_view(static_cast<float*>(v.data) + index, DType::kF32, {1}, v.device);
}

const Kernel& ScalingRecipe::kernel_for(std::map<DType, Kernel>& cache, const char* op,
                                        DType input_dtype) {
  auto it = cache.find(input_dtype);
  if (it == cache.end())
    it = cache.emplace(input_dtype, Kernel(host_, op, device_, input_dtype)).first;
  return it->second;
}

const Kernel& ScalingRecipe::quantize_kernel(DType input_dtype) {
  return kernel_for(quantize_, ops::kFp8Quantize, input_dtype);
}

const Kernel& ScalingRecipe::amax_kernel(DType input_dtype) {
  return kernel_for(amax_, ops::kAmax, input_dtype);
}

void ScalingRecipe::copy_scale_inv(const TensorView& from, const TensorView& to,
                                   void* stream) const {
  copy_({from}, {to}, ops::ScaleAttrs{1.0f}, stream);
}

}  // namespace loom::fp8
