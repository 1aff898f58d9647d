#include "core/launch/store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/launch/file_store.h"
#include "core/launch/redis_store.h"
#include "core/util/errors.h"

namespace loom::core::launch {

void Store::put(const std::string& key, const std::string& value) { write(key, value); }

std::optional<std::string> Store::try_get(const std::string& key) { return read(key); }

std::string Store::wait_get(const std::string& key, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + timeout;
  // Short first sleeps keep a rendezvous of local ranks fast; the cap keeps a long wait
  // (ranks still loading plugins) from hammering a shared file system or a Redis server.
  std::chrono::milliseconds pause{1};
  for (;;) {
    if (std::optional<std::string> value = read(key)) return std::move(*value);
    Clock::time_point now = Clock::now();
    if (timeout.count() >= 0 && now >= deadline)
      throw Error(Code::kDeadlineExceeded,
                  fmt::format("rendezvous key '{}' was not set in {} within {} ms; a rank "
                              "did not start, failed before writing it, or uses another run "
                              "id or rendezvous address (check every rank's output)",
                              key, describe(), timeout.count()));
    std::chrono::milliseconds sleep = pause;
    if (timeout.count() >= 0)
      sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(
                                  deadline - now + std::chrono::milliseconds(1)));
    std::this_thread::sleep_for(sleep);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

Status Store::set(StringView key, const void* value, uint64_t size) noexcept {
  return guard([&] {
    put(std::string(key.data, key.size),
        std::string(static_cast<const char*>(value), static_cast<size_t>(size)));
  });
}

Status Store::get(StringView key, void* value, uint64_t capacity, uint64_t* size,
                  int64_t timeout_ms) noexcept {
  return guard([&] {
    std::string bytes =
        wait_get(std::string(key.data, key.size), std::chrono::milliseconds(timeout_ms));
    if (size != nullptr) *size = bytes.size();
    if (value != nullptr)
      std::memcpy(value, bytes.data(), std::min<uint64_t>(capacity, bytes.size()));
  });
}

std::unique_ptr<Store> open_store(const std::string& address, const std::string& prefix) {
  if (prefix.empty())
    throw InvalidArgument("rendezvous store '" + address + "': the run id (key prefix) is empty");
  if (address.rfind("redis://", 0) == 0) {
    RedisAddress parsed = parse_redis_address(address);
    return std::make_unique<RedisStore>(parsed, prefix);
  }
  std::string dir = address.rfind("file:", 0) == 0 ? address.substr(5) : address;
  if (dir.empty())
    throw UsageError(
        fmt::format("rendezvous address '{}' names no directory; give a directory on a shared file "
                    "system (DIR or file:DIR) or redis://HOST:PORT",
                    address));
  if (address.find("://") != std::string::npos && address.rfind("file:", 0) != 0)
    throw UsageError(fmt::format(
        "rendezvous address '{}': unknown scheme; use DIR, file:DIR or redis://HOST:PORT[/DB]",
        address));
  return std::make_unique<FileStore>(dir, prefix);
}

}  // namespace loom::core::launch
