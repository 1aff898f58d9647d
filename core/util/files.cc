#include "core/util/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/util/errors.h"

namespace loom::core {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError(fmt::format("{}: cannot open ({})", path.string(),
                              fs::exists(path) ? "permission or read error" : "no such file"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError(fmt::format("{}: read error", path.string()));
  return bytes;
}

void write_all(int fd, const void* data, size_t size, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(fmt::format("{}: write failed: {}", path.string(), std::strerror(errno)));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

fs::path temporary_path(const fs::path& path) {
  static std::atomic<uint64_t> counter{0};
  fs::path tmp = path;
  tmp += fmt::format(".tmp.{}.{}", ::getpid(), counter.fetch_add(1));
  return tmp;
}

void commit_file(int fd, const fs::path& tmp, const fs::path& path) {
  std::error_code ec;
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    fs::remove(tmp, ec);
    throw IoError(fmt::format("{}: fsync failed: {}", path.string(), std::strerror(err)));
  }
  ::close(fd);
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw IoError(fmt::format("{}: rename failed: {}", path.string(), ec.message()));
  }
  sync_directory(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

void sync_directory(const fs::path& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const fs::path& path, std::string_view bytes) {
  fs::path tmp = temporary_path(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    throw IoError(fmt::format("{}: cannot create: {}", tmp.string(), std::strerror(errno)));
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
  } catch (...) {
    ::close(fd);
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  commit_file(fd, tmp, path);
}

}  // namespace loom::core
