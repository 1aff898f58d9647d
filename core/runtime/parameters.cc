#include "core/runtime/parameters.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/runtime/forward_context.h"
#include "loom/cpp/error.h"
#include "loom/cpp/half.h"
#include "loom/cpp/tensor.h"

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

void keep_columns(std::vector<float>& rows, int64_t columns, int64_t keep) {
  if (keep <= 0 || columns <= keep) return;
  const int64_t n = static_cast<int64_t>(rows.size()) / columns;
  for (int64_t r = 1; r < n; ++r)
    std::copy_n(rows.begin() + r * columns, keep, rows.begin() + r * keep);
  rows.resize(static_cast<size_t>(n * keep));
}

void copy_to_host(IHost& host, const TensorView& view, void* out) {
  throw_if_error(host.copy(kCpu, out, view.device, view.data, nbytes(view)));
}

void copy_from_host(IHost& host, const void* in, const TensorView& view) {
  throw_if_error(host.copy(view.device, view.data, kCpu, in, nbytes(view)));
}

void store_floats(IHost& host, const float* values, const TensorView& view) {
  if (view.device.type != DeviceType::kCpu) {
    // Convert on the host, then one copy.
    std::vector<uint64_t> staging((nbytes(view) + 7) / 8);
    TensorView h = view;
    h.data = staging.data();
    h.device = kCpu;
    store_floats(values, h);
    copy_from_host(host, staging.data(), view);
    return;
  }
  store_floats(values, view);
}

void store_floats(const float* values, const TensorView& view) {
  if (view.device.type != DeviceType::kCpu)
    fail(Code::kInternal, "store_floats without a host on a device tensor");
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

void load_floats(IHost& host, const TensorView& view, float* values) {
  if (view.device.type != DeviceType::kCpu) {
    std::vector<uint64_t> staging((nbytes(view) + 7) / 8);
    copy_to_host(host, view, staging.data());
    TensorView h = view;
    h.data = staging.data();
    h.device = kCpu;
    load_floats(h, values);
    return;
  }
  load_floats(view, values);
}

void load_floats(const TensorView& view, float* values) {
  if (view.device.type != DeviceType::kCpu)
    fail(Code::kInternal, "load_floats without a host on a device tensor");
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

int64_t Parameter::numel() const {
  int64_t n = 1;
  for (int32_t d = 0; d < info.ndim; ++d) n *= info.shape[d];
  return n;
}

ParameterSet::ParameterSet(IHost& host, IModule& root, Device device, const BucketOptions& buckets)
    : ParameterSet(host, std::vector<IModule*>{&root}, device, buckets) {}

ParameterSet::ParameterSet(IHost& host, const std::vector<IModule*>& roots, Device device,
                           const BucketOptions& buckets)
    : host_(host), device_(device) {
  for (IModule* root : roots) walk(*root, "");
  try {
    allocate_flat(buckets);
  } catch (...) {
    for (void* p : blocks_) host_.deallocate(device_, p);
    blocks_.clear();
    throw;
  }
}

namespace {

TensorView view_at(void* base, DType dtype, int64_t offset, const ParamInfo& info, Device device) {
  return make_view(static_cast<char*>(base) + offset * static_cast<int64_t>(dtype_size(dtype)),
                   dtype, info.shape, info.ndim, device);
}

}  // namespace

void ParameterSet::allocate_flat(const BucketOptions& options) {
  // Buckets in backward order: the last declared parameters first; one group after the
  // other, so that a bucket holds the parameters of one reduction group only.
  int64_t offset = 0;
  constexpr int64_t kAlign = 16;  // elements: every parameter starts 64-byte aligned (f32)
  for (ParallelRole group : {ParallelRole::kData, ParallelRole::kExpertData}) {
    int64_t pad = std::max<int64_t>(
        group == ParallelRole::kData ? options.pad_multiple : options.expert_pad_multiple, 1);
    Bucket open;
    auto close = [&] {
      if (open.params.empty()) return;
      open.offset = offset;
      open.size = (open.size + pad - 1) / pad * pad;
      open.group = group;
      offset += open.size;
      buckets_.push_back(std::move(open));
      open = Bucket{};
    };
    for (size_t i = params_.size(); i-- > 0;) {
      if (params_[i].reduce_group() != group) continue;
      open.size = (open.size + kAlign - 1) / kAlign * kAlign;
      params_[i].offset = offset + open.size;
      open.size += params_[i].numel();
      open.params.push_back(i);
      if (options.bucket_elements > 0 && open.size >= options.bucket_elements) close();
    }
    close();
  }
  flat_size_ = offset;

  bool one_dtype = true;
  for (const Parameter& p : params_) one_dtype = one_dtype && p.info.dtype == params_[0].info.dtype;
  auto alloc = [&](DType dtype) {
    void* mem = nullptr;
    uint64_t bytes = static_cast<uint64_t>(flat_size_) * dtype_size(dtype);
    throw_if_error(host_.allocate(device_, bytes, 64, &mem));
    if (mem != nullptr) {
      blocks_.push_back(mem);
      throw_if_error(host_.fill_zero(device_, mem, bytes));
    }
    return mem;
  };
  void* grads = alloc(DType::kF32);
  flat_grads_ = make_view(grads, DType::kF32, {flat_size_}, device_);
  void* values = nullptr;
  if (one_dtype && !params_.empty()) {
    values = alloc(params_[0].info.dtype);
    flat_values_ = make_view(values, params_[0].info.dtype, {flat_size_}, device_);
  }
  for (Parameter& p : params_) {
    p.grad = view_at(grads, DType::kF32, p.offset, p.info, device_);
    if (values != nullptr) {
      p.value = view_at(values, p.info.dtype, p.offset, p.info, device_);
    } else {
      void* mem = nullptr;
      uint64_t bytes = static_cast<uint64_t>(p.numel()) * dtype_size(p.info.dtype);
      throw_if_error(host_.allocate(device_, bytes, 64, &mem));
      if (mem != nullptr) {
        blocks_.push_back(mem);
        throw_if_error(host_.fill_zero(device_, mem, bytes));
      }
      p.value = view_at(mem, p.info.dtype, 0, p.info, device_);
    }
    throw_if_error(p.module->bind_param(p.index, &p.value, &p.grad),
                   fmt::format("binding parameter {}", p.name));
  }
  index_overwrites();
}

ParameterSet::~ParameterSet() {
  for (void* p : blocks_) host_.deallocate(device_, p);
}

void ParameterSet::walk(IModule& module, const std::string& path) {
  // Keyed by the path, which names a module alike in every layout (a pipeline stage keeps
  // the whole model's layer numbers), so its random streams are the same in all of them.
  module_ids_.emplace(&module, hash_name(path));
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
    if (dtype_size(info.dtype) == 0)
      fail(Code::kInvalidArgument, fmt::format("parameter {}: invalid dtype", name));
    if (info.valid_rows < 0 ||
        (info.valid_rows > 0 && (info.ndim == 0 || info.valid_rows > info.global_shape[0])))
      fail(Code::kInvalidArgument,
           fmt::format("parameter {}: valid_rows {} outside its {} rows (ParamInfo::valid_rows)",
                       name, info.valid_rows, info.ndim == 0 ? 0 : info.global_shape[0]));
    Parameter p{name, &module, i, info, {}, {}};
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

void ParameterSet::initialize(uint64_t seed, const SplitRanks& ranks) {
  std::vector<float> values, local;
  for (Parameter& p : params_) {
    // The whole tensor is drawn and this rank keeps its slice, so that values do not
    // depend on the parallel layout.
    int64_t n = 1;
    for (int32_t d = 0; d < p.info.ndim; ++d) n *= p.info.global_shape[d];
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
    // Padding rows (a padded vocabulary) start at 0 and stay there; the valid rows take
    // the values an unpadded tensor would (its elements come first in the stream).
    if (p.info.ndim > 0 && p.valid_rows() < p.info.global_shape[0])
      std::fill(values.begin() + n / p.info.global_shape[0] * p.valid_rows(), values.end(), 0.f);
    if (n == p.numel()) {
      store_floats(host_, values.data(), p.value);
      continue;
    }
    // (outer, global[split], inner) -> (outer, local[split], inner) at this rank's offset.
    int32_t dim = p.info.tp_split_dim;
    if (dim < 0 || dim >= p.info.ndim)
      fail(Code::kInvalidArgument,
           fmt::format("parameter {}: its shape differs from its global shape but it names no "
                       "split dimension (tp_split_dim {})",
                       p.name, dim));
    int64_t outer = 1, inner = 1;
    for (int32_t d = 0; d < dim; ++d) outer *= p.info.shape[d];
    for (int32_t d = dim + 1; d < p.info.ndim; ++d) inner *= p.info.shape[d];
    int64_t g = p.info.global_shape[dim], l = p.info.shape[dim];
    local.resize(static_cast<size_t>(p.numel()));
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(local.data() + o * l * inner,
                  values.data() + (o * g + ranks.of(p.info) * l) * inner,
                  static_cast<size_t>(l * inner) * sizeof(float));
    store_floats(host_, local.data(), p.value);
  }
}

void ParameterSet::index_overwrites() {
  std::vector<std::pair<int64_t, int64_t>> kept;  // the overwrite gradients' ranges
  for (const Parameter& p : params_)
    if ((p.info.flags & kParamGradOverwrite) != 0 && p.grad.data != nullptr && p.numel() > 0) {
      overwrite_index_.emplace(p.grad.data, overwrite_index_.size());
      kept.emplace_back(p.offset, p.offset + p.numel());
      overwrite_elements_ += p.numel();
    }
  claimed_.assign(overwrite_index_.size(), 0);
  std::sort(kept.begin(), kept.end());
  int64_t at = 0;
  for (const auto& [begin, end] : kept) {
    if (begin > at) kept_complement_.emplace_back(at, begin);
    at = std::max(at, end);
  }
  if (flat_size_ > at) kept_complement_.emplace_back(at, flat_size_);
}

uint8_t* ParameterSet::claim_of(const Parameter& p) {
  if ((p.info.flags & kParamGradOverwrite) == 0 || p.grad.data == nullptr) return nullptr;
  auto it = overwrite_index_.find(p.grad.data);
  return it != overwrite_index_.end() ? &claimed_[it->second] : nullptr;
}

void ParameterSet::zero_grads(bool keep_overwrite) {
  std::fill(claimed_.begin(), claimed_.end(), uint8_t{0});
  kept_ = keep_overwrite && !overwrite_index_.empty();
  kept_elements_ = kept_ && flat_grads_.data != nullptr ? overwrite_elements_ : 0;
  if (flat_grads_.data == nullptr) return;
  if (!kept_) {
    throw_if_error(host_.fill_zero(device_, flat_grads_.data, nbytes(flat_grads_)));
    return;
  }
  float* base = static_cast<float*>(flat_grads_.data);
  for (const auto& [begin, end] : kept_complement_)
    throw_if_error(host_.fill_zero(device_, base + begin, static_cast<uint64_t>(end - begin) * 4));
}

void ParameterSet::zero_unclaimed() {
  if (!kept_) return;
  for (const Parameter& p : params_) {
    uint8_t* claimed = claim_of(p);
    if (claimed != nullptr && *claimed == 0)
      throw_if_error(host_.fill_zero(device_, p.grad.data, nbytes(p.grad)));
  }
  kept_ = false;
}

void ParameterSet::zero_unclaimed(const Bucket& bucket) {
  if (!kept_) return;
  for (size_t i : bucket.params) {
    const Parameter& p = params_[i];
    uint8_t* claimed = claim_of(p);
    if (claimed == nullptr || *claimed != 0) continue;
    throw_if_error(host_.fill_zero(device_, p.grad.data, nbytes(p.grad)));
    *claimed = 1;
  }
}

bool ParameterSet::claim_grad(const void* grad) {
  auto it = grad != nullptr ? overwrite_index_.find(grad) : overwrite_index_.end();
  if (it == overwrite_index_.end() || claimed_[it->second] != 0) return false;
  claimed_[it->second] = 1;
  return true;
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
