#include "core/launch/file_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/hash.h"

namespace fs = std::filesystem;

namespace loom::core::launch {

std::string FileStore::escape_key(const std::string& key) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string name;
  name.reserve(key.size());
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_') {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += kHex[c >> 4];
      name += kHex[c & 15];
    }
  }
  // File names are at most 255 bytes, and the temporary name of a write adds about 20.
  constexpr size_t kMaxName = 200;
  if (name.empty()) name = "%";
  if (name.size() > kMaxName)
    name = fmt::format("{}~{:016x}", name.substr(0, kMaxName - 17), fnv1a64(key));
  return name;
}

FileStore::FileStore(const fs::path& root, const std::string& prefix)
    : dir_(root / escape_key(prefix)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec)
    throw IoError(
        fmt::format("rendezvous directory {}: cannot create it ({}); give --rdzv (or LOOM_RDZV) a "
                    "directory every rank can write, on a shared file system for several machines",
                    dir_.string(), ec.message()));
  if (::access(dir_.c_str(), W_OK | X_OK) != 0)
    throw IoError(fmt::format(
        "rendezvous directory {}: not writable ({}); give --rdzv (or LOOM_RDZV) a directory "
        "every rank can write, on a shared file system for several machines",
        dir_.string(), std::strerror(errno)));
}

std::string FileStore::describe() const { return "file store " + dir_.string(); }

void FileStore::write(const std::string& key, const std::string& value) {
  write_file_atomic(dir_ / escape_key(key), value);
}

std::optional<std::string> FileStore::read(const std::string& key) {
  fs::path path = dir_ / escape_key(key);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw IoError(fmt::format("rendezvous key '{}': cannot open {}: {}", key, path.string(),
                              std::strerror(errno)));
  }
  std::string value;
  char buffer[1 << 14];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int error = errno;
      ::close(fd);
      throw IoError(fmt::format("rendezvous key '{}': cannot read {}: {}", key, path.string(),
                                std::strerror(error)));
    }
    if (n == 0) break;
    value.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return value;
}

}  // namespace loom::core::launch
