// RedisStore against a real redis-server that the test starts on a free loopback port.
#include "core/launch/redis_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "core/util/errors.h"

using ::testing::HasSubstr;
using namespace std::chrono_literals;

namespace loom::core::launch {
namespace {

constexpr const char* kRedisServer = "/usr/bin/redis-server";

// A port nothing listens on right now (the kernel's choice for an ephemeral bind).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

bool accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kRedisServer, X_OK) != 0)
      FAIL() << kRedisServer << " is missing: run tools/setup (it installs redis-server)";
    port_ = free_port();
    std::string port = std::to_string(port_);
    server_ = fork();
    ASSERT_GE(server_, 0);
    if (server_ == 0) {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      execl(kRedisServer, kRedisServer, "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!accepts(port_)) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "redis-server did not start";
      int status = 0;
      ASSERT_EQ(waitpid(server_, &status, WNOHANG), 0) << "redis-server exited at start";
      std::this_thread::sleep_for(10ms);
    }
  }
  void TearDown() override {
    if (server_ > 0) {
      kill(server_, SIGKILL);
      waitpid(server_, nullptr, 0);
    }
  }
  std::string address(const std::string& db = "") {
    return "redis://127.0.0.1:" + std::to_string(port_) + db;
  }

  int port_ = 0;
  pid_t server_ = -1;
};

TEST_F(RedisStoreTest, PutGetAndPrefixes) {
  std::unique_ptr<Store> a = open_store(address(), "run-a");
  std::unique_ptr<Store> b = open_store(address(), "run-b");
  EXPECT_EQ(a->try_get("k"), std::nullopt);
  a->put("k", std::string("v\0x", 3));
  EXPECT_EQ(a->wait_get("k", 100ms), std::string("v\0x", 3));
  EXPECT_EQ(b->try_get("k"), std::nullopt);
  EXPECT_EQ(a->describe(),
            "Redis store redis://127.0.0.1:" + std::to_string(port_) + "/0 (prefix run-a)");
}

TEST_F(RedisStoreTest, DatabasesAreSeparate) {
  std::unique_ptr<Store> db3 = open_store(address("/3"), "run");
  std::unique_ptr<Store> db0 = open_store(address(), "run");
  db3->put("k", "three");
  EXPECT_EQ(db0->try_get("k"), std::nullopt);
  EXPECT_EQ(open_store(address("/3"), "run")->try_get("k"), "three");
}

TEST_F(RedisStoreTest, ValuesCrossProcessesAndWaitsTimeOut) {
  std::unique_ptr<Store> store = open_store(address(), "run");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      std::unique_ptr<Store> mine = open_store(address(), "run");
      mine->put("pong", mine->wait_get("ping", 5000ms) + " back");
      _exit(0);
    } catch (...) {
      _exit(1);
    }
  }
  store->put("ping", "hi");
  EXPECT_EQ(store->wait_get("pong", 5000ms), "hi back");
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  try {
    store->wait_get("never", 50ms);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kDeadlineExceeded);
    EXPECT_THAT(e.what(), HasSubstr("'never'"));
    EXPECT_THAT(e.what(), HasSubstr("Redis store redis://127.0.0.1:"));
    EXPECT_THAT(e.what(), HasSubstr("within 50 ms"));
  }
}

TEST_F(RedisStoreTest, ServerGoneIsUnavailableNotAHang) {
  std::unique_ptr<Store> store = open_store(address(), "run");
  store->put("k", "before");
  kill(server_, SIGKILL);
  waitpid(server_, nullptr, 0);
  server_ = -1;
  try {
    store->put("k", "after");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kUnavailable);
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(port_)));
  }
}

TEST(RedisStore, UnreachableServerIsUnavailableNamingHostAndPort) {
  int port = free_port();
  try {
    open_store("redis://127.0.0.1:" + std::to_string(port), "run");
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kUnavailable);
    EXPECT_THAT(e.what(),
                HasSubstr("cannot reach the Redis server at 127.0.0.1:" + std::to_string(port)));
    EXPECT_THAT(e.what(), HasSubstr("--rdzv DIR"));
  }
}

TEST(RedisStore, AddressParsing) {
  RedisAddress a = parse_redis_address("redis://db.example:6380/2");
  EXPECT_EQ(a.host, "db.example");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.db, 2);
  a = parse_redis_address("redis://localhost");
  EXPECT_EQ(a.port, 6379);
  EXPECT_EQ(a.db, 0);
  for (const char* bad : {"redis://", "redis://:6379", "redis://h:0", "redis://h:70000",
                          "redis://h:port", "redis://h:1/x", "redis://h:1/-1", "redi://h:1"}) {
    try {
      parse_redis_address(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("expected redis://HOST:PORT")) << bad;
    }
  }
}

}  // namespace
}  // namespace loom::core::launch
