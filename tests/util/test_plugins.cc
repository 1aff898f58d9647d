#include "tests/util/test_plugins.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace loom::testing {
namespace {

fs::path tmp_root() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? fs::path(t) : fs::temp_directory_path();
}

// Runfiles: Bazel runs tests in the workspace's runfiles directory.
fs::path runfile(const std::string& relative) {
  fs::path p = fs::absolute(relative);
  if (!fs::exists(p)) throw std::runtime_error("runfile missing: " + relative);
  return p;
}

}  // namespace

fs::path fresh_dir(const std::string& name) {
  fs::path dir = tmp_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

fs::path install_test_plugin(const fs::path& root, const std::string& package,
                             const std::string& plugin_name) {
  fs::path dir = root / plugin_name;
  fs::create_directories(dir);
  std::string base = "tests/plugins/" + package + "/";
  fs::path manifest = fs::exists(base + "plugin.json") ? runfile(base + "plugin.json")
                                                       : runfile(base + "manifest.json");
  fs::copy_file(manifest, dir / "plugin.json", fs::copy_options::overwrite_existing);
  fs::copy_file(runfile(base + "libloom_" + plugin_name + ".so"),
                dir / ("libloom_" + plugin_name + ".so"), fs::copy_options::overwrite_existing);
  return dir;
}

void write_file(const fs::path& path, const std::string& text) {
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool isolated_binary = false;

RunResult run_loom(const std::string& args, const std::string& env, const fs::path& cwd) {
  static int counter = 0;
  fs::path base = tmp_root() / ("run_" + std::to_string(counter++));
  fs::path out = base.string() + ".out", err = base.string() + ".err";
  std::string loom = runfile("tools/loom").string();
  if (isolated_binary) {
    // A copy of the binary in a folder of its own: no install plugin directory beside it,
    // so only the plugins the test puts on the search path are found.
    fs::path copy = tmp_root() / "isolated" / "bin" / "loom";
    if (!fs::exists(copy)) {
      fs::create_directories(copy.parent_path());
      fs::copy_file(loom, copy);
    }
    loom = copy.string();
  }
  std::string command = (cwd.empty() ? std::string() : "cd '" + cwd.string() + "' && ") + "env " +
                        (env.empty() ? std::string("LOOM_UNUSED=1") : env) + " '" + loom + "' " +
                        args + " > '" + out.string() + "' 2> '" + err.string() + "'";
  int status = std::system(command.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

Background start_loom(const std::string& args, const std::string& env) {
  static int counter = 0;
  Background b;
  fs::path base = tmp_root() / ("background_" + std::to_string(counter++));
  b.out = base.string() + ".out";
  b.err = base.string() + ".err";
  std::string command = "exec env " + (env.empty() ? std::string("LOOM_UNUSED=1") : env) + " '" +
                        runfile("tools/loom").string() + "' " + args + " > '" + b.out.string() +
                        "' 2> '" + b.err.string() + "'";
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  b.pid = pid;
  return b;
}

int wait_loom(const Background& process) {
  int status = 0;
  if (waitpid(process.pid, &status, 0) < 0) return -1000;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
}

WithoutLeakCheck::WithoutLeakCheck() {
  const char* asan = std::getenv("ASAN_OPTIONS");
  had_ = asan != nullptr;
  before_ = had_ ? asan : "";
  if (had_ && before_.find("detect_leaks=0") == std::string::npos)
    setenv("ASAN_OPTIONS", (before_ + (before_.empty() ? "" : ":") + "detect_leaks=0").c_str(), 1);
}

WithoutLeakCheck::~WithoutLeakCheck() {
  if (had_) setenv("ASAN_OPTIONS", before_.c_str(), 1);
}

}  // namespace loom::testing
