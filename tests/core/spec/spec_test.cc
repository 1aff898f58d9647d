// Spec loading and --set overrides (core/spec/spec.h).
#include "core/spec/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/util/errors.h"

using ::testing::HasSubstr;

namespace loom::core {
namespace {

TEST(ApplyOverrideTest, ParsesJsonValuesAndFallsBackToStrings) {
  nlohmann::json spec = {{"train", {{"steps", 10}}}};
  apply_override(spec, "train.steps=20");
  apply_override(spec, "train.device=cuda");
  apply_override(spec, "model.impl=gpt");                      // creates /model
  apply_override(spec, "plugins.search_paths=[\"a\",\"b\"]");  // JSON array
  apply_override(spec, "optimizer.lr=3e-4");
  EXPECT_EQ(spec["train"]["steps"], 20);
  EXPECT_EQ(spec["train"]["device"], "cuda");
  EXPECT_EQ(spec["model"]["impl"], "gpt");
  EXPECT_EQ(spec["plugins"]["search_paths"], nlohmann::json({"a", "b"}));
  EXPECT_DOUBLE_EQ(spec["optimizer"]["lr"].get<double>(), 3e-4);
  apply_override(spec, "plugins.search_paths.1=c");  // array index
  EXPECT_EQ(spec["plugins"]["search_paths"][1], "c");
  apply_override(spec, "train.tag=a=b");  // only the first '=' splits
  EXPECT_EQ(spec["train"]["tag"], "a=b");
}

TEST(ApplyOverrideTest, RefusesMalformedAssignments) {
  nlohmann::json spec = {{"train", {{"steps", 10}}}, {"list", {1, 2}}};
  EXPECT_THROW(apply_override(spec, "train.steps"), UsageError);
  EXPECT_THROW(apply_override(spec, "=3"), UsageError);
  EXPECT_THROW(apply_override(spec, "train..steps=3"), UsageError);
  try {
    apply_override(spec, "train.steps.x=1");
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_EQ(e.pointer(), "/train/steps");
    EXPECT_THAT(e.what(), HasSubstr("cannot set 'x' inside 10"));
  }
  try {
    apply_override(spec, "list.5=1");
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'5' is not an index of this array of 2 elements"));
  }
}

TEST(ParseSpecTextTest, SyntaxErrorsCarryLineAndColumn) {
  try {
    parse_spec_text("{\n\n   \"a\": tru\n}", "x.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("spec x.json:3:"));
    EXPECT_THAT(e.what(), HasSubstr("syntax error"));
  }
}

TEST(ResolveSpecTest, EmptySpecGetsEveryCoreDefault) {
  nlohmann::json spec = nlohmann::json::object();
  auto none = [](const std::string&, const std::string&, nlohmann::json*) { return false; };
  auto names = [](const std::string&) { return std::vector<std::string>{}; };
  auto provider = [](const std::string&, const std::string&) { return std::string(); };
  auto uses = resolve_spec(spec, none, names, provider, "(nowhere)");
  EXPECT_TRUE(uses.empty());
  EXPECT_EQ(spec["parallel"]["dp"], 1);
  EXPECT_EQ(spec["train"]["seq_length"], 1024);
  EXPECT_EQ(spec["precision"]["params"], "f32");
  EXPECT_EQ(spec["plugins"]["search_paths"], nlohmann::json::array());
  EXPECT_EQ(spec["data"]["split"], "949,50,1");
}

TEST(ResolveSpecTest, ComponentOptionsAreCheckedAgainstTheirSchema) {
  nlohmann::json schema = {{"type", "object"},
                           {"additionalProperties", false},
                           {"properties", {{"lr", {{"type", "number"}, {"default", 0.5}}}}}};
  auto lookup = [&](const std::string& kind, const std::string& name, nlohmann::json* out) {
    if (kind != "optimizer" || name != "sgd") return false;
    *out = schema;
    return true;
  };
  auto names = [](const std::string& kind) {
    return kind == "optimizer" ? std::vector<std::string>{"sgd"} : std::vector<std::string>{};
  };
  auto provider = [](const std::string&, const std::string&) { return std::string("optim"); };
  nlohmann::json spec = {{"optimizer", {{"impl", "sgd"}}}};
  auto uses = resolve_spec(spec, lookup, names, provider, "(test)");
  ASSERT_EQ(uses.size(), 1u);
  EXPECT_EQ(uses[0].pointer, "/optimizer");
  EXPECT_EQ(spec["optimizer"]["lr"], 0.5);
  EXPECT_EQ(spec["optimizer"]["impl"], "sgd");
  spec = {{"optimizer", {{"impl", "sgdd"}}}};
  try {
    resolve_spec(spec, lookup, names, provider, "(test)");
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_EQ(e.pointer(), "/optimizer/impl");
    EXPECT_THAT(e.what(), HasSubstr("unknown optimizer impl 'sgdd' (did you mean 'sgd', provided "
                                    "by plugin optim?); available: 'sgd'"));
  }
  spec = {{"optimizer", {{"lr", 1}}}};
  EXPECT_THROW(resolve_spec(spec, lookup, names, provider, "(test)"), SpecError);
}

}  // namespace
}  // namespace loom::core
