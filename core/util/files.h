// Small file helpers shared by the core: whole-file reads, full writes, and atomic
// replacement (temporary name in the same directory, fsync, rename).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace loom::core {

/// The bytes of `path`. Throws IoError naming the file when it cannot be read.
std::string read_file(const std::filesystem::path& path);

/// Writes all `size` bytes of `data` to `fd` (retrying short writes and EINTR). Throws
/// IoError naming `path` on failure.
void write_all(int fd, const void* data, size_t size, const std::filesystem::path& path);

/// A temporary name beside `path` that no other process uses: "path.tmp.<pid>.<n>".
std::filesystem::path temporary_path(const std::filesystem::path& path);

/// fsyncs `fd`, closes it, and renames `tmp` to `path`; fsyncs the directory so the rename
/// survives a crash. Removes `tmp` and throws IoError naming `path` on any failure.
void commit_file(int fd, const std::filesystem::path& tmp, const std::filesystem::path& path);

/// fsyncs the directory `dir` so that renames and creations inside it survive a crash
/// (best effort: a file system that cannot sync directories is not an error).
void sync_directory(const std::filesystem::path& dir);

/// Replaces `path` with `bytes` atomically: readers see the old file or the new one, never a
/// part. Throws IoError naming the file.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

}  // namespace loom::core
