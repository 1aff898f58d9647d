// A rendezvous store on a Redis server, for clusters without a shared file system.
#pragma once

#include <mutex>
#include <optional>
#include <string>

#include "core/launch/store.h"

struct redisContext;

namespace loom::core::launch {

/// Where a Redis server is: redis://HOST:PORT[/DB].
struct RedisAddress {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string text;  ///< as given, for messages
};

/// Parses "redis://HOST:PORT" with an optional "/DB". Throws core::UsageError naming the
/// address and the expected form.
RedisAddress parse_redis_address(const std::string& address);

/// Keys are "<prefix>/<key>" on the server; set is SET, get polls GET. One connection,
/// shared under a lock; a broken connection is reopened once per operation.
class RedisStore : public Store {
 public:
  /// \param address  the server (and database)
  /// \param prefix   the run id put in front of every key
  /// Throws loom::Error(kUnavailable) naming HOST:PORT when the server cannot be reached.
  RedisStore(RedisAddress address, std::string prefix);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  std::string describe() const override;

 protected:
  void write(const std::string& key, const std::string& value) override;
  std::optional<std::string> read(const std::string& key) override;

 private:
  void connect();  // (re)opens context_ and selects the database; throws kUnavailable
  // Runs one command (argv form, binary safe); reconnects and retries once on an I/O error.
  // Returns the reply's string, or nothing for a nil reply.
  std::optional<std::string> command(const std::string& what, int argc, const char** argv,
                                     const size_t* lengths);

  RedisAddress address_;
  std::string prefix_;
  std::mutex mutex_;
  redisContext* context_ = nullptr;
};

}  // namespace loom::core::launch
