// The rendezvous store (core/launch): what it takes from outside is the address
// (--rdzv / LOOM_RDZV: DIR, file:DIR, redis://HOST:PORT[/DB]), the run id, and keys and
// values that peers write as files in the shared directory. The input is split at NUL
// bytes into: an address (used only when it is redis://, which is parsed but not
// connected to), a run id, a key, and a value. The value is written as a peer would (a file
// under the key's escaped name) and read back through the store's throwing helpers and its
// plugin-facing get() with a buffer smaller than the value.
#include <cstring>
#include <string>
#include <vector>

#include "core/launch/file_store.h"
#include "core/launch/redis_store.h"
#include "core/launch/store.h"
#include "tests/fuzz/fuzz_target.h"

using loom::fuzz::guarded;

LOOM_FUZZ_TARGET(store) {
  std::string_view text = loom::fuzz::as_text(data, size);
  std::vector<std::string> parts;
  size_t start = 0;
  while (parts.size() < 3) {
    size_t nul = text.find('\0', start);
    if (nul == std::string_view::npos) break;
    parts.emplace_back(text.substr(start, nul - start));
    start = nul + 1;
  }
  parts.emplace_back(text.substr(std::min(start, text.size())));
  while (parts.size() < 4) parts.emplace_back();
  const std::string& address = parts[0];
  const std::string& run_id = parts[1];
  const std::string& key = parts[2];
  const std::string& value = parts[3];
  if (address.rfind("redis://", 0) == 0)
    guarded("store", [&] { (void)loom::core::launch::parse_redis_address(address); });
  std::string name = loom::core::launch::FileStore::escape_key(key);
  if (name.empty() || name.size() > 200 || name.find('/') != std::string::npos ||
      name.find('.') != std::string::npos) {
    std::fprintf(stderr, "store: escape_key gave an unsafe file name '%s'\n", name.c_str());
    std::abort();
  }
  const std::filesystem::path root = loom::fuzz::scratch_dir() / "rdzv";
  std::unique_ptr<loom::core::launch::Store> store =
      loom::core::launch::open_store("file:" + root.string(), run_id.empty() ? "run" : run_id);
  auto* files = static_cast<loom::core::launch::FileStore*>(store.get());
  // A peer's value, as the file it leaves in the shared directory.
  loom::fuzz::write_bytes(files->directory() / name, value);
  std::optional<std::string> got = store->try_get(key);
  if (!got || *got != value) std::abort();
  if (store->wait_get(key, std::chrono::milliseconds(0)) != value) std::abort();
  std::vector<char> buffer(value.size() / 2);
  uint64_t full = 0;
  loom::throw_if_error(store->get(loom::StringView{key.data(), key.size()}, buffer.data(),
                                  buffer.size(), &full, 0));
  if (full != value.size() ||
      (!buffer.empty() && std::memcmp(buffer.data(), value.data(), buffer.size()) != 0))
    std::abort();
  store->put(key, value + "!");
  if (store->try_get(key) != value + "!") std::abort();
  std::filesystem::remove_all(root);
}
