// Spec loading and --set overrides (core/spec/spec.h).
#include "core/spec/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/plugin/catalog.h"
#include "core/util/errors.h"

using ::testing::HasSubstr;
using ::testing::Not;

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

// A component whose options default a sub-component to itself (found by the spec fuzzer:
// unbounded recursion, SIGSEGV) nests 32 deep and stops with the place.
TEST(ResolveSpecTest, SelfNestingComponentsStop) {
  nlohmann::json schema = {
      {"type", "object"},
      {"properties",
       {{"child", {{"x-loom-component", "model"}, {"default", {{"impl", "selfref"}}}}}}}};
  auto lookup = [&](const std::string& kind, const std::string& name, nlohmann::json* out) {
    if (kind != "model" || name != "selfref") return false;
    *out = schema;
    return true;
  };
  auto names = [](const std::string&) { return std::vector<std::string>{"selfref"}; };
  auto provider = [](const std::string&, const std::string&) { return std::string("p"); };
  nlohmann::json spec = {{"model", {{"impl", "selfref"}}}};
  try {
    resolve_spec(spec, lookup, names, provider, "(test)");
    FAIL() << "resolved a component that nests without end";
  } catch (const SpecError& e) {
    std::printf("%s\n", e.what());
    EXPECT_THAT(e.what(), HasSubstr("components nest more than 32 deep here"));
    EXPECT_EQ(e.pointer().rfind("/model/child/child/", 0), 0u) << e.pointer();
  }
}

// Outside JSON that used to crash loom (issue "Reliability II"): each is one clean error.

// The message of the loom::Error that `fn` throws, with its code ("" when none is thrown).
template <class Fn>
std::string error_of(Fn&& fn, Code* code = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (code != nullptr) *code = e.code();
    return e.what();
  }
  return "";
}

std::filesystem::path write_temp(const std::string& name, const std::string& text) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path path =
      std::filesystem::path(base ? base : std::filesystem::temp_directory_path().string()) / name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(LoadSpecFileTest, DeepNestingIsACleanErrorNotAStackOverflow) {
  // {"model": [[[...]]]} nested 100,000 deep: the schema walk would recurse once per level.
  const int depth = 100000;
  std::string text = "{\"model\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
  std::filesystem::path path = write_temp("deep.json", text);
  Code code = Code::kOk;
  std::string msg = error_of([&] { load_spec_file(path); }, &code);
  std::printf("100,000 deep: %s\n", msg.c_str());
  EXPECT_EQ(code, Code::kInvalidArgument);
  // The 257th '[' (the object is level 1) is at column 10 + 256 = 266.
  EXPECT_THAT(msg, HasSubstr("spec " + path.string() + ":1:266: JSON nested deeper than 256"));
  // 255 levels of arrays inside the object (256 in all) are still a spec (a wrong one, but
  // that is the schema's to say).
  text = "{\"model\": " + std::string(255, '[') + std::string(255, ']') + "}";
  path = write_temp("deep_ok.json", text);
  EXPECT_EQ(load_spec_file(path)["model"].size(), 1u);
}

TEST(LoadSpecFileTest, NumberBeyondDoubleIsACleanError) {
  std::filesystem::path path = write_temp("huge.json", "{\"optimizer\": {\"lr\": 1e309}}");
  Code code = Code::kOk;
  std::string msg = error_of([&] { load_spec_file(path); }, &code);
  std::printf("1e309: %s\n", msg.c_str());
  EXPECT_EQ(code, Code::kInvalidArgument);
  EXPECT_THAT(msg, HasSubstr("spec " + path.string() + ":"));
  EXPECT_THAT(msg, HasSubstr("number overflow parsing '1e309'"));
  EXPECT_THAT(msg, Not(HasSubstr("json.exception")));
}

TEST(ApplyOverrideTest, NumberBeyondDoubleNamesTheArgument) {
  nlohmann::json spec = nlohmann::json::object();
  try {
    apply_override(spec, "optimizer.lr=1e999");
    FAIL() << "1e999 was accepted as " << spec.dump();
  } catch (const UsageError& e) {
    std::printf("--set 1e999: %s\n", e.what());
    EXPECT_THAT(e.what(), HasSubstr("--set 'optimizer.lr=1e999': number overflow parsing "
                                    "'1e999': a number too large for a double"));
  }
  // Still JSON when it fits, and a string when it is not JSON at all.
  apply_override(spec, "optimizer.lr=1e308");
  EXPECT_EQ(spec["optimizer"]["lr"].get<double>(), 1e308);
  apply_override(spec, "optimizer.name=1e3x");
  EXPECT_EQ(spec["optimizer"]["name"], "1e3x");
  // A value nested deeper than any spec field.
  std::string deep = "train.x=" + std::string(100000, '[') + std::string(100000, ']');
  std::string msg = error_of([&] { apply_override(spec, deep); });
  EXPECT_THAT(msg, HasSubstr("nests arrays or objects deeper than 256 levels")) << msg;
}

TEST(CheckPluginsToLoadTest, PathsAndMissingPluginsAreRefusedWithoutLoading) {
  Catalog empty({});
  nlohmann::json spec = {{"plugins", {{"load", {"../plugins/moe"}}}}};
  try {
    check_plugins_to_load(spec, empty);
    FAIL();
  } catch (const SpecError& e) {
    std::printf("path: %s\n", e.what());
    EXPECT_EQ(e.pointer(), "/plugins/load/0");
    EXPECT_THAT(e.what(), HasSubstr("'../plugins/moe' is a path; plugins.load takes plugin names"));
    EXPECT_THAT(e.what(), HasSubstr("plugins.search_paths"));
  }
  spec["plugins"]["load"] = {"ok_name", ".."};
  EXPECT_THROW(check_plugins_to_load(spec, empty), SpecError);
  spec["plugins"]["load"] = {"moe"};
  Code code = Code::kOk;
  std::string msg = error_of([&] { check_plugins_to_load(spec, empty); }, &code);
  EXPECT_EQ(code, Code::kNotFound);
  EXPECT_THAT(msg, HasSubstr("plugin 'moe' not found; searched:"));
  spec["plugins"]["load"] = nlohmann::json::array();
  check_plugins_to_load(spec, empty);  // nothing to load: nothing to refuse
}

}  // namespace
}  // namespace loom::core
