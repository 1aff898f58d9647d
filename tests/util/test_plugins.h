// Test helpers: lay out plugin directories from the test plugins in runfiles, and run the
// loom binary capturing its exit code, stdout and stderr.
#pragma once

#include <filesystem>
#include <string>

namespace loom::testing {

/// $TEST_TMPDIR/<name>, created empty (removed first if it exists).
std::filesystem::path fresh_dir(const std::string& name);

/// Copies test plugin `package` (a folder under tests/plugins, e.g. "good") into
/// `root`/<plugin name>/ as plugin.json + libloom_<plugin name>.so. Returns the plugin dir.
std::filesystem::path install_test_plugin(const std::filesystem::path& root,
                                          const std::string& package,
                                          const std::string& plugin_name);

/// Writes `text` to `path` (creating parent directories).
void write_file(const std::filesystem::path& path, const std::string& text);

/// Reads a whole file.
std::string read_file(const std::filesystem::path& path);

/// Result of running a command.
struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

/// When true, run_loom runs a copy of the binary that has no install plugin directory
/// beside it (tests that must see only their own plugins set it).
extern bool isolated_binary;

/// Runs the loom binary (from runfiles) with `args` (already shell-quoted as needed) and
/// the environment prefix `env` ("LOOM_PLUGIN_PATH=/x"), in directory `cwd`.
RunResult run_loom(const std::string& args, const std::string& env = "",
                   const std::filesystem::path& cwd = {});

/// A loom process started in the background (start_loom).
struct Background {
  int pid = -1;
  std::filesystem::path out, err;  ///< where its stdout and stderr go
};

/// Starts the loom binary with `args` (shell-quoted as needed) without waiting.
Background start_loom(const std::string& args, const std::string& env = "");

/// Waits for `process`; returns its exit code, or -signal when a signal ended it.
int wait_loom(const Background& process);

/// While alive, the loom processes a test starts run without LeakSanitizer's exit-time
/// scan (ASAN_OPTIONS gains detect_leaks=0; restored when this goes). Only for the ASan
/// build's sake: under the Bazel sandbox that scan crashes in its own tracer ("Tracer caught
/// signal 11" while it walks a thread's dynamic TLS) after clean runs of some binaries, and
/// which ones moves with unrelated allocations (glibc 2.36; never outside the sandbox with
/// the same binary). The processes keep every other ASan and UBSan check, and leaks stay
/// checked by the tests that do not use this.
class WithoutLeakCheck {
 public:
  WithoutLeakCheck();
  ~WithoutLeakCheck();
  WithoutLeakCheck(const WithoutLeakCheck&) = delete;
  WithoutLeakCheck& operator=(const WithoutLeakCheck&) = delete;

 private:
  std::string before_;
  bool had_ = false;
};

}  // namespace loom::testing
