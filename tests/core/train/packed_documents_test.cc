// Packed documents (data.reset_position_ids + data.reset_attention_mask): a document that
// follows another in the same sequence gets exactly the logits it gets on its own at the
// start of a sequence, with either attention implementation. This is what Megatron's
// reset masks promise, checked through the whole model.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/plugin/catalog.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/spec.h"
#include "core/train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

nlohmann::json spec_with(const std::string& attention, const std::string& positions) {
  nlohmann::json spec = nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "vocab_size": 64, "max_position_embeddings": 32,
              "layer": {"impl": "transformer_layer", "norm": {"impl": "layernorm"},
                        "mlp": {"impl": "mlp"}},
              "final_norm": {"impl": "layernorm"}},
    "optimizer": {"impl": "adamw", "lr": 0.01},
    "data": {"mock": true},
    "train": {"steps": 1, "micro_batch_size": 1, "seq_length": 16}
  })");
  spec["model"]["layer"]["attention"] = {{"impl", attention}};
  spec["model"]["position_embedding"] = positions;
  return spec;
}

std::vector<float> logits_of(core::Trainer& trainer, const core::Batch& batch) {
  std::vector<float> logits;
  trainer.forward_only(batch, &logits);
  return logits;
}

TEST(PackedDocuments, SecondDocumentSeesOnlyItself) {
  for (const char* attention : {"fused", "dot_product"}) {
    for (const char* positions : {"learned", "rope"}) {
      SCOPED_TRACE(std::string(attention) + " attention, " + positions + " positions");
      nlohmann::json spec = spec_with(attention, positions);
      std::vector<core::SearchRoot> roots;
      for (const char* dir :
           {"kernels/cpu", "plugins/transformer", "plugins/fused_attention", "plugins/optim"})
        roots.push_back({fs::absolute(dir), "test"});
      auto catalog = std::make_unique<core::Catalog>(roots);
      core::resolve_spec(spec, *catalog);
      core::PluginManager plugins(std::move(*catalog), nlohmann::json::object(), 1);
      plugins.load_all();
      core::Trainer trainer(spec, plugins, nullptr, {{"return_logits", true}});

      const int64_t t = 16, first = 5, v = 64;
      std::vector<int32_t> a = {3, 9, 27, 17, 63};  // ends with its EOD (63)
      std::vector<int32_t> b = {4, 8, 15, 16, 23, 42, 1, 2, 5, 7, 11};
      core::Batch packed, alone;
      packed.resize(1, t);
      alone.resize(1, t);
      packed.position_ids.assign(t, 0);
      packed.segment_ids.assign(t, 0);
      for (int64_t i = 0; i < t; ++i) {
        bool in_a = i < first;
        packed.tokens[i] = in_a ? a[i] : b[i - first];
        packed.position_ids[i] = static_cast<int32_t>(in_a ? i : i - first);
        packed.segment_ids[i] = in_a ? 0 : 1;
        alone.tokens[i] = i < t - first ? b[i] : 0;  // padding after b
      }
      std::vector<float> lp = logits_of(trainer, packed), la = logits_of(trainer, alone);
      ASSERT_EQ(lp.size(), static_cast<size_t>(t * v));
      double worst = 0;
      for (int64_t i = 0; i < t - first; ++i)
        for (int64_t c = 0; c < v; ++c)
          worst = std::max(worst, std::abs(double(lp[(i + first) * v + c]) - la[i * v + c]));
      EXPECT_LT(worst, 1e-5);
      // Without the reset masks the second document does see the first.
      packed.position_ids.clear();
      packed.segment_ids.clear();
      std::vector<float> lc = logits_of(trainer, packed);
      double diff = 0;
      for (int64_t i = 0; i < t - first; ++i)
        diff = std::max(diff, std::abs(double(lc[(i + first) * v]) - la[i * v]));
      EXPECT_GT(diff, 1e-3);
    }
  }
}

}  // namespace
}  // namespace loom
