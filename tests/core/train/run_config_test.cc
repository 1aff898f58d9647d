// RunConfig::from_spec on specs resolved by the core schema: the typed fields, and every
// cross-field rule refused with its spec pointer and the fix.
#include "core/train/run_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/spec/spec.h"
#include "core/util/errors.h"

namespace loom::core {
namespace {

using ::testing::HasSubstr;

// `sections` resolved against the core schema alone (no component nodes).
nlohmann::json resolved(nlohmann::json sections) {
  resolve_spec(
      sections, [](const std::string&, const std::string&, nlohmann::json*) { return false; },
      [](const std::string&) { return std::vector<std::string>{}; },
      [](const std::string&, const std::string&) { return std::string(); }, "");
  return sections;
}

std::string refusal(const nlohmann::json& sections, Code* code = nullptr) {
  try {
    RunConfig c = RunConfig::from_spec(resolved(sections));
    c.check_batch();
  } catch (const Error& e) {
    if (code != nullptr) *code = e.code();
    return e.what();
  }
  return "accepted";
}

TEST(RunConfig, ReadsTheResolvedSectionsWithTheirDefaults) {
  RunConfig c = RunConfig::from_spec(resolved(
      {{"parallel", {{"tp", 2}, {"dp", 2}, {"distributed_optimizer", true}}},
       {"precision", {{"params", "bf16"}}},
       {"train", {{"micro_batch_size", 2}, {"global_batch_size", 16}, {"recompute", "full"}}},
       {"checkpoint", {{"resume", "auto"}, {"interval", 5}}},
       {"kernels", {{"pin", {{"gemm", "cpu.ref"}}}}}}));
  EXPECT_EQ(c.parallel.world(), 4);
  EXPECT_EQ(c.parallel.describe(), "tp=2 cp=1 ep=1 dp=2 pp=1");
  EXPECT_TRUE(c.parallel.saves_together());
  EXPECT_EQ(c.precision.params, DType::kBF16);
  EXPECT_FALSE(c.precision.dynamic_loss_scaling());
  EXPECT_TRUE(c.precision.fp8_weight_cache) << "FP8 weights kept across micro-batches by default";
  EXPECT_EQ(c.train.recompute, RecomputePolicy::kFull);
  EXPECT_EQ(c.micro_batches(), 4);      // 16 / (2 x dp 2)
  EXPECT_EQ(c.train.seq_length, 1024);  // the schema's default
  EXPECT_TRUE(c.checkpoint.resume_auto);
  EXPECT_EQ(c.checkpoint.interval, 5);
  EXPECT_EQ(c.checkpoint.format.value("impl", ""), "sharded");
  EXPECT_EQ(c.kernels.pin.at("gemm"), "cpu.ref");
  EXPECT_TRUE(c.parallel.pipeline_schedule.is_null());
  // Without global_batch_size, one micro-batch per data-parallel rank.
  RunConfig d = RunConfig::from_spec(resolved({{"parallel", {{"dp", 3}}}}));
  EXPECT_EQ(d.train.global_batch_size, 3);
  EXPECT_EQ(d.micro_batches(), 1);
}

TEST(RunConfig, EveryBrokenRuleNamesItsPlaceAndTheFix) {
  // Expert parallelism is accepted (a model without experts sees its ranks as data replicas).
  EXPECT_EQ(refusal({{"parallel", {{"ep", 2}}}}), "accepted");
  EXPECT_EQ(refusal({{"parallel", {{"cp", 2}}}, {"train", {{"seq_length", 64}}}}), "accepted");
  EXPECT_THAT(refusal({{"parallel", {{"cp", 3}}}, {"train", {{"seq_length", 64}}}}),
              HasSubstr("/train/seq_length: 64 is not divisible by 2 x parallel.cp = 6"));
  EXPECT_THAT(refusal({{"parallel", {{"cp", 2}, {"tp", 3}, {"sequence_parallel", true}}},
                       {"train", {{"seq_length", 40}}}}),
              HasSubstr("20 tokens per context-parallel rank are not divisible by parallel.tp 3"));
  EXPECT_EQ(refusal({{"parallel", {{"pp", 2}}}}), "accepted");
  // An FP8 recipe node (added after resolution: this test resolves no components): with a
  // pipeline, and with virtual chunks, accepted.
  for (int vpp : {1, 2}) {
    nlohmann::json fp8 = resolved({{"parallel", {{"pp", 2}, {"vpp", vpp}}}});
    fp8["precision"]["fp8"] = {{"impl", "delayed"}};
    EXPECT_NO_THROW(RunConfig::from_spec(fp8)) << "vpp " << vpp;
  }
  EXPECT_THAT(refusal({{"parallel", {{"vpp", 2}}}}),
              HasSubstr("spec /parallel/vpp: 2 virtual pipeline chunks need pipeline parallelism"));
  EXPECT_THAT(refusal({{"parallel", {{"tp", 2}, {"sequence_parallel", true}}},
                       {"train", {{"seq_length", 15}}}}),
              HasSubstr("spec /train/seq_length: 15 is not divisible by parallel.tp 2"));
  EXPECT_THAT(refusal({{"parallel", {{"dp", 2}}},
                       {"train", {{"micro_batch_size", 2}, {"global_batch_size", 6}}}}),
              HasSubstr("spec /train/global_batch_size: 6 is not a multiple of micro_batch_size "
                        "x dp = 2 x 2"));
  nlohmann::json whole = resolved({{"parallel", {{"tp", 2}}}});
  whole["checkpoint"]["format"] = {{"impl", "safetensors"}};  // a format plugin's node
  try {
    RunConfig::from_spec(whole);
    ADD_FAILURE() << "tp 2 with a whole-tensor format was accepted";
  } catch (const SpecError& e) {
    EXPECT_THAT(e.what(), HasSubstr("spec /checkpoint/format: 'safetensors' keeps whole tensors"));
  }
  EXPECT_EQ(refusal({{"parallel", {{"tp", 2}, {"sequence_parallel", true}}},
                     {"train", {{"seq_length", 16}}}}),
            "accepted");
}

TEST(RunConfig, AnUnresolvedSpecIsRefusedNotGuessed) {
  try {
    RunConfig::from_spec(nlohmann::json{{"parallel", nlohmann::json::object()}});
    ADD_FAILURE() << "an unresolved spec was accepted";
  } catch (const SpecError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the spec was not resolved"));
  }
}

}  // namespace
}  // namespace loom::core
