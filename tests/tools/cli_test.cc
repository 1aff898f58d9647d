// The `loom` command end to end: every kind of bad input gives one clean message that
// names the place and the fix, and the documented exit code (README.md, `loom --help`).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "loom/version.h"
#include "tests/util/test_plugins.h"

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

namespace loom {
namespace {

using testing::fresh_dir;
using testing::install_test_plugin;
using testing::read_file;
using testing::run_loom;
using testing::RunResult;
using testing::write_file;

constexpr int kOk = 0, kUsage = 2, kSpec = 3, kPlugin = 4, kIo = 5, kUnavailable = 7;

// Exactly one error line, "loom COMMAND: error: ...".
void expect_one_error(const RunResult& r, const std::string& command) {
  EXPECT_THAT(r.err, StartsWith("loom " + command + ": error: ")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::testing::isolated_binary = true;
    dir_ = fresh_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    plugins_ = dir_ / "plugins";
    install_test_plugin(plugins_, "good", "testgood");
  }
  // Writes a spec into the test's directory; it finds the plugins through search_paths.
  fs::path spec(const std::string& name, nlohmann::json body) {
    if (!body.contains("plugins")) body["plugins"] = {{"search_paths", {"plugins"}}};
    fs::path path = dir_ / name;
    write_file(path, body.dump(2));
    return path;
  }
  std::string q(const fs::path& p) { return "'" + p.string() + "'"; }
  nlohmann::json warmup() { return {{"impl", "test_warmup"}, {"lr", 0.1}}; }

  fs::path dir_, plugins_;
};

TEST_F(CliTest, VersionAndHelp) {
  RunResult r = run_loom("version");
  EXPECT_EQ(r.exit_code, kOk);
  EXPECT_THAT(r.out, HasSubstr("plugin ABI " LOOM_ABI_STRING));
  r = run_loom("--help");
  EXPECT_EQ(r.exit_code, kOk);
  EXPECT_THAT(r.out, HasSubstr("exit codes:"));
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  RunResult r = run_loom("trian x.json");
  EXPECT_EQ(r.exit_code, kUsage);
  expect_one_error(r, "trian");
  EXPECT_THAT(r.err, HasSubstr("unknown command 'trian'"));
  r = run_loom("spec validate");
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, HasSubstr("missing argument\nusage: loom spec validate SPEC"));
  r = run_loom("spec validate x.json --sett a=1");
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, HasSubstr("unknown option '--sett' (did you mean '--set'?)"));
  r = run_loom("spec validate " + q(spec("s.json", {})) + " --set nonsense");
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, HasSubstr("--set 'nonsense': expected PATH=VALUE"));
}

TEST_F(CliTest, ValidSpecIsAcceptedAndResolvedWithDefaults) {
  fs::path s = spec("ok.json", {{"lr_schedule", warmup()}});
  fs::path resolved = dir_ / "out" / "resolved.json";
  RunResult r = run_loom("spec validate " + q(s) + " --set lr_schedule.warmup_steps=7 " +
                         "--set train.steps=5 --write-resolved " + q(resolved));
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("is valid"));
  EXPECT_THAT(r.out, HasSubstr("test_warmup"));
  nlohmann::json j = nlohmann::json::parse(read_file(resolved));
  EXPECT_EQ(j["lr_schedule"]["warmup_steps"], 7);  // --set
  EXPECT_EQ(j["lr_schedule"]["style"], "linear");  // plugin default
  EXPECT_EQ(j["train"]["steps"], 5);               // --set into a core section
  EXPECT_EQ(j["train"]["micro_batch_size"], 1);    // core default
  EXPECT_EQ(j["parallel"]["tp"], 1);
  EXPECT_EQ(j["lr_schedule"]["impl"], "test_warmup");
}

TEST_F(CliTest, MalformedJsonNamesLineAndColumn) {
  fs::path s = dir_ / "bad.json";
  write_file(s, "{\n  \"train\": {\"steps\": 10,}\n}\n");
  RunResult r = run_loom("spec validate " + q(s));
  EXPECT_EQ(r.exit_code, kSpec);
  expect_one_error(r, "spec");
  EXPECT_THAT(r.err, HasSubstr("error: spec " + s.string() + ":2:25: syntax error"));
}

TEST_F(CliTest, SpecMistakesNameThePointerAndTheFix) {
  struct Case {
    nlohmann::json spec;
    std::string message;
  };
  std::vector<Case> cases = {
      {{{"modle", {{"impl", "test_model"}}}},
       "spec /modle: unknown key 'modle' (did you mean 'model'?)"},
      {{{"lr_schedule", {{"impl", "test_warmup"}, {"lr", 0.1}, {"warmup_step", 3}}}},
       "spec /lr_schedule/warmup_step: unknown key 'warmup_step' (did you mean 'warmup_steps'?)"},
      {{{"lr_schedule", {{"impl", "test_warmup"}, {"lr", "big"}}}},
       "spec /lr_schedule/lr: expected number, got string \"big\""},
      {{{"lr_schedule", {{"impl", "test_warmup"}, {"lr", 0}}}},
       "spec /lr_schedule/lr: expected number > 0, got 0"},
      {{{"parallel", {{"tp", 0}}}}, "spec /parallel/tp: expected integer >= 1, got 0"},
      {{{"lr_schedule", {{"impl", "test_warmup"}}}},
       "spec /lr_schedule: missing required key 'lr'"},
      {{{"lr_schedule", {{"impl", "test_warmpu"}, {"lr", 1}}}},
       "spec /lr_schedule/impl: unknown lr_schedule impl 'test_warmpu' (did you mean "
       "'test_warmup', provided by plugin testgood?)"},
      {{{"optimizer", {{"impl", "adamw"}}}},
       "spec /optimizer/impl: unknown optimizer impl 'adamw'; no plugin found provides any "
       "optimizer; plugins searched: "},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    fs::path s = spec("case" + std::to_string(i) + ".json", cases[i].spec);
    RunResult r = run_loom("spec validate " + q(s));
    EXPECT_EQ(r.exit_code, kSpec) << cases[i].spec.dump();
    expect_one_error(r, "spec");
    EXPECT_THAT(r.err, HasSubstr(cases[i].message)) << cases[i].spec.dump();
  }
}

TEST_F(CliTest, MissingSpecFileIsAnIoError) {
  RunResult r = run_loom("spec validate " + q(dir_ / "nope.json"));
  EXPECT_EQ(r.exit_code, kIo);
  expect_one_error(r, "spec");
  EXPECT_THAT(r.err, HasSubstr("nope.json does not exist"));
}

TEST_F(CliTest, PluginProblemsExitFour) {
  struct Case {
    std::string package, plugin, message;
  };
  std::vector<Case> cases = {
      {"no_entry", "testnoentry", "does not export 'loom_plugin_v1'"},
      {"abi_major", "testabimajor",
       "was built for SDK ABI 2.0, this loom provides " LOOM_ABI_STRING},
      {"abi_minor", "testabiminor", "newer than this loom's " LOOM_ABI_STRING},
      {"init_fails", "testinitfails", "init failed: license server unreachable (test)"},
  };
  for (const Case& c : cases) {
    fs::path root = dir_ / ("root_" + c.plugin);
    install_test_plugin(root, c.package, c.plugin);
    RunResult r = run_loom("plugins check " + c.plugin + " --plugin-path " + q(root));
    EXPECT_EQ(r.exit_code, kPlugin) << c.plugin << ": " << r.err;
    expect_one_error(r, "plugins");
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
  // Missing file, and a file that is not a shared object, reached through a spec.
  fs::path s = spec("load.json", {{"lr_schedule", warmup()}});
  fs::path lib = plugins_ / "testgood" / "libloom_testgood.so";
  fs::rename(lib, dir_ / "saved.so");
  RunResult r = run_loom("spec validate --load " + q(s));
  EXPECT_EQ(r.exit_code, kPlugin);
  expect_one_error(r, "spec");
  EXPECT_THAT(r.err, HasSubstr("libloom_testgood.so is missing"));
  write_file(lib, "not a library");
  r = run_loom("spec validate --load " + q(s));
  EXPECT_EQ(r.exit_code, kPlugin);
  EXPECT_THAT(r.err, HasSubstr("is not a shared object"));
  // A plugin named by plugins.load that is nowhere.
  fs::rename(dir_ / "saved.so", lib);
  s = spec("missing.json", {{"plugins", {{"search_paths", {"plugins"}}, {"load", {"moe"}}}}});
  r = run_loom("spec validate --load " + q(s));
  EXPECT_EQ(r.exit_code, kPlugin);
  EXPECT_THAT(r.err, HasSubstr("plugin 'moe' not found; searched: " + plugins_.string()));
}

TEST_F(CliTest, DuplicateRegistrationExitsFour) {
  install_test_plugin(plugins_, "dup", "testdup");
  RunResult r = run_loom("plugins check --plugin-path " + q(plugins_));
  EXPECT_EQ(r.exit_code, kPlugin);
  expect_one_error(r, "plugins");
  EXPECT_THAT(r.err, HasSubstr("duplicate registration of norm 'test_scale'"));
}

TEST_F(CliTest, ListAndDescribeReadManifestsOnly) {
  // A broken library does not matter to list/describe: they never load code.
  write_file(plugins_ / "testgood" / "libloom_testgood.so", "not a library");
  RunResult r = run_loom("plugins list --plugin-path " + q(plugins_));
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("testgood 1.2.3"));
  EXPECT_THAT(r.out, HasSubstr("test_warmup"));
  r = run_loom("plugins describe test_warmup --plugin-path " + q(plugins_));
  ASSERT_EQ(r.exit_code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("lr"));
  EXPECT_THAT(r.out, HasSubstr("required"));
  r = run_loom("plugins describe test_warmpu --plugin-path " + q(plugins_));
  EXPECT_EQ(r.exit_code, kPlugin);
  EXPECT_THAT(r.err, HasSubstr("(did you mean 'test_warmup'?)"));
}

TEST_F(CliTest, TrainWithoutAModelPluginSaysSo) {
  fs::create_directories(dir_ / "empty");
  fs::path s =
      spec("gpt.json", {{"model", {{"impl", "gptx"}}}, {"plugins", {{"search_paths", {"empty"}}}}});
  RunResult r = run_loom("train " + q(s));
  EXPECT_EQ(r.exit_code, kSpec);
  expect_one_error(r, "train");
  EXPECT_THAT(r.err, HasSubstr("/model/impl"));
  EXPECT_THAT(r.err, HasSubstr("gptx"));
}

TEST_F(CliTest, TrainWritesTheResolvedSpecAndNeedsAKernelLibrary) {
  fs::path s =
      spec("model.json", {{"model", {{"impl", "test_model"}, {"norm", {{"impl", "test_scale"}}}}}});
  fs::path run_dir = dir_ / "run";
  RunResult r = run_loom("train " + q(s) + " --run-dir " + q(run_dir));
  EXPECT_THAT(r.out, HasSubstr("layout: tp=1 cp=1 ep=1 dp=1 pp=1 (world size 1)"));
  nlohmann::json j = nlohmann::json::parse(read_file(run_dir / "spec.resolved.json"));
  EXPECT_EQ(j["model"]["vocab_size"], 16);
  EXPECT_EQ(j["model"]["norm"]["scale"], 1.0);
  EXPECT_EQ(j["log"]["run_dir"], run_dir.string());
  // Only the test plugins are on the search path: the CPU kernel library is missing, and
  // the message says where it looked.
  EXPECT_EQ(r.exit_code, kPlugin);
  expect_one_error(r, "train");
  EXPECT_THAT(r.err, HasSubstr("kernel library 'kernels_cpu' not found"));
}

TEST_F(CliTest, TrainRefusesParallelLayoutsItCannotStart) {
  // A pipeline needs a schedule; none of the plugins on this search path provides one.
  fs::path s =
      spec("pp.json", {{"model", {{"impl", "test_model"}, {"norm", {{"impl", "test_scale"}}}}},
                       {"parallel", {{"pp", 2}}}});
  RunResult r = run_loom("train " + q(s) + " --run-dir " + q(dir_ / "pp"));
  EXPECT_EQ(r.exit_code, kSpec);
  expect_one_error(r, "train");
  EXPECT_THAT(r.err, HasSubstr("/parallel/pipeline_schedule/impl: unknown pipeline_schedule "
                               "impl '1f1b'"));
  // A layout of several ranks in one process says how to start them.
  s = spec("tp.json", {{"model", {{"impl", "test_model"}, {"norm", {{"impl", "test_scale"}}}}},
                       {"parallel", {{"tp", 2}}}});
  r = run_loom("train " + q(s) + " --run-dir " + q(dir_ / "tp"));
  EXPECT_EQ(r.exit_code, kSpec);
  expect_one_error(r, "train");
  EXPECT_THAT(r.err, HasSubstr("--nproc 2"));
}

TEST_F(CliTest, BenchRejectsBadNumbers) {
  fs::path s =
      spec("model.json", {{"model", {{"impl", "test_model"}, {"norm", {{"impl", "test_scale"}}}}}});
  RunResult r = run_loom("bench " + q(s) + " --steps ten");
  EXPECT_EQ(r.exit_code, kUsage);
  expect_one_error(r, "bench");
  EXPECT_THAT(r.err, HasSubstr("--steps expects a non-negative integer, got 'ten'"));
}

// Outside JSON that used to crash loom (issue "Reliability II") and plugins.load entries
// that `spec validate` accepted without --load: each is one message and its exit code.
TEST_F(CliTest, DeepOrOverflowingSpecIsASpecErrorNotASignal) {
  fs::path s = dir_ / "deep.json";
  write_file(s, "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  RunResult r = run_loom("spec validate " + q(s));
  std::printf("100,000 deep: exit %d: %s", r.exit_code, r.err.c_str());
  EXPECT_EQ(r.exit_code, kSpec);  // -1 when a signal (SIGSEGV) ended it
  expect_one_error(r, "spec");
  EXPECT_THAT(r.err, HasSubstr("spec " + s.string() + ":1:266: JSON nested deeper than 256"));

  s = dir_ / "huge.json";
  write_file(s, "{\"lr_schedule\": {\"impl\": \"test_warmup\", \"lr\": 1e309}}");
  r = run_loom("spec validate " + q(s));
  std::printf("1e309: exit %d: %s", r.exit_code, r.err.c_str());
  EXPECT_EQ(r.exit_code, kSpec);
  expect_one_error(r, "spec");
  EXPECT_THAT(r.err, HasSubstr("number overflow parsing '1e309'"));
  EXPECT_THAT(r.err, Not(HasSubstr("internal error")));

  r = run_loom("spec validate " + q(spec("ok.json", {{"lr_schedule", warmup()}})) +
               " --set optimizer.lr=1e999");
  std::printf("--set 1e999: exit %d: %s", r.exit_code, r.err.c_str());
  EXPECT_EQ(r.exit_code, kUsage);
  expect_one_error(r, "spec");
  EXPECT_THAT(r.err, HasSubstr("--set 'optimizer.lr=1e999'"));
  EXPECT_THAT(r.err, HasSubstr("a number too large for a double"));
}

TEST_F(CliTest, ValidateChecksPluginsLoadWithoutLoading) {
  auto with_load = [&](const std::string& name, const std::string& entry) {
    return spec(name, {{"plugins", {{"search_paths", {"plugins"}}, {"load", {entry}}}}});
  };
  // The control: the test plugin, by name, is valid.
  RunResult r = run_loom("spec validate " + q(with_load("good.json", "testgood")));
  ASSERT_EQ(r.exit_code, kOk) << r.err;

  struct Case {
    std::string entry;
    std::function<void()> damage;  // done to the plugin directory before the run
    int exit_code;
    std::string message;
  };
  fs::path lib = plugins_ / "testgood" / "libloom_testgood.so";
  fs::path saved = dir_ / "saved.so";
  const std::vector<Case> cases = {
      {"nope", [] {}, kPlugin, "plugin 'nope' not found; searched: " + plugins_.string()},
      {"../plugins/testgood", [] {}, kSpec,
       "spec /plugins/load/0: '../plugins/testgood' is a path; plugins.load takes plugin names"},
      {"plugins/testgood/libloom_testgood.so", [] {}, kSpec, "is a path"},
      {"testgood", [&] { fs::rename(lib, saved); }, kPlugin, "libloom_testgood.so is missing"},
      {"testgood",
       [&] {
         fs::rename(lib, saved);
         fs::create_directory(lib);
       },
       kPlugin, "is not a shared object"},
      {"testgood",
       [&] {
         fs::rename(lib, saved);
         write_file(lib, "not a library");
       },
       kPlugin, "is not a shared object"},
  };
  for (const Case& c : cases) {
    c.damage();
    r = run_loom("spec validate " + q(with_load("load.json", c.entry)));
    std::printf("%s: exit %d: %s", c.entry.c_str(), r.exit_code, r.err.c_str());
    EXPECT_EQ(r.exit_code, c.exit_code) << c.entry;
    expect_one_error(r, "spec");
    EXPECT_THAT(r.err, HasSubstr(c.message));
    if (fs::exists(saved)) {  // restore the library
      fs::remove_all(lib);
      fs::rename(saved, lib);
    }
  }
}

// README: plugins are searched in plugins.search_paths, --plugin-path, LOOM_PLUGIN_PATH and
// the install's directory, "never the working directory".
TEST_F(CliTest, PluginsAreNeverSearchedInTheWorkingDirectory) {
  fs::path cwd = dir_ / "cwd";
  // Every layout a search root may have, in the working directory: a root holding plugin
  // folders, a root that is a plugin folder, and a plugins/ folder.
  install_test_plugin(cwd, "good", "testgood");
  install_test_plugin(cwd / "plugins", "good", "testgood");
  fs::copy_file(cwd / "testgood" / "plugin.json", cwd / "plugin.json");
  fs::copy_file(cwd / "testgood" / "libloom_testgood.so", cwd / "libloom_testgood.so");
  const std::string env = "-u LOOM_PLUGIN_PATH LOOM_UNUSED=1";

  RunResult r = run_loom("plugins list", env, cwd);
  std::printf("plugins list in %s: exit %d\n%s%s", cwd.string().c_str(), r.exit_code, r.out.c_str(),
              r.err.c_str());
  EXPECT_THAT(r.out + r.err, Not(HasSubstr("testgood")));
  fs::path s = cwd / "spec.json";
  write_file(
      s, nlohmann::json({{"lr_schedule", warmup()}, {"plugins", nlohmann::json::object()}}).dump());
  r = run_loom("spec validate spec.json", env, cwd);
  std::printf("spec validate: exit %d: %s", r.exit_code, r.err.c_str());
  EXPECT_EQ(r.exit_code, kSpec);
  EXPECT_THAT(r.err, HasSubstr("unknown lr_schedule impl 'test_warmup'"));
  write_file(s, nlohmann::json({{"plugins", {{"load", {"testgood"}}}}}).dump());
  r = run_loom("spec validate spec.json", env, cwd);
  EXPECT_EQ(r.exit_code, kPlugin);
  EXPECT_THAT(r.err, HasSubstr("plugin 'testgood' not found"));
  // The control: named explicitly, the same directory is searched and the plugin found.
  r = run_loom("plugins list --plugin-path .", env, cwd);
  EXPECT_EQ(r.exit_code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("testgood"));
}

}  // namespace
}  // namespace loom
