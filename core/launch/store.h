// The rendezvous store ranks share to find each other (DESIGN.md section 5): a key-value
// store over a directory on a shared file system (FileStore) or a Redis server
// (RedisStore). Communication backends receive it as a loom::IRendezvousStore; the core
// uses the throwing helpers below.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "loom/kinds/comm_backend.h"

namespace loom::core::launch {

/// A rendezvous store. Keys are byte strings; every key lives under the store's prefix (a
/// run id), so runs sharing a directory or a Redis server never see each other's keys.
/// Values are written once and read by any number of ranks; a later put replaces them.
/// Thread-safe: a communicator may use the store from its own thread.
class Store : public IRendezvousStore {
 public:
  virtual ~Store() = default;

  /// Sets `key` to `value`, replacing any previous value. Throws loom::Error (kIoError for
  /// a file store, kUnavailable for a server that cannot be reached) naming the store.
  void put(const std::string& key, const std::string& value);

  /// The value of `key`, or nothing when it is not set yet. Never waits.
  std::optional<std::string> try_get(const std::string& key);

  /// The value of `key`, polling (1 ms growing to 50 ms between tries) until it is set.
  /// \param key      the key to wait for
  /// \param timeout  how long to wait; negative waits for ever
  /// Throws loom::Error(kDeadlineExceeded) naming the key, the store and the timeout when
  /// it is not set in time (usually: a rank did not start or failed before writing it).
  std::string wait_get(const std::string& key, std::chrono::milliseconds timeout);

  /// Where the store lives, for messages: "file store /shared/rdzv/run-1" or
  /// "Redis store redis://host:6379/0 (prefix run-1)".
  virtual std::string describe() const = 0;

  // loom::IRendezvousStore, for plugins: the helpers above behind a Status. `get` stores
  // the full size of the value in *size even when it is larger than `capacity` (then only
  // `capacity` bytes are copied), so a caller can retry with a bigger buffer.
  Status set(StringView key, const void* value, uint64_t size) noexcept override;
  Status get(StringView key, void* value, uint64_t capacity, uint64_t* size,
             int64_t timeout_ms) noexcept override;

 protected:
  /// Stores `value` under `key` (unprefixed: the implementation adds its prefix).
  virtual void write(const std::string& key, const std::string& value) = 0;
  /// The value under `key`, or nothing; must not wait.
  virtual std::optional<std::string> read(const std::string& key) = 0;
};

/// Opens the store at `address`.
/// \param address  "DIR" or "file:DIR" (a directory, on a shared file system when ranks
///                 run on several machines; created when missing), or
///                 "redis://HOST:PORT" with an optional "/DB" (database number)
/// \param prefix   the run id every key is put under (must not be empty)
/// Throws core::UsageError for a malformed address, IoError for a directory that cannot be
/// created or written, loom::Error(kUnavailable) for a Redis server that cannot be reached.
std::unique_ptr<Store> open_store(const std::string& address, const std::string& prefix);

}  // namespace loom::core::launch
