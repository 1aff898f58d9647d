#include "plugins/comm_gloo/store_adapter.h"

#include <algorithm>
#include <utility>

namespace loom::comm_gloo {
namespace {

// Rendezvous values are a few hundred bytes (one TCP address per peer): one read suffices.
constexpr uint64_t kFirstReadBytes = 4096;

StringView view_of(const std::string& s) { return StringView{s.data(), s.size()}; }

void throw_store_error(Status status, const std::string& what, const std::string& key) {
  Code code = status.code;
  std::string message = take_message(&status);
  fail(code, "rendezvous store " + what + " '" + key + "': " + message);
}

}  // namespace

StoreAdapter::StoreAdapter(IRendezvousStore* store, std::string group_key,
                           std::chrono::milliseconds timeout)
    : store_(store), group_key_(std::move(group_key)), timeout_(timeout) {}

std::string StoreAdapter::full_key(const std::string& key) const {
  return group_key_ + "/gloo/" + key;
}

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  const std::string k = full_key(key);
  Status status = store_->set(view_of(k), data.data(), data.size());
  if (status.code != Code::kOk) throw_store_error(status, "set", k);
}

std::vector<char> StoreAdapter::read(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string k = full_key(key);
  std::vector<char> value(kFirstReadBytes);
  for (;;) {
    uint64_t size = 0;
    Status status = store_->get(view_of(k), value.data(), value.size(), &size,
                                std::max<int64_t>(timeout.count(), 1));
    if (status.code != Code::kOk) throw_store_error(status, "get", k);
    if (size <= value.size()) {
      value.resize(size);
      return value;
    }
    value.resize(size);  // the key exists now: the second read does not wait
  }
}

std::vector<char> StoreAdapter::get(const std::string& key) { return read(key, timeout_); }

void StoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreAdapter::wait(const std::vector<std::string>& keys,
                        const std::chrono::milliseconds& timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (const std::string& key : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    read(key, std::max(left, std::chrono::milliseconds(1)));
  }
}

}  // namespace loom::comm_gloo
