#include "core/runtime/parameters.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/runtime/forward_context.h"
#include "loom/cpp/error.h"
#include "loom/cpp/half.h"

namespace loom::core {
namespace {

// xoshiro256** seeded through SplitMix64: fast, and the same on every platform (unlike
// std::normal_distribution, whose algorithm the standard leaves open).
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) {
    uint64_t x = mix64(seed) ^ mix64(stream + 0x51ed270b27cd1ef3ull);
    for (auto& word : s_) word = x = mix64(x);
  }
  uint64_t next() {
    uint64_t result = rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in (0, 1): 53 random bits, never 0.
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace

uint64_t hash_name(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

void fill_normal(float* out, int64_t count, float std, uint64_t seed, uint64_t stream) {
  Rng rng(seed, stream);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < count; i += 2) {  // Box-Muller, two draws per pair
    double r = std::sqrt(-2.0 * std::log(rng.uniform()));
    double theta = kTwoPi * rng.uniform();
    out[i] = static_cast<float>(std * r * std::cos(theta));
    if (i + 1 < count) out[i + 1] = static_cast<float>(std * r * std::sin(theta));
  }
}

void fill_uniform(float* out, int64_t count, float bound, uint64_t seed, uint64_t stream) {
  Rng rng(seed, stream);
  for (int64_t i = 0; i < count; ++i)
    out[i] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
}

void store_floats(const float* values, const TensorView& view) {
  int64_t n = numel(view);
  switch (view.dtype) {
    case DType::kF32:
      std::memcpy(view.data, values, n * sizeof(float));
      return;
    case DType::kBF16: {
      auto* p = static_cast<uint16_t*>(view.data);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(values[i]);
      return;
    }
    case DType::kF16: {
      auto* p = static_cast<uint16_t*>(view.data);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16(values[i]);
      return;
    }
    default:
      fail(Code::kInvalidArgument,
           fmt::format("parameters of dtype {} are not supported (use f32, bf16 or f16)",
                       dtype_name(view.dtype)));
  }
}

void load_floats(const TensorView& view, float* values) {
  int64_t n = numel(view);
  switch (view.dtype) {
    case DType::kF32:
      std::memcpy(values, view.data, n * sizeof(float));
      return;
    case DType::kBF16: {
      auto* p = static_cast<const uint16_t*>(view.data);
      for (int64_t i = 0; i < n; ++i) values[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::kF16: {
      auto* p = static_cast<const uint16_t*>(view.data);
      for (int64_t i = 0; i < n; ++i) values[i] = f16_to_f32(p[i]);
      return;
    }
    default:
      fail(Code::kInvalidArgument,
           fmt::format("tensors of dtype {} cannot be read as floats", dtype_name(view.dtype)));
  }
}

int64_t Parameter::numel() const { return loom::numel(value); }

ParameterSet::ParameterSet(IHost& host, IModule& root, Device device)
    : host_(host), device_(device) {
  walk(root, "");
}

ParameterSet::~ParameterSet() {
  for (void* p : blocks_) host_.deallocate(device_, p);
}

void ParameterSet::walk(IModule& module, const std::string& path) {
  module_ids_.emplace(&module, modules_.size());
  modules_.emplace_back(path, &module);
  std::string prefix = path.empty() ? "" : path + ".";
  for (int32_t i = 0; i < module.param_count(); ++i) {
    ParamInfo info{};
    info.struct_size = sizeof(ParamInfo);
    throw_if_error(module.param_info(i, &info));
    std::string name = prefix + (info.name != nullptr ? info.name : fmt::format("param{}", i));
    if (info.ndim < 0 || info.ndim > kMaxDims)
      fail(Code::kInvalidArgument,
           fmt::format("parameter {}: rank {} out of range", name, info.ndim));
    for (const Parameter& p : params_)
      if (p.name == name)
        fail(Code::kInvalidArgument,
             fmt::format("parameter {} is declared twice: give the modules distinct names", name));
    Parameter p{name, &module, i, info, {}, {}};
    int64_t count = 1;
    for (int32_t d = 0; d < info.ndim; ++d) count *= info.shape[d];
    auto alloc = [&](DType dtype) {
      void* mem = nullptr;
      uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
      throw_if_error(host_.allocate(device_, bytes, 64, &mem));
      if (mem != nullptr) {
        std::memset(mem, 0, bytes);  // CPU only; a device allocator zeroes on its side
        blocks_.push_back(mem);
      }
      TensorView v{};
      v.data = mem;
      v.dtype = dtype;
      v.device = device_;
      v.ndim = info.ndim;
      int64_t stride = 1;
      for (int32_t d = info.ndim - 1; d >= 0; --d) {
        v.shape[d] = info.shape[d];
        v.strides[d] = stride;
        stride *= info.shape[d];
      }
      return v;
    };
    if (dtype_size(info.dtype) == 0)
      fail(Code::kInvalidArgument, fmt::format("parameter {}: invalid dtype", name));
    p.value = alloc(info.dtype);
    p.grad = alloc(DType::kF32);
    throw_if_error(module.bind_param(i, &p.value, &p.grad));
    params_.push_back(std::move(p));
  }
  for (int32_t i = 0; i < module.child_count(); ++i) {
    StringView child_name{};
    IModule* child = nullptr;
    throw_if_error(module.child(i, &child_name, &child));
    if (child == nullptr) continue;
    walk(*child, prefix + std::string(child_name.data, child_name.size));
  }
}

void ParameterSet::initialize(uint64_t seed) {
  std::vector<float> values;
  for (Parameter& p : params_) {
    int64_t n = p.numel();
    values.assign(static_cast<size_t>(n), 0.f);
    uint64_t stream = hash_name(p.name);
    switch (p.info.init) {
      case ParamInit::kZeros:
        break;
      case ParamInit::kOnes:
        values.assign(static_cast<size_t>(n), 1.f);
        break;
      case ParamInit::kNormal:
      case ParamInit::kScaledNormal:
        fill_normal(values.data(), n, p.info.init_std, seed, stream);
        break;
      case ParamInit::kUniform:
        fill_uniform(values.data(), n, p.info.init_std, seed, stream);
        break;
      case ParamInit::kCustom:
        throw_if_error(p.module->init_param(p.index, mix64(seed ^ stream)));
        continue;
    }
    store_floats(values.data(), p.value);
  }
}

void ParameterSet::zero_grads() {
  for (Parameter& p : params_)
    if (p.grad.data != nullptr) std::memset(p.grad.data, 0, p.numel() * sizeof(float));
}

Parameter* ParameterSet::find(const std::string& name) {
  for (Parameter& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t ParameterSet::numel() const {
  int64_t n = 0;
  for (const Parameter& p : params_) n += p.numel();
  return n;
}

}  // namespace loom::core
