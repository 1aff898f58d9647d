#include "core/runtime/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "loom/cpp/error.h"
#include "loom/cpp/op_args.h"

namespace loom::core {
namespace {

std::string shape_text(const TensorView& v) {
  std::string s = "(";
  for (int32_t i = 0; i < v.ndim; ++i) s += (i ? ", " : "") + std::to_string(v.shape[i]);
  return s + ")";
}

}  // namespace

KvCache::KvCache(IHost& host, int64_t batch, int64_t capacity, Device device)
    : host_(host), batch_(batch), capacity_(capacity), device_(device) {
  if (batch < 1 || capacity < 1)
    fail(Code::kInvalidArgument,
         fmt::format("kv cache: batch {} and capacity {} must both be >= 1", batch, capacity));
}

KvCache::~KvCache() {
  for (auto& [owner, slot] : slots_)
    for (void* p : {slot.k, slot.v, slot.k_scratch, slot.v_scratch}) host_.deallocate(device_, p);
  for (auto& [key, state] : states_) host_.deallocate(device_, state.data);
}

Status KvCache::state(const void* owner, int32_t slot, DType dtype, int32_t ndim,
                      const int64_t* shape, TensorView* out) noexcept {
  return guard([&] {
    std::vector<int64_t> dims(shape, shape + std::max(ndim, 0));
    auto text = [](const std::vector<int64_t>& d) {
      std::string s = "(";
      for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
      return s + ")";
    };
    bool positive = true;
    for (int64_t d : dims) positive = positive && d >= 1;
    if (ndim < 1 || ndim > kMaxDims || dims[0] != batch_ || !positive || dtype_size(dtype) == 0)
      fail(Code::kInvalidArgument,
           fmt::format("kv cache state: slot {} asks for {} {}; a state is (B, ...) with B = {} "
                       "(the cache's batch), at most {} positive dimensions",
                       slot, dtype_name(dtype), text(dims), batch_, kMaxDims));
    auto key = std::make_pair(owner, slot);
    auto it = states_.find(key);
    if (it == states_.end()) {
      State s;
      s.dtype = dtype;
      s.shape = dims;
      uint64_t bytes = dtype_size(dtype);
      for (int64_t d : dims) bytes *= static_cast<uint64_t>(d);
      s.data = allocate(bytes);
      throw_if_error(host_.fill_zero(device_, s.data, bytes), "kv cache state");
      bytes_ += bytes;
      it = states_.emplace(key, std::move(s)).first;
    } else if (it->second.dtype != dtype || it->second.shape != dims) {
      fail(Code::kInvalidArgument,
           fmt::format("kv cache state: slot {} of this layer was {} {} and is now asked as {} "
                       "{}; one cache serves one model",
                       slot, dtype_name(it->second.dtype), text(it->second.shape),
                       dtype_name(dtype), text(dims)));
    }
    TensorView v{};
    v.data = it->second.data;
    v.dtype = dtype;
    v.device = device_;
    v.ndim = ndim;
    int64_t stride = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {
      v.shape[i] = dims[static_cast<size_t>(i)];
      v.strides[i] = stride;
      stride *= dims[static_cast<size_t>(i)];
    }
    *out = v;
  });
}

void KvCache::copy(void* to, const void* from, size_t bytes) {
  throw_if_error(host_.copy(device_, to, device_, from, bytes), "kv cache");
}

void* KvCache::allocate(uint64_t bytes) {
  void* p = nullptr;
  throw_if_error(host_.allocate(device_, bytes, 64, &p), "kv cache");
  return p;
}

KvCache::Slot& KvCache::slot_for(const void* owner, const TensorView& k, const TensorView& v) {
  int64_t g = k.shape[2], d = k.shape[3], dv = v.shape[3];
  auto it = slots_.find(owner);
  if (it != slots_.end()) {
    const Slot& s = it->second;
    if (s.dtype != k.dtype || s.groups != g || s.head_dim != d || s.v_dim != dv)
      fail(Code::kInvalidArgument,
           fmt::format("kv cache append: this layer cached {} keys with G = {}, D = {} (values "
                       "{}) before and now appends {} with G = {}, D = {} (values {}); one cache "
                       "serves one model",
                       dtype_name(s.dtype), s.groups, s.head_dim, s.v_dim, dtype_name(k.dtype), g,
                       d, dv));
    return it->second;
  }
  Slot s;
  s.dtype = k.dtype;
  s.groups = g;
  s.head_dim = d;
  s.v_dim = dv;
  const uint64_t positions = static_cast<uint64_t>(batch_ * capacity_ * g);
  const uint64_t k_bytes = positions * static_cast<uint64_t>(d) * dtype_size(k.dtype);
  const uint64_t v_bytes = positions * static_cast<uint64_t>(dv) * dtype_size(k.dtype);
  try {
    s.k = allocate(k_bytes);
    s.v = allocate(v_bytes);
    if (batch_ > 1) {
      s.k_scratch = allocate(k_bytes);
      s.v_scratch = allocate(v_bytes);
    }
  } catch (...) {  // no half-made slot stays behind
    for (void* p : {s.k, s.v, s.k_scratch}) host_.deallocate(device_, p);
    throw;
  }
  bytes_ += (batch_ > 1 ? 2 : 1) * (k_bytes + v_bytes);
  return slots_.emplace(owner, s).first->second;
}

Status KvCache::append(const void* owner, const TensorView* k, const TensorView* v,
                       TensorView* k_all, TensorView* v_all) noexcept {
  return guard([&] {
    auto check = [&](const TensorView& x, const char* what) {
      if (x.data == nullptr || x.ndim != 4 || !is_contiguous(x) || x.shape[0] != batch_ ||
          x.device.type != device_.type || dtype_size(x.dtype) == 0)
        fail(Code::kInvalidArgument,
             fmt::format("kv cache append: {} must be a contiguous tensor (B, T, G, D) on the "
                         "cache's device ({}) with B = {} (the cache's batch), got {}{}",
                         what, device_type_name(device_.type), batch_,
                         x.data == nullptr ? "none " : "", shape_text(x)));
    };
    check(*k, "k");
    check(*v, "v");
    for (int32_t i = 0; i < 3; ++i)  // the last dimension (D of k, of v) may differ
      if (k->shape[i] != v->shape[i] || k->dtype != v->dtype)
        fail(Code::kInvalidArgument,
             fmt::format("kv cache append: k {} and v {} differ in (B, T, G) or dtype",
                         shape_text(*k), shape_text(*v)));
    int64_t t = k->shape[1], g = k->shape[2], d = k->shape[3], dv = v->shape[3];
    int64_t total = past_ + t;
    if (total > capacity_)
      fail(Code::kOutOfRange,
           fmt::format("kv cache full: {} cached + {} new positions exceed its capacity of {} "
                       "positions (the longest sequence it was made for); stop at {} tokens or "
                       "make the cache longer",
                       past_, t, capacity_, capacity_));
    Slot& slot = slot_for(owner, *k, *v);
    size_t row = static_cast<size_t>(g * d) * dtype_size(k->dtype);  // one position of k
    size_t v_row = static_cast<size_t>(g * dv) * dtype_size(k->dtype);
    auto* kb = static_cast<char*>(slot.k);
    auto* vb = static_cast<char*>(slot.v);
    const auto* kn = static_cast<const char*>(k->data);
    const auto* vn = static_cast<const char*>(v->data);
    for (int64_t b = 0; b < batch_; ++b) {  // sequence b occupies rows b * capacity ...
      const size_t to = static_cast<size_t>(b * capacity_ + past_);
      const size_t from = static_cast<size_t>(b * t);
      if (t > 0) {
        copy(kb + to * row, kn + from * row, static_cast<size_t>(t) * row);
        copy(vb + to * v_row, vn + from * v_row, static_cast<size_t>(t) * v_row);
      }
    }
    void* k_out = slot.k;
    void* v_out = slot.v;
    if (batch_ > 1) {  // gather each sequence's prefix into (B, total, G, D)
      auto* ks = static_cast<char*>(slot.k_scratch);
      auto* vs = static_cast<char*>(slot.v_scratch);
      const size_t n = static_cast<size_t>(total) * row, nv = static_cast<size_t>(total) * v_row;
      for (int64_t b = 0; b < batch_; ++b) {
        const size_t from = static_cast<size_t>(b * capacity_);
        copy(ks + static_cast<size_t>(b) * n, kb + from * row, n);
        copy(vs + static_cast<size_t>(b) * nv, vb + from * v_row, nv);
      }
      k_out = ks;
      v_out = vs;
    }
    auto view = [&](void* data, int64_t last) {
      TensorView out{};
      out.data = data;
      out.dtype = k->dtype;
      out.device = device_;
      out.ndim = 4;
      const int64_t shape[4] = {batch_, total, g, last};
      int64_t stride = 1;
      for (int32_t i = 3; i >= 0; --i) {
        out.shape[i] = shape[i];
        out.strides[i] = stride;
        stride *= shape[i];
      }
      return out;
    };
    *k_all = view(k_out, d);
    *v_all = view(v_out, dv);
  });
}

void KvCache::advance(int64_t t) {
  if (t < 0) fail(Code::kInvalidArgument, fmt::format("kv cache advance: {} < 0 positions", t));
  if (past_ + t > capacity_)
    fail(Code::kOutOfRange,
         fmt::format("kv cache full: {} cached + {} new positions exceed its capacity of {} "
                     "positions",
                     past_, t, capacity_));
  past_ += t;
}

}  // namespace loom::core
