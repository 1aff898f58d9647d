#include "core/runtime/forward_context.h"

#include <fmt/format.h>

#include "loom/cpp/error.h"
#include "loom/kinds.h"

namespace loom::core {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

ForwardContext::ForwardContext(IHost& host, bool training, RecomputePolicy recompute,
                               int32_t micro_batch, uint64_t seed, int64_t step,
                               const std::unordered_map<const void*, uint64_t>* module_ids)
    : host_(host),
      training_(training),
      recompute_(recompute),
      micro_batch_(micro_batch),
      seed_(seed),
      step_(step),
      module_ids_(module_ids) {}

ForwardContext::~ForwardContext() { reset(); }

void ForwardContext::reset() {
  for (auto& [device, pointer] : blocks_) host_.deallocate(device, pointer);
  blocks_.clear();
  saved_.clear();
  bytes_ = 0;
}

void ForwardContext::set_kv_cache(IKvCache* cache) {
  if (cache != nullptr && training_)
    fail(Code::kFailedPrecondition,
         "forward context: a kv cache is for inference only; this context is training");
  kv_cache_ = cache;
}

void ForwardContext::set_grads_ready(std::function<void(const void*)> callback) {
  grads_ready_ = std::move(callback);
}

void ForwardContext::rethrow_grads_ready_error() {
  if (!grads_ready_error_) return;
  std::exception_ptr e = grads_ready_error_;
  grads_ready_error_ = nullptr;
  std::rethrow_exception(e);
}

void ForwardContext::grads_ready(const void* owner) noexcept {
  if (!grads_ready_ || grads_ready_error_) return;
  try {
    grads_ready_(owner);
  } catch (...) {
    grads_ready_error_ = std::current_exception();
  }
}

InterfaceInfo ForwardContext::interface_info() const noexcept { return kinds::kForwardContext; }

Status ForwardContext::allocate(DType dtype, int32_t ndim, const int64_t* shape, Device device,
                                TensorView* out) noexcept {
  return guard([&] {
    if (ndim < 0 || ndim > kMaxDims)
      fail(Code::kInvalidArgument,
           fmt::format("allocate: rank {} is outside 0..{}", ndim, kMaxDims));
    if (dtype_size(dtype) == 0)
      fail(Code::kInvalidArgument,
           fmt::format("allocate: invalid dtype {}", static_cast<int>(dtype)));
    TensorView v{};
    v.dtype = dtype;
    v.device = device;
    v.ndim = ndim;
    int64_t count = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {
      if (shape[i] < 0) fail(Code::kInvalidArgument, "allocate: negative extent");
      v.shape[i] = shape[i];
      v.strides[i] = count;
      count *= shape[i];
    }
    uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
    void* p = nullptr;
    throw_if_error(host_.allocate(device, bytes, 64, &p));
    if (p != nullptr) blocks_.emplace_back(device, p);
    bytes_ += bytes;
    v.data = p;
    *out = v;
  });
}

Status ForwardContext::save(const void* owner, int32_t slot, const TensorView* tensor) noexcept {
  return guard([&] { saved_[{owner, slot}] = *tensor; });
}

Status ForwardContext::load(const void* owner, int32_t slot, TensorView* out) noexcept {
  auto it = saved_.find({owner, slot});
  if (it == saved_.end())
    return make_status(Code::kNotFound,
                       fmt::format("nothing saved in slot {} of this module for micro-batch {}: "
                                   "was forward run with training on?",
                                   slot, micro_batch_)
                           .c_str());
  *out = it->second;
  return ok_status();
}

void ForwardContext::rng(const void* owner, uint64_t purpose, uint64_t* key,
                         uint64_t* counter) noexcept {
  uint64_t id = 0;
  auto known = module_ids_ != nullptr ? module_ids_->find(owner) : decltype(module_ids_->end()){};
  if (module_ids_ != nullptr && known != module_ids_->end()) {
    id = known->second;
  } else {
    auto [it, inserted] = extra_ids_.try_emplace(owner, (1ull << 32) + extra_ids_.size());
    id = it->second;
  }
  uint64_t k = mix64(seed_ ^ 0x6c6f6f6d72616e64ull);  // "loomrand"
  k = mix64(k ^ static_cast<uint64_t>(step_));
  k = mix64(k ^ static_cast<uint64_t>(micro_batch_));
  k = mix64(k ^ id);
  k = mix64(k ^ purpose);
  *key = k;
  *counter = 0;
}

}  // namespace loom::core
