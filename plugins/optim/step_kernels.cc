#include "plugins/optim/step_kernels.h"

#include <loom/cpp/op_args.h>

#include <cmath>
#include <cstddef>

#include "plugins/optim/options.h"

namespace loom::optim {
namespace {

DeviceType parse_device(const nlohmann::json& options) {
  std::string name = string_or(options, "device", "cpu");
  if (name == "cpu") return DeviceType::kCpu;
  if (name == "cuda") return DeviceType::kCuda;
  bad_option("device", "must be \"cpu\" or \"cuda\", got \"" + name + "\"");
}

DType parse_params_dtype(const nlohmann::json& options) {
  std::string name = string_or(options, "params_dtype", "f32");
  DType dtype = dtype_from_name(name.c_str());
  if (dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16) return dtype;
  bad_option("params_dtype", "must be \"f32\", \"bf16\" or \"f16\", got \"" + name + "\"");
}

}  // namespace

StepKernels::StepKernels(IHost& host, const char* op, const nlohmann::json& options, bool optional)
    : op_(op), device_(parse_device(options)), params_dtype_(parse_params_dtype(options)) {
  Device device{device_, 0};
  auto resolve = [&](DType dtype) {
    try {
      return Kernel(host, op, device, dtype);
    } catch (const Error& e) {
      if (optional && e.code() == Code::kNotFound) return Kernel();
      throw;
    }
  };
  f32_ = resolve(DType::kF32);
  if (params_dtype_ != DType::kF32) params_ = resolve(params_dtype_);
}

const Kernel& StepKernels::for_grad(DType dtype) const {
  if (dtype == DType::kF32) return f32_;
  if (dtype == params_dtype_) return params_;
  fail(Code::kInvalidArgument,
       op_ + ": gradient dtype " + dtype_name(dtype) + " is neither f32 nor the parameter dtype " +
           dtype_name(params_dtype_) + " the optimizer was built for (option params_dtype)");
}

const Kernel* StepKernels::find(DType dtype) const {
  const Kernel* k = dtype == DType::kF32 ? &f32_ : dtype == params_dtype_ ? &params_ : nullptr;
  return k != nullptr && *k ? k : nullptr;
}

std::vector<DType> StepKernels::grad_dtypes() const {
  std::vector<DType> t{DType::kF32};
  if (params_dtype_ != DType::kF32) t.push_back(params_dtype_);
  return t;
}

void StepKernels::check(const TensorView* master, const TensorView* grad, const TensorView* states,
                        const std::vector<DType>& state_dtypes) const {
  const int32_t state_count = static_cast<int32_t>(state_dtypes.size());
  if (master == nullptr || grad == nullptr || (state_count > 0 && states == nullptr))
    fail(Code::kInvalidArgument, op_ + ": master, grad and states must not be null");
  if (master->dtype != DType::kF32)
    fail(Code::kInvalidArgument,
         op_ + ": master weights must be f32, got " + dtype_name(master->dtype));
  if (master->device.type != device_)
    fail(Code::kInvalidArgument, op_ + ": master weights are on another device than the one " +
                                     "the optimizer was built for (option device)");
  int64_t n = numel(*master);
  if (numel(*grad) != n)
    fail(Code::kInvalidArgument, op_ + ": grad has " + std::to_string(numel(*grad)) +
                                     " elements, master " + std::to_string(n));
  for (int32_t i = 0; i < state_count; ++i) {
    const DType want = state_dtypes[static_cast<size_t>(i)];
    if (states[i].dtype != want || numel(states[i]) != n || states[i].device.type != device_)
      fail(Code::kInvalidArgument,
           op_ + ": state " + std::to_string(i) + " must be " + dtype_name(want) + " with " +
               std::to_string(n) + " elements on the master weights' device (got " +
               dtype_name(states[i].dtype) + " with " + std::to_string(numel(states[i])) +
               "): the optimizer's state_dtype");
  }
}

void StepKernels::check_shard(const OptimizerShard& shard, int32_t index,
                              const std::vector<DType>& state_dtypes) const {
  std::string at = op_ + ": shard " + std::to_string(index) + ": ";
  try {
    check(&shard.master, &shard.grad, shard.states, state_dtypes);
    for_grad(shard.grad.dtype);  // a dtype no kernel was resolved for
  } catch (const Error& e) {
    // "adamw_step: grad has 36 elements, master 37" -> "adamw_step: shard 3: grad has ..."
    std::string message = e.what();
    if (message.rfind(op_ + ": ", 0) == 0) message.erase(0, op_.size() + 2);
    fail(e.code(), at + message);
  }
  const TensorView& p = shard.param;
  if (p.data == nullptr) return;
  if (p.dtype != DType::kF32 && p.dtype != DType::kBF16 && p.dtype != DType::kF16)
    fail(Code::kInvalidArgument,
         at + "param has dtype " + dtype_name(p.dtype) + ", expected f32, bf16 or f16");
  if (p.device.type != device_)
    fail(Code::kInvalidArgument, at + "param is on another device than the master weights");
  if (numel(p) != numel(shard.master))
    fail(Code::kInvalidArgument, at + "param has " + std::to_string(numel(p)) +
                                     " elements, master " + std::to_string(numel(shard.master)));
}

ShardArray::ShardArray(const OptimizerShard* shards, int32_t count, const char* who)
    : base_(reinterpret_cast<const char*>(shards)), count_(count) {
  std::string w = who;
  if (count < 0)
    fail(Code::kInvalidArgument, w + " update_many: count is " + std::to_string(count));
  if (count == 0) return;
  if (shards == nullptr)
    fail(Code::kInvalidArgument,
         w + " update_many: shards is null with count " + std::to_string(count));
  if (shards->struct_size < sizeof(OptimizerShard))
    fail(Code::kInvalidArgument,
         w + " update_many: OptimizerShard of " + std::to_string(shards->struct_size) +
             " bytes is older than this optimizer's (" + std::to_string(sizeof(OptimizerShard)) +
             "): rebuild the caller");
  stride_ = shards->struct_size;
}

void check_step(const OptimizerStep* hp, const char* who) {
  std::string w = who;
  if (hp == nullptr) fail(Code::kInvalidArgument, w + " update: no step hyper-parameters");
  if (hp->step < 1)
    fail(Code::kInvalidArgument,
         w + " update: step is " + std::to_string(hp->step) + ", steps are 1-based");
  if (!std::isfinite(hp->lr) || hp->lr < 0)
    fail(Code::kInvalidArgument,
         w + " update: lr must be finite and >= 0, got " + nlohmann::json(hp->lr).dump());
  if (!std::isfinite(hp->weight_decay) || hp->weight_decay < 0)
    fail(Code::kInvalidArgument, w + " update: weight_decay must be finite and >= 0, got " +
                                     nlohmann::json(hp->weight_decay).dump());
  if (!std::isfinite(hp->grad_scale))
    fail(Code::kInvalidArgument,
         w + " update: grad_scale must be finite, got " + nlohmann::json(hp->grad_scale).dump());
}

const TensorView* step_scalars(const OptimizerStep* hp, DeviceType device, const char* who) {
  if (hp->struct_size < offsetof(OptimizerStep, scalars) + sizeof(TensorView) ||
      hp->scalars.data == nullptr)
    return nullptr;
  const TensorView& s = hp->scalars;
  if (s.dtype != DType::kF64 || s.ndim != 1 || s.shape[0] != ops::kStepScalarCount ||
      !is_contiguous(s) || s.device.type != device)
    fail(Code::kInvalidArgument, std::string(who) + " update: the step scalars must be f64 (" +
                                     std::to_string(ops::kStepScalarCount) + ") on the " +
                                     device_type_name(device) + " device (loom/ops/optim.h), got " +
                                     dtype_name(s.dtype) + " " + view_shape_str(s) + " on " +
                                     device_type_name(s.device.type));
  return &s;
}

}  // namespace loom::optim
