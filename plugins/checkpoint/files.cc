#include "plugins/checkpoint/files.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace loom::checkpoint {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void io_error(const fs::path& path, const std::string& what, int error) {
  fail(Code::kIoError, path.string() + ": " + what + " failed: " + std::strerror(error));
}

// Opens `path` read-only and returns the descriptor and size; see read_whole_file.
int open_for_reading(const fs::path& path, Code missing_code, const std::string& missing_hint,
                     uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int error = errno;
    if (error == ENOENT) fail(missing_code, path.string() + " is missing: " + missing_hint);
    io_error(path, "open", error);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int error = errno;
    ::close(fd);
    io_error(path, "stat", error);
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

void read_exactly(int fd, const fs::path& path, uint64_t offset, void* out, size_t size) {
  auto* p = static_cast<unsigned char*>(out);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_error(path, "read", errno);
    if (n == 0)
      fail(Code::kDataLoss, path.string() + ": the file ends early (byte " +
                                std::to_string(offset) + "); it was truncated");
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

DurableFile::DurableFile(fs::path path)
    : path_(std::move(path)), temporary_(path_.string() + ".tmp-" + std::to_string(::getpid())) {
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_error(temporary_, "create", errno);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void DurableFile::write(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_ += size;
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_error(temporary_, "write", errno);
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void DurableFile::write_at(uint64_t offset, const void* data, size_t size) {
  LOOM_CHECK(offset + size <= size_, "write_at past the end of ", temporary_.string());
  const auto* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_error(temporary_, "write", errno);
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

void DurableFile::pad_to(uint64_t alignment) {
  static const unsigned char kZeros[64] = {};
  uint64_t pad = (alignment - size_ % alignment) % alignment;
  while (pad > 0) {
    size_t n = pad < sizeof(kZeros) ? static_cast<size_t>(pad) : sizeof(kZeros);
    write(kZeros, n);
    pad -= n;
  }
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0) io_error(temporary_, "fsync", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    int error = errno;
    ::unlink(temporary_.c_str());
    io_error(temporary_, "close", error);
  }
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    int error = errno;
    ::unlink(temporary_.c_str());
    io_error(path_, "rename from " + temporary_.filename().string(), error);
  }
  fsync_directory(path_.parent_path().empty() ? fs::path(".") : path_.parent_path());
}

void write_file_durably(const fs::path& path, const std::string& text) {
  DurableFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

void fsync_directory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_error(dir, "open directory", errno);
  int rc = ::fsync(fd);
  int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL) io_error(dir, "fsync directory", error);
}

std::string read_whole_file(const fs::path& path, Code missing_code,
                            const std::string& missing_hint) {
  uint64_t size = 0;
  int fd = open_for_reading(path, missing_code, missing_hint, &size);
  std::string text(static_cast<size_t>(size), '\0');
  try {
    read_exactly(fd, path, 0, text.data(), text.size());
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return text;
}

ReadOnlyFile::ReadOnlyFile(fs::path path, Code missing_code, const std::string& missing_hint)
    : path_(std::move(path)) {
  fd_ = open_for_reading(path_, missing_code, missing_hint, &size_);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read(uint64_t offset, void* out, size_t size) const {
  read_exactly(fd_, path_, offset, out, size);
}

MappedFile::MappedFile(fs::path path, Code missing_code, const std::string& missing_hint)
    : path_(std::move(path)) {
  int fd = open_for_reading(path_, missing_code, missing_hint, &size_);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    int error = errno;
    ::close(fd);
    if (p == MAP_FAILED) io_error(path_, "mmap", error);
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
}

}  // namespace loom::checkpoint
