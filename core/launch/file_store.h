// A rendezvous store in a directory: one file per key, replaced atomically, so it works on
// any shared file system (NFS, Lustre, GPFS) that the ranks of a run can all reach.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "core/launch/store.h"

namespace loom::core::launch {

/// Keys are files in `root`/<escaped prefix>/; values appear all at once (temporary name,
/// then rename) so a reader never sees half a value.
class FileStore : public Store {
 public:
  /// \param root    the directory (created with its parents when missing)
  /// \param prefix  the run id; its keys live in a subdirectory named after it
  /// Throws IoError naming the directory and the fix when it cannot be created or written.
  FileStore(const std::filesystem::path& root, const std::string& prefix);

  std::string describe() const override;

  /// The directory that holds this run's keys.
  const std::filesystem::path& directory() const { return dir_; }

  /// A file name for `key` that is safe on every file system: letters, digits, '-' and '_'
  /// stay, every other byte becomes %XX (so no name contains '.', and the temporary files
  /// "NAME.tmp.PID.N" of a write can never be taken for a key); names longer than 200
  /// bytes are cut and end with a hash of the whole key.
  static std::string escape_key(const std::string& key);

 protected:
  void write(const std::string& key, const std::string& value) override;
  std::optional<std::string> read(const std::string& key) override;

 private:
  std::filesystem::path dir_;
};

}  // namespace loom::core::launch
