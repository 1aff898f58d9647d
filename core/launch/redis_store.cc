#include "core/launch/redis_store.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <charconv>

#include "core/util/errors.h"

namespace loom::core::launch {
namespace {

// Connecting and every command give up after this long, so a server that went away makes
// the rank fail with a message instead of hanging (the wait for a key has its own timeout).
constexpr timeval kIoTimeout = {10, 0};

bool parse_int(std::string_view text, int* out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

RedisAddress parse_redis_address(const std::string& address) {
  const std::string bad = fmt::format(
      "rendezvous address '{}': expected redis://HOST:PORT or redis://HOST:PORT/DB", address);
  constexpr std::string_view kScheme = "redis://";
  if (address.rfind(kScheme, 0) != 0) throw UsageError(bad);
  std::string_view rest = std::string_view(address).substr(kScheme.size());
  RedisAddress parsed;
  parsed.text = address;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!parse_int(db, &parsed.db) || parsed.db < 0)) throw UsageError(bad);
    rest = rest.substr(0, slash);
  }
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) {
    parsed.host = std::string(rest);
  } else {
    parsed.host = std::string(rest.substr(0, colon));
    if (!parse_int(rest.substr(colon + 1), &parsed.port) || parsed.port < 1 || parsed.port > 65535)
      throw UsageError(bad);
  }
  if (parsed.host.empty()) throw UsageError(bad);
  return parsed;
}

RedisStore::RedisStore(RedisAddress address, std::string prefix)
    : address_(std::move(address)), prefix_(std::move(prefix)) {
  std::lock_guard<std::mutex> lock(mutex_);
  connect();
}

RedisStore::~RedisStore() {
  if (context_ != nullptr) redisFree(context_);
}

std::string RedisStore::describe() const {
  return fmt::format("Redis store redis://{}:{}/{} (prefix {})", address_.host, address_.port,
                     address_.db, prefix_);
}

void RedisStore::connect() {
  if (context_ != nullptr) redisFree(context_);
  context_ = redisConnectWithTimeout(address_.host.c_str(), address_.port, kIoTimeout);
  std::string problem;
  if (context_ == nullptr)
    problem = "out of memory";
  else if (context_->err != 0)
    problem = context_->errstr;
  if (problem.empty() && redisSetTimeout(context_, kIoTimeout) != REDIS_OK)
    problem = "cannot set the socket timeout";
  if (problem.empty() && address_.db != 0) {
    auto* reply = static_cast<redisReply*>(redisCommand(context_, "SELECT %d", address_.db));
    if (reply == nullptr)
      problem = context_->errstr;
    else if (reply->type == REDIS_REPLY_ERROR)
      problem = fmt::format("SELECT {}: {}", address_.db, std::string(reply->str, reply->len));
    if (reply != nullptr) freeReplyObject(reply);
  }
  if (!problem.empty()) {
    if (context_ != nullptr) redisFree(context_);
    context_ = nullptr;
    throw Error(Code::kUnavailable,
                fmt::format("rendezvous: cannot reach the Redis server at {}:{} ({}); start it, "
                            "check the host and port, or use a directory on a shared file "
                            "system (--rdzv DIR)",
                            address_.host, address_.port, problem));
  }
}

std::optional<std::string> RedisStore::command(const std::string& what, int argc, const char** argv,
                                               const size_t* lengths) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int attempt = 0;; ++attempt) {
    if (context_ == nullptr) connect();
    auto* reply = static_cast<redisReply*>(redisCommandArgv(context_, argc, argv, lengths));
    if (reply == nullptr) {
      // The connection is broken (server restarted, idle timeout): reopen it once.
      std::string problem = context_->errstr;
      redisFree(context_);
      context_ = nullptr;
      if (attempt == 0) continue;
      throw Error(Code::kUnavailable,
                  fmt::format("rendezvous: {} on the Redis server at {}:{} failed: {}", what,
                              address_.host, address_.port, problem));
    }
    std::optional<std::string> result;
    std::string error;
    if (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS)
      result = std::string(reply->str, reply->len);
    else if (reply->type == REDIS_REPLY_ERROR)
      error = std::string(reply->str, reply->len);
    freeReplyObject(reply);
    if (!error.empty())
      throw Error(Code::kUnavailable,
                  fmt::format("rendezvous: {} on the Redis server at {}:{} was refused: {}", what,
                              address_.host, address_.port, error));
    return result;
  }
}

void RedisStore::write(const std::string& key, const std::string& value) {
  std::string full = prefix_ + "/" + key;
  const char* argv[] = {"SET", full.data(), value.data()};
  const size_t lengths[] = {3, full.size(), value.size()};
  command("SET " + full, 3, argv, lengths);
}

std::optional<std::string> RedisStore::read(const std::string& key) {
  std::string full = prefix_ + "/" + key;
  const char* argv[] = {"GET", full.data()};
  const size_t lengths[] = {3, full.size()};
  return command("GET " + full, 2, argv, lengths);
}

}  // namespace loom::core::launch
