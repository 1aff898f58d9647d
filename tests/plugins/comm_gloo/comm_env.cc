#include "tests/plugins/comm_gloo/comm_env.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "loom/cpp/half.h"
#include "loom/kinds.h"

namespace loom::testing {
namespace fs = std::filesystem;

Status InMemoryStore::set(StringView key, const void* value, uint64_t size) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[std::string(key.data, key.size)] =
        std::string(static_cast<const char*>(value), static_cast<size_t>(size));
  }
  changed_.notify_all();
  return ok_status();
}

Status InMemoryStore::get(StringView key, void* value, uint64_t capacity, uint64_t* size,
                          int64_t timeout_ms) noexcept {
  const std::string k(key.data, key.size);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                         [&] { return values_.count(k) != 0; }))
    return make_status(Code::kDeadlineExceeded, ("key '" + k + "' was not set in time").c_str());
  const std::string& v = values_[k];
  std::memcpy(value, v.data(), std::min<size_t>(v.size(), capacity));
  *size = v.size();
  return ok_status();
}

Outcome outcome(Status status) {
  Outcome o{status.code, status.message != nullptr ? status.message : ""};
  status_release(&status);
  return o;
}

namespace {
core::PluginManager& plugins() {
  static core::PluginManager* manager = [] {
    std::vector<core::SearchRoot> roots{{fs::absolute("plugins/comm_gloo"), "test"}};
    auto* m = new core::PluginManager(core::Catalog(roots));  // lives until exit
    m->load("comm_gloo");
    return m;
  }();
  return *manager;
}
}  // namespace

ObjectPtr make_backend(const nlohmann::json& node) {
  static std::mutex mutex;  // the plugin manager is not made for concurrent builds
  std::lock_guard<std::mutex> lock(mutex);
  return core::build_component(plugins(), node, kinds::kCommBackend, "/parallel/comm");
}

ICommBackend* as_backend(const ObjectPtr& object) {
  return interface_cast<ICommBackend>(object.get());
}

Group connect_group(int size, const std::string& key, InMemoryStore& store,
                    const nlohmann::json& node) {
  Group group;
  for (int r = 0; r < size; ++r) group.backends.push_back(make_backend(node));
  std::vector<ICommunicator*> raw(size, nullptr);
  std::vector<Outcome> outcomes(size);
  run_ranks(size, [&](int r) {
    outcomes[r] = outcome(as_backend(group.backends[r])
                              ->create_communicator(&store, {key.data(), key.size()}, r, size,
                                                    DeviceType::kCpu, &raw[r]));
  });
  for (int r = 0; r < size; ++r) {
    if (outcomes[r].code != Code::kOk)
      ADD_FAILURE() << "rank " << r << ": " << code_name(outcomes[r].code) << ": "
                    << outcomes[r].message;
    group.comms.emplace_back(raw[r]);
  }
  return group;
}

void run_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

}  // namespace loom::testing

namespace loom::testing {

TensorView HostTensor::view() {
  int64_t shape = static_cast<int64_t>(n);
  return make_view(bytes.data(), dtype, &shape, 1);
}

void HostTensor::set(size_t i, double value) {
  unsigned char* at = bytes.data() + i * dtype_size(dtype);
  auto put = [&](auto v) { std::memcpy(at, &v, sizeof(v)); };
  switch (dtype) {
    case DType::kF32:
      return put(static_cast<float>(value));
    case DType::kF64:
      return put(value);
    case DType::kBF16:
      return put(f32_to_bf16(static_cast<float>(value)));
    case DType::kF16:
      return put(f32_to_f16(static_cast<float>(value)));
    case DType::kI32:
      return put(static_cast<int32_t>(value));
    case DType::kI64:
      return put(static_cast<int64_t>(value));
    case DType::kU8:
      return put(static_cast<uint8_t>(value));
    default:
      throw std::runtime_error("HostTensor: unsupported dtype");
  }
}

double HostTensor::get(size_t i) const {
  const unsigned char* at = bytes.data() + i * dtype_size(dtype);
  auto read = [&](auto zero) {
    decltype(zero) v;
    std::memcpy(&v, at, sizeof(v));
    return v;
  };
  switch (dtype) {
    case DType::kF32:
      return read(float{});
    case DType::kF64:
      return read(double{});
    case DType::kBF16:
      return bf16_to_f32(read(uint16_t{}));
    case DType::kF16:
      return f16_to_f32(read(uint16_t{}));
    case DType::kI32:
      return read(int32_t{});
    case DType::kI64:
      return static_cast<double>(read(int64_t{}));
    case DType::kU8:
      return read(uint8_t{});
    default:
      throw std::runtime_error("HostTensor: unsupported dtype");
  }
}

std::vector<double> HostTensor::values() const {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = get(i);
  return out;
}

}  // namespace loom::testing
