// Durable file writing and checked reading for the checkpoint formats.
//
// A file is written under a temporary name beside its final one ("NAME.tmp-PID"), then
// fsync'ed, renamed into place and its directory fsync'ed, so that after `commit` the file
// is complete on disk under its name, and a crash before leaves at most a stray temporary.
// Every error is an Error naming the path and what the system said.
#pragma once

#include <loom/sdk.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace loom::checkpoint {

/// A file being written durably; see the top of this file.
class DurableFile {
 public:
  /// Opens "<path>.tmp-PID" for writing (truncating one a killed save left behind).
  explicit DurableFile(std::filesystem::path path);
  /// Removes the temporary file unless commit() was called.
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  /// Appends `size` bytes.
  void write(const void* data, size_t size);
  /// Overwrites `size` bytes at `offset` (inside what was written already).
  void write_at(uint64_t offset, const void* data, size_t size);
  /// Appends zero bytes up to the next multiple of `alignment`.
  void pad_to(uint64_t alignment);
  /// Bytes written so far.
  uint64_t size() const { return size_; }
  /// fsync, close, rename to the final name, fsync the directory.
  void commit();

 private:
  std::filesystem::path path_, temporary_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// Writes `text` to `path` durably (DurableFile).
void write_file_durably(const std::filesystem::path& path, const std::string& text);

/// fsyncs the directory `dir` (makes renames and new names inside it durable).
void fsync_directory(const std::filesystem::path& dir);

/// The whole content of `path`. A missing file is Error(`missing_code`) whose message
/// names the path and ends with `missing_hint`; other failures are kIoError.
std::string read_whole_file(const std::filesystem::path& path, Code missing_code,
                            const std::string& missing_hint);

/// A file opened for positional reads.
class ReadOnlyFile {
 public:
  /// Opens `path`; a missing file is Error(`missing_code`) naming it and `missing_hint`.
  ReadOnlyFile(std::filesystem::path path, Code missing_code, const std::string& missing_hint);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  /// Size in bytes when opened.
  uint64_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  /// Reads exactly `size` bytes at `offset` into `out`; a short read is kDataLoss.
  void read(uint64_t offset, void* out, size_t size) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// A file mapped read-only into memory (for large files read in pieces, e.g. safetensors).
class MappedFile {
 public:
  /// Maps `path`; a missing file is Error(`missing_code`) naming it and `missing_hint`.
  MappedFile(std::filesystem::path path, Code missing_code, const std::string& missing_hint);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace loom::checkpoint
