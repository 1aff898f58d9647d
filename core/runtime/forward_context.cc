#include "core/runtime/forward_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "loom/cpp/error.h"
#include "loom/cpp/tensor.h"
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
  for (auto& [key, block] : blocks_)
    host_.deallocate(Device{static_cast<DeviceType>(key.first.first), key.first.second},
                     reinterpret_cast<void*>(key.second));
  blocks_.clear();
  saved_.clear();
  bytes_ = 0;
  loss_grad_ = {};  // its memory may have been one of the blocks
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

Status ForwardContext::metric(StringView name, const TensorView* value,
                              MetricReduce reduce) noexcept {
  return guard([&] {
    std::string text = name.size > 0 ? std::string(name.data, name.size) : std::string();
    if (text.empty() || text.find_first_of(" \t\n") != std::string::npos)
      fail(Code::kInvalidArgument,
           fmt::format("metric name '{}': give a non-empty name without spaces, e.g. "
                       "\"moe/aux_loss/layer_3\"",
                       text));
    if (value == nullptr || value->data == nullptr || value->dtype != DType::kF32 ||
        numel(*value) != 1)
      fail(Code::kInvalidArgument,
           fmt::format("metric {}: the value must be an f32 tensor of one element", text));
    if (reduce != MetricReduce::kMean && reduce != MetricReduce::kMax)
      fail(Code::kInvalidArgument,
           fmt::format("metric {}: unknown reduce {}", text, static_cast<int32_t>(reduce)));
    if (capturing_ && metric_sink_ != nullptr) {
      std::string refusal = fmt::format(
          "a module reports metric {} (the host takes metric values, which a graph's replay "
          "does not hand it)",
          text);
      if (capture_refusal_.empty()) capture_refusal_ = refusal;
      fail(Code::kFailedPrecondition, refusal);
    }
    if (training_ && metric_sink_ != nullptr) metric_sink_->record(text, *value, reduce);
  });
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

int32_t ForwardContext::grad_first_write(const TensorView* grad) noexcept {
  if (!training_ || !grad_claims_ || grad == nullptr || grad->data == nullptr) return 0;
  try {
    return grad_claims_(grad->data) ? 1 : 0;
  } catch (...) {  // a claim cannot fail; adding is always right
    return 0;
  }
}

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
    if (p != nullptr) {
      BlockKey key{{static_cast<int32_t>(device.type), device.index},
                   reinterpret_cast<uintptr_t>(p)};
      blocks_[key] = Block{bytes, 0, false};
    }
    bytes_ += bytes;
    v.data = p;
    *out = v;
  });
}

ForwardContext::Blocks::iterator ForwardContext::block_of(const TensorView& view) {
  if (view.data == nullptr) return blocks_.end();
  BlockKey key{{static_cast<int32_t>(view.device.type), view.device.index},
               reinterpret_cast<uintptr_t>(view.data)};
  auto it = blocks_.upper_bound(key);  // the first block starting after the view
  if (it == blocks_.begin()) return blocks_.end();
  --it;
  if (it->first.first != key.first ||
      key.second >= it->first.second + std::max<uint64_t>(it->second.bytes, 1))
    return blocks_.end();
  return it;
}

void ForwardContext::maybe_free(Blocks::iterator it) {
  if (!it->second.released || it->second.saves > 0) return;
  const BlockKey& key = it->first;
  host_.deallocate(Device{static_cast<DeviceType>(key.first.first), key.first.second},
                   reinterpret_cast<void*>(key.second));
  bytes_ -= it->second.bytes;
  blocks_.erase(it);
}

void ForwardContext::unref(const Saved& entry) {
  if (!entry.counted) return;
  auto it = block_of(entry.view);
  if (it == blocks_.end()) return;  // cannot happen: a counted block stays live
  --it->second.saves;
  maybe_free(it);
}

Status ForwardContext::save(const void* owner, int32_t slot, const TensorView* tensor) noexcept {
  return guard([&] {
    // Parameters, the core's batch and empty views are not this context's: no reference.
    Saved entry{*tensor, false};
    auto block = block_of(*tensor);
    if (block != blocks_.end()) {
      ++block->second.saves;
      entry.counted = true;
    }
    auto [it, inserted] = saved_.try_emplace({owner, slot}, entry);
    if (!inserted) {  // full recomputation saves again: the new entry replaces the old
      Saved old = it->second;
      it->second = entry;
      unref(old);
    }
  });
}

Status ForwardContext::release(const TensorView* tensor) noexcept {
  return guard([&] {
    auto it = block_of(*tensor);
    if (it == blocks_.end() || it->second.released)
      fail(Code::kInvalidArgument,
           fmt::format("release: the tensor at {} ({}) is not live memory of this forward "
                       "context (released twice, or not from its allocate); release each "
                       "allocation once, and never inputs, outputs or parameters",
                       tensor->data, shape_string(*tensor)));
    it->second.released = true;
    maybe_free(it);
  });
}

void ForwardContext::drop_saved(const void* owner) noexcept {
  auto first = saved_.lower_bound({owner, INT32_MIN});
  auto last = first;
  while (last != saved_.end() && last->first.first == owner) ++last;
  std::vector<Saved> dropped;
  for (auto it = first; it != last; ++it) dropped.push_back(it->second);
  saved_.erase(first, last);
  for (const Saved& entry : dropped) unref(entry);
}

Status ForwardContext::load(const void* owner, int32_t slot, TensorView* out) noexcept {
  auto it = saved_.find({owner, slot});
  if (it == saved_.end())
    return make_status(Code::kNotFound,
                       fmt::format("nothing saved in slot {} of this module for micro-batch {}: "
                                   "was forward run with training on?",
                                   slot, micro_batch_)
                           .c_str());
  *out = it->second.view;
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
  if (capturing_ && capture_refusal_.empty())
    capture_refusal_ = fmt::format(
        "a module asked for a random stream (purpose {}; dropout, which draws new numbers each "
        "step while a graph replays the capture's): set the model's dropout probabilities to 0",
        purpose);
  uint64_t k = mix64(seed_ ^ 0x6c6f6f6d72616e64ull);  // "loomrand"
  k = mix64(k ^ static_cast<uint64_t>(step_));
  k = mix64(k ^ static_cast<uint64_t>(micro_batch_));
  k = mix64(k ^ id);
  k = mix64(k ^ purpose);
  *key = k;
  *counter = 0;
}

}  // namespace loom::core
