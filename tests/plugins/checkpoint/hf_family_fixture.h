// The fixture of the Hugging Face family tests (hf_moe_test, hf_qwen_test): the safetensors
// format built as the core builds it, exporting tiny loom weights with a spec, loading them
// back by their loom names, and the tensor names of an exported file.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/plugins/checkpoint/hf_fixtures.h"

namespace loom::testing {

class HfFamilyTest : public ::testing::Test {
 protected:
  /// Saves `weights` with `spec` as Hugging Face safetensors in `dir`.
  Outcome export_to(const std::filesystem::path& dir, std::vector<OwnedTensor> weights,
                    const nlohmann::json& spec) {
    return save(format, dir, weights, metadata_for(weights, spec));
  }
  /// Loads every weight back by its loom name and compares the bytes.
  void expect_identity(const std::filesystem::path& dir, const std::vector<OwnedTensor>& weights) {
    std::vector<OwnedTensor> back;
    for (const OwnedTensor& t : weights)
      back.push_back(request(t.name, t.dtype, t.global_shape, t.offset, t.shape));
    Outcome o = load(format, dir, back);
    ASSERT_EQ(o.code, Code::kOk) << o.message;
    for (size_t i = 0; i < weights.size(); ++i)
      EXPECT_EQ(back[i].bytes, weights[i].bytes) << weights[i].name;
  }
  /// The tensor names in `file`.
  std::set<std::string> names(const checkpoint::SafetensorsReader& file) {
    std::set<std::string> out;
    for (const auto& [name, t] : file.tensors()) out.insert(name);
    return out;
  }

  CheckpointEnv env;
  Format format = env.format({{"impl", "safetensors"}});
  std::mt19937 rng{11};
};

}  // namespace loom::testing
