#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <system_error>

#include "tests/fuzz/fuzz_target.h"

namespace loom::fuzz {

namespace {

struct Scratch {
  std::filesystem::path dir;
  Scratch() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    if (tmp == nullptr || *tmp == '\0') tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                          "/loom-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    dir = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

std::map<std::string, TargetFn>& registry() {
  static std::map<std::string, TargetFn> targets;
  return targets;
}

}  // namespace

bool register_target(const char* name, TargetFn fn) {
  registry()[name] = fn;
  return true;
}

const std::map<std::string, TargetFn>& targets() { return registry(); }

const std::filesystem::path& scratch_dir() {
  static Scratch scratch;
  return scratch.dir;
}

void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace loom::fuzz
