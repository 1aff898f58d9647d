// FileStore: values cross processes through a directory, waits time out with a message
// naming the key, and keys of any bytes map to safe, distinct file names.
#include "core/launch/file_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/util/errors.h"

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

namespace loom::core::launch {
namespace {

fs::path fresh(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / ("file_store_" + name);
  fs::remove_all(dir);
  return dir;
}

TEST(FileStore, PutThenGetAndTryGet) {
  std::unique_ptr<Store> store = open_store(fresh("put").string(), "run1");
  EXPECT_EQ(store->try_get("a"), std::nullopt);
  store->put("a", "hello");
  EXPECT_EQ(store->try_get("a"), "hello");
  EXPECT_EQ(store->wait_get("a", 0ms), "hello");
  store->put("a", std::string("bin\0ary\n", 8));  // replaces, binary safe
  EXPECT_EQ(store->wait_get("a", 10ms), std::string("bin\0ary\n", 8));
  EXPECT_EQ(store->describe(), "file store " + (fresh("put") / "run1").string());
}

TEST(FileStore, FileColonPrefixAndRunIsolation) {
  fs::path dir = fresh("isolation");
  std::unique_ptr<Store> a = open_store("file:" + dir.string(), "run-a");
  std::unique_ptr<Store> b = open_store(dir.string(), "run-b");
  a->put("k", "from a");
  EXPECT_EQ(b->try_get("k"), std::nullopt);
  EXPECT_EQ(open_store(dir.string(), "run-a")->try_get("k"), "from a");
}

TEST(FileStore, ValuesCrossProcesses) {
  fs::path dir = fresh("fork");
  std::unique_ptr<Store> store = open_store(dir.string(), "run");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The other rank: answers the ping with the ping's value and a suffix.
    try {
      std::unique_ptr<Store> mine = open_store(dir.string(), "run");
      std::string ping = mine->wait_get("ping", 5000ms);
      mine->put("pong", ping + " back");
      _exit(0);
    } catch (...) {
      _exit(1);
    }
  }
  std::this_thread::sleep_for(20ms);  // the child is already waiting
  store->put("ping", "hello");
  EXPECT_EQ(store->wait_get("pong", 5000ms), "hello back");
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(FileStore, WaitTimesOutNamingKeyStoreAndTimeout) {
  std::unique_ptr<Store> store = open_store(fresh("timeout").string(), "run");
  auto start = std::chrono::steady_clock::now();
  try {
    store->wait_get("rank/3/address", 80ms);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kDeadlineExceeded);
    EXPECT_THAT(e.what(), HasSubstr("rendezvous key 'rank/3/address'"));
    EXPECT_THAT(e.what(), HasSubstr("file store " + (fresh("timeout") / "run").string()));
    EXPECT_THAT(e.what(), HasSubstr("within 80 ms"));
  }
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 80ms);
  EXPECT_LT(waited, 1000ms);
}

TEST(FileStore, RendezvousInterfaceForPlugins) {
  std::unique_ptr<Store> store = open_store(fresh("iface").string(), "run");
  IRendezvousStore* plugin_view = store.get();
  const char value[] = "abcdef";
  Status s = plugin_view->set(make_string_view("key"), value, 6);
  ASSERT_EQ(s.code, Code::kOk);
  char buffer[4] = {};
  uint64_t size = 0;
  s = plugin_view->get(make_string_view("key"), buffer, sizeof buffer, &size, 100);
  ASSERT_EQ(s.code, Code::kOk);
  EXPECT_EQ(size, 6u);  // the full size, though only 4 bytes fit
  EXPECT_EQ(std::string(buffer, 4), "abcd");
  s = plugin_view->get(make_string_view("missing"), buffer, sizeof buffer, &size, 10);
  EXPECT_EQ(s.code, Code::kDeadlineExceeded);
  EXPECT_THAT(take_message(&s), HasSubstr("'missing'"));
}

TEST(FileStore, KeyEscaping) {
  EXPECT_EQ(FileStore::escape_key("tp/3-rank_0"), "tp%2F3-rank_0");
  EXPECT_EQ(FileStore::escape_key("a.b"), "a%2Eb");  // no '.', so never a temporary name
  EXPECT_EQ(FileStore::escape_key(std::string("\0\xff ", 3)), "%00%FF%20");
  EXPECT_EQ(FileStore::escape_key(".."), "%2E%2E");
  EXPECT_EQ(FileStore::escape_key(""), "%");
  std::string long_a(400, 'x'), long_b(400, 'x');
  long_b.back() = 'y';
  EXPECT_LE(FileStore::escape_key(long_a).size(), 200u);
  EXPECT_NE(FileStore::escape_key(long_a), FileStore::escape_key(long_b));

  // Keys that escape to names a shell or a file system would mangle still round-trip.
  std::unique_ptr<Store> store = open_store(fresh("escape").string(), "run/with/slashes");
  for (const std::string& key : {std::string("../../etc"), std::string("a b\nc"), long_a, long_b,
                                 std::string("%2E"), std::string(".")})
    store->put(key, "v:" + key);
  for (const std::string& key : {std::string("../../etc"), std::string("a b\nc"), long_a, long_b,
                                 std::string("%2E"), std::string(".")})
    EXPECT_EQ(store->try_get(key), "v:" + key);
}

TEST(FileStore, UnusableDirectoryIsAnIoErrorNamingIt) {
  fs::path file = fresh("not_a_dir");
  std::ofstream(file) << "x";
  try {
    open_store((file / "sub").string(), "run");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rendezvous directory " + (file / "sub").string()));
    EXPECT_THAT(e.what(), HasSubstr("give --rdzv (or LOOM_RDZV) a directory every rank can write"));
  }
}

TEST(FileStore, MalformedAddresses) {
  EXPECT_THROW(open_store("file:", "run"), UsageError);
  EXPECT_THROW(open_store("", "run"), UsageError);
  EXPECT_THROW(open_store("ftp://host/x", "run"), UsageError);
  EXPECT_THROW(open_store(fresh("noprefix").string(), ""), InvalidArgument);
}

}  // namespace
}  // namespace loom::core::launch
