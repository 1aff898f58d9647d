// The fuzz targets as a regression test: runs every registered target over every file of
// tests/fuzz/corpus/NAME/ (the seed corpus) and tests/fuzz/regressions/NAME/ (crashes found
// by tools/fuzz, kept once fixed), and prints how many inputs each ran. A target that hits
// an "internal error" (any exception other than loom::Error) or a sanitizer report aborts
// the test, naming the input on stderr first.
//
//   replay_test [ROOT]   ROOT holds corpus/ and regressions/ (default: tests/fuzz in the
//                        test's runfiles)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "README.md") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  fs::path root = argc > 1 ? fs::path(argv[1]) : fs::path("tests/fuzz");
  int failures = 0;
  size_t total = 0;
  for (const auto& [name, target] : loom::fuzz::targets()) {
    size_t seeds = 0, regressions = 0;
    for (const char* kind : {"corpus", "regressions"}) {
      for (const fs::path& file : files_in(root / kind / name)) {
        std::string bytes = read_file(file);
        std::fprintf(stderr, "%s: %s\n", name.c_str(), file.string().c_str());
        target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        ++(kind[0] == 'c' ? seeds : regressions);
      }
    }
    std::printf("%-12s %4zu seed inputs, %3zu regression inputs: ok\n", name.c_str(), seeds,
                regressions);
    total += seeds + regressions;
    if (seeds == 0) {
      std::printf("  FAIL: no seed corpus in %s\n", (root / "corpus" / name).c_str());
      ++failures;
    }
  }
  std::printf("%zu fuzz targets, %zu inputs replayed\n", loom::fuzz::targets().size(), total);
  if (loom::fuzz::targets().size() != 8) {
    std::printf("FAIL: expected 8 registered fuzz targets\n");
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}
