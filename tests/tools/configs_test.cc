// Every spec in configs/ is valid as shipped: `loom spec validate --load` resolves it against
// the shipped plugins and builds its components, so each plugin's own option checks run (a
// model's whole configuration, an MoE layer's router and dispatcher). The specs of
// configs/gpu need a CUDA device to build; without one they are checked against the schemas
// only, and the test says so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "tests/util/test_plugins.h"

namespace fs = std::filesystem;
using loom::testing::run_loom;

TEST(Configs, EveryShippedSpecValidatesWithItsComponentsBuilt) {
  int checked = 0;
  for (const auto& entry : fs::recursive_directory_iterator("configs")) {
    if (entry.path().extension() != ".json") continue;
    const bool gpu = entry.path().parent_path().filename() == "gpu";
    if (gpu) std::printf("%s: schema only (building needs a CUDA device)\n", entry.path().c_str());
    auto r = run_loom("spec validate " + entry.path().string() + (gpu ? "" : " --load"));
    EXPECT_EQ(r.exit_code, 0) << entry.path() << "\n" << r.out << r.err;
    ++checked;
  }
  EXPECT_GE(checked, 6);
}
