// The plugin loader against well-behaved and broken plugins: every failure is one
// PluginError that names the place and the fix, never a crash.
#include "core/plugin/plugin_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>

#include "core/component/builder.h"
#include "core/util/errors.h"
#include "loom/cpp/object.h"
#include "tests/util/test_plugins.h"

namespace fs = std::filesystem;
using ::testing::HasSubstr;

namespace loom::core {
namespace {

using loom::testing::fresh_dir;
using loom::testing::install_test_plugin;
using loom::testing::write_file;

Catalog catalog_of(const fs::path& root) { return Catalog({{root, "test root"}}); }

// Loads `name` from `root` and returns the PluginError it throws ("" if none).
std::string load_error(const fs::path& root, const std::string& name, Code* code = nullptr) {
  try {
    PluginManager manager(catalog_of(root));
    manager.load(name);
  } catch (const PluginError& e) {
    if (code != nullptr) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(PluginManagerTest, LoadsAGoodPluginAndRegistersWhatItsManifestDeclares) {
  fs::path root = fresh_dir("good");
  install_test_plugin(root, "good", "testgood");
  PluginManager manager(catalog_of(root));
  manager.load("testgood");
  ASSERT_EQ(manager.loaded().size(), 1u);
  EXPECT_STREQ(manager.loaded()[0].info->version, "1.2.3");
  EXPECT_EQ(manager.loaded()[0].build.value("sdk", ""), LOOM_SDK_VERSION);
  const Registry& registry = manager.registry();
  ASSERT_NE(registry.find_factory("lr_schedule", "test_warmup"), nullptr);
  ASSERT_NE(registry.find_factory("norm", "test_scale"), nullptr);
  ASSERT_NE(registry.find_factory("model", "test_model"), nullptr);
  EXPECT_EQ(registry.find_factory("norm", "test_scale")->plugin, "testgood");
  EXPECT_EQ(registry.factories().size(), 3u);
  manager.load("testgood");  // idempotent
  EXPECT_EQ(manager.loaded().size(), 1u);
}

TEST(PluginManagerTest, KernelIsResolvedOnceAndCalledThroughThePointer) {
  fs::path root = fresh_dir("kernel");
  install_test_plugin(root, "good", "testgood");
  PluginManager manager(catalog_of(root));
  manager.load("testgood");
  KernelDesc desc{};
  Status s = manager.host().find_kernel(make_string_view("test_axpy"), DeviceType::kCpu,
                                        DType::kF32, nullptr, &desc);
  ASSERT_EQ(s.code, Code::kOk);
  EXPECT_STREQ(desc.name, "testgood.axpy");
  float x[3] = {1, 2, 3}, y[3] = {10, 20, 30}, a = 2;
  TensorView vx{x, DType::kF32, {DeviceType::kCpu, 0}, 1, {3}, {1}};
  TensorView vy{y, DType::kF32, {DeviceType::kCpu, 0}, 1, {3}, {1}};
  OpCall call{sizeof(OpCall), &vx, 1, &vy, 1, &a, sizeof(a), nullptr, nullptr, 0};
  ASSERT_EQ(desc.fn(&call).code, Code::kOk);
  EXPECT_FLOAT_EQ(y[0], 12);
  EXPECT_FLOAT_EQ(y[1], 24);
  EXPECT_FLOAT_EQ(y[2], 36);
  // An op nobody provides is a clean not-found.
  s = manager.host().find_kernel(make_string_view("gemm"), DeviceType::kCpu, DType::kF32, nullptr,
                                 &desc);
  EXPECT_EQ(s.code, Code::kNotFound);
  EXPECT_THAT(s.message, HasSubstr("no kernel for op 'gemm'"));
  status_release(&s);
}

// Spec /kernels/pin: "op" pins every dtype, "op@dtype" one (and wins there); check_pins
// refuses, naming the pin, an op no library has, a suffix that is no dtype, and a kernel the
// op does not have, even where the run never asks for that op.
TEST(PluginManagerTest, PinsByOpAndDtypeAndTheirErrors) {
  fs::path root = fresh_dir("pins");
  install_test_plugin(root, "good", "testgood");
  PluginManager manager(catalog_of(root));
  manager.load("testgood");
  Host& host = manager.host();
  auto find = [&](DType dtype) {
    KernelDesc desc{};
    Status s =
        host.find_kernel(make_string_view("test_axpy"), DeviceType::kCpu, dtype, nullptr, &desc);
    std::string out = s.code == Code::kOk ? std::string("ok ") + desc.name : s.message;
    status_release(&s);
    return out;
  };
  auto check = [&](std::map<std::string, std::string> pins) {
    host.set_pins(std::move(pins));
    try {
      host.check_pins();
    } catch (const SpecError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(check({{"test_axpy", "testgood.axpy"}}), "");
  EXPECT_EQ(find(DType::kF32), "ok testgood.axpy");
  // A pin of another dtype leaves f32 to the ranking; one of f32 to "none" wins over the
  // plain pin.
  EXPECT_EQ(check({{"test_axpy@bf16", "none"}}), "");
  EXPECT_EQ(find(DType::kF32), "ok testgood.axpy");
  EXPECT_EQ(check({{"test_axpy", "testgood.axpy"}, {"test_axpy@f32", "none"}}), "");
  EXPECT_THAT(find(DType::kF32), HasSubstr("spec /kernels/pin/test_axpy@f32: pinned to 'none'"));
  // A kernel the op has for another dtype only: found by the check, named at resolution.
  EXPECT_THAT(check({{"test_axpy@f16", "testgood.axpy"}}),
              HasSubstr("/kernels/pin/test_axpy@f16: no kernel 'testgood.axpy' for op "
                        "'test_axpy' with dtype f16 (available: none"));
  EXPECT_THAT(check({{"test_axpyy", "testgood.axpy"}}),
              HasSubstr("/kernels/pin/test_axpyy: no loaded kernel library has op 'test_axpyy' "
                        "(ops with that prefix: test_axpy)"));
  EXPECT_THAT(check({{"test_axpy@f33", "testgood.axpy"}}),
              HasSubstr("/kernels/pin/test_axpy@f33: 'f33' is not a dtype"));
  EXPECT_THAT(check({{"test_axpy", "testgood.axpyy"}}),
              HasSubstr("/kernels/pin/test_axpy: no kernel 'testgood.axpyy' for op 'test_axpy' "
                        "(available: testgood.axpy, or \"none\")"));
  host.set_pins({{"test_axpy", "testgood.axpyy"}});
  EXPECT_THAT(find(DType::kF32), HasSubstr("change the pin, pin only 'test_axpy@<dtype>'"));
}

TEST(PluginManagerTest, BuildsAModelWithItsChildThroughTheRegistry) {
  fs::path root = fresh_dir("build");
  install_test_plugin(root, "good", "testgood");
  PluginManager manager(catalog_of(root));
  manager.load("testgood");
  nlohmann::json node = {{"impl", "test_model"},
                         {"vocab_size", 7},
                         {"hidden_size", 3},
                         {"norm", {{"impl", "test_scale"}, {"scale", 2.0}}}};
  ObjectPtr object = build_component(manager, node, kinds::kModel, "/model");
  IModel* model = interface_cast<IModel>(object.get());
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(interface_cast<INorm>(object.get()), nullptr);  // wrong kind is refused
  ParamInfo info{};
  info.struct_size = sizeof(ParamInfo);
  ASSERT_EQ(model->param_info(0, &info).code, Code::kOk);
  EXPECT_EQ(info.global_shape[0], 7);
  EXPECT_EQ(info.global_shape[1], 3);
  ASSERT_EQ(model->child_count(), 1);
}

TEST(PluginManagerTest, HostAllocatorTracksCurrentAndPeak) {
  PluginManager manager(Catalog({}));
  Host& host = manager.host();
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(host.allocate({DeviceType::kCpu, 0}, 100, 64, &a).code, Code::kOk);
  ASSERT_EQ(host.allocate({DeviceType::kCpu, 0}, 1000, 256, &b).code, Code::kOk);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 256, 0u);
  EXPECT_EQ(host.cpu_memory().current, 128u + 1024u);
  host.deallocate({DeviceType::kCpu, 0}, a);
  EXPECT_EQ(host.cpu_memory().current, 1024u);
  EXPECT_EQ(host.cpu_memory().peak, 1152u);
  host.deallocate({DeviceType::kCpu, 0}, b);
  Status s = host.allocate({DeviceType::kCuda, 0}, 16, 64, &a);
  EXPECT_EQ(s.code, Code::kUnavailable);
  status_release(&s);
}

TEST(PluginManagerTest, PluginNotFoundNamesTheSearchPath) {
  fs::path root = fresh_dir("empty");
  Code code{};
  std::string e = load_error(root, "moe", &code);
  EXPECT_EQ(code, Code::kNotFound);
  EXPECT_THAT(e, HasSubstr("plugin 'moe' not found; searched: " + root.string() + " (test root)"));
}

TEST(PluginManagerTest, MissingLibraryIsReported) {
  fs::path root = fresh_dir("missing_lib");
  fs::path dir = install_test_plugin(root, "good", "testgood");
  fs::remove(dir / "libloom_testgood.so");
  std::string e = load_error(root, "testgood");
  EXPECT_THAT(e, HasSubstr("libloom_testgood.so is missing"));
  EXPECT_THAT(e, HasSubstr("build or reinstall the plugin"));
}

TEST(PluginManagerTest, FileThatIsNotASharedObjectIsReported) {
  fs::path root = fresh_dir("not_so");
  fs::path dir = install_test_plugin(root, "good", "testgood");
  write_file(dir / "libloom_testgood.so", "this is text, not ELF\n");
  EXPECT_THAT(load_error(root, "testgood"), HasSubstr("is not a shared object"));
  write_file(dir / "libloom_testgood.so",
             "\x7f"
             "ELF but truncated");
  EXPECT_THAT(load_error(root, "testgood"), HasSubstr("is not a readable shared object"));
}

TEST(PluginManagerTest, MissingEntrySymbolIsReported) {
  fs::path root = fresh_dir("no_entry");
  install_test_plugin(root, "no_entry", "testnoentry");
  Code code{};
  std::string e = load_error(root, "testnoentry", &code);
  EXPECT_EQ(code, Code::kAbiMismatch);
  EXPECT_THAT(e, HasSubstr("does not export 'loom_plugin_v1' (found loom_plugin_v0)"));
  EXPECT_THAT(e, HasSubstr("LOOM_PLUGIN(...)"));
}

TEST(PluginManagerTest, AbiMajorMismatchIsRefusedBeforeInit) {
  fs::path root = fresh_dir("abi_major");
  install_test_plugin(root, "abi_major", "testabimajor");
  Code code{};
  std::string e = load_error(root, "testabimajor", &code);  // init would abort()
  EXPECT_EQ(code, Code::kAbiMismatch);
  EXPECT_THAT(
      e, HasSubstr("was built for SDK ABI 2.0, this loom provides " LOOM_ABI_STRING ": rebuild it "
                   "against SDK 1.x"));
}

TEST(PluginManagerTest, AbiMinorNewerThanCoreIsRefused) {
  fs::path root = fresh_dir("abi_minor");
  install_test_plugin(root, "abi_minor", "testabiminor");
  std::string e = load_error(root, "testabiminor");
  EXPECT_THAT(e, HasSubstr("was built for SDK ABI 1." + std::to_string(LOOM_ABI_MINOR + 1) +
                           ", newer than this loom's " LOOM_ABI_STRING));
}

TEST(PluginManagerTest, DuplicateRegistrationNamesBothPlugins) {
  fs::path root = fresh_dir("dup");
  install_test_plugin(root, "good", "testgood");
  install_test_plugin(root, "dup", "testdup");
  Code code{};
  std::string message;
  try {
    PluginManager manager(catalog_of(root));
    manager.load_all();
  } catch (const PluginError& e) {
    code = e.code();
    message = e.what();
  }
  EXPECT_EQ(code, Code::kAlreadyExists);
  EXPECT_THAT(message, HasSubstr("duplicate registration of norm 'test_scale': plugin 'testdup' "
                                 "registered it already and plugin 'testgood' registers it again"));
}

TEST(PluginManagerTest, InitFailureIsReportedWithThePluginsReason) {
  fs::path root = fresh_dir("init_fails");
  install_test_plugin(root, "init_fails", "testinitfails");
  std::string e = load_error(root, "testinitfails");
  EXPECT_THAT(e, HasSubstr("plugin 'testinitfails'"));
  EXPECT_THAT(e, HasSubstr("init failed: license server unreachable (test)"));
}

TEST(PluginManagerTest, SidecarThatDisagreesWithTheLibraryIsReported) {
  fs::path root = fresh_dir("mismatch");
  fs::path dir = install_test_plugin(root, "good", "testgood");
  std::string manifest = loom::testing::read_file(dir / "plugin.json");
  size_t at = manifest.find("1.2.3");
  ASSERT_NE(at, std::string::npos);
  manifest.replace(at, 5, "9.9.9");
  write_file(dir / "plugin.json", manifest);
  EXPECT_THAT(load_error(root, "testgood"),
              HasSubstr("says it is plugin 'testgood' 1.2.3 but its manifest"));
}

TEST(CatalogTest, BrokenManifestNamesTheFile) {
  fs::path root = fresh_dir("broken_manifest");
  write_file(root / "x" / "plugin.json", "{\"schema\": \"loom.plugin/1\", \"name\": ");
  try {
    Catalog catalog({{root, "test root"}});
    FAIL() << "expected a PluginError";
  } catch (const PluginError& e) {
    EXPECT_THAT(e.what(), HasSubstr((root / "x" / "plugin.json").string() + ":1:"));
    EXPECT_THAT(e.what(), HasSubstr("syntax error"));
    EXPECT_THAT(e.what(), HasSubstr("fix the plugin's manifest"));
  }
  write_file(root / "x" / "plugin.json",
             R"({"schema": "loom.plugin/1", "name": "x", "version": "1",
                 "components": [{"kind": "attention", "name": "a", "options": {"typ": "object"}}]})");
  try {
    Catalog catalog({{root, "test root"}});
    FAIL() << "expected a PluginError";
  } catch (const PluginError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/components/0/options"));
    EXPECT_THAT(e.what(), HasSubstr("typ"));
  }
}

TEST(CatalogTest, EarlierRootsShadowLaterOnesAndComponentsAreIndexed) {
  fs::path a = fresh_dir("root_a"), b = fresh_dir("root_b");
  install_test_plugin(a, "good", "testgood");
  install_test_plugin(b, "good", "testgood");
  Catalog catalog({{a, "first"}, {b, "second"}});
  ASSERT_EQ(catalog.plugins().size(), 1u);
  EXPECT_EQ(catalog.plugins()[0].origin, "first");
  EXPECT_EQ(catalog.provider("norm", "test_scale")->name, "testgood");
  EXPECT_EQ(catalog.component_names("lr_schedule"), std::vector<std::string>{"test_warmup"});
  EXPECT_EQ(catalog.provider("norm", "nope"), nullptr);
}

// Outside JSON that used to crash loom (issue "Reliability II"): a manifest nested 100,000
// deep, a number beyond double, a value of the wrong type, a library outside the plugin's
// directory: each is one PluginError naming the file and the place.
TEST(CatalogTest, HostileManifestsAreCleanErrors) {
  fs::path root = fresh_dir("hostile_manifest");
  fs::path file = root / "x" / "plugin.json";
  const std::string head = R"({"schema": "loom.plugin/1", "name": "x", "version": "1", )";
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
       "plugin.json:1:262: JSON nested deeper than 256"},
      {head + R"("description": 1e309})", "number overflow parsing '1e309'"},
      {head + R"("description": 3})", ": /description: expected a string, got 3"},
      {head + R"("components": [{"kind": "norm", "name": "n", "description": []}]})",
       ": /components/0/description: expected a string, got []"},
      {head + R"("components": {}})", ": /components: expected an array, got {}"},
      {head + R"("library": "../y/libloom_y.so"})",
       ": /library: '../y/libloom_y.so' is not a file name; the library must sit beside"},
      {head + R"("library": "/lib/libc.so.6"})", ": /library: '/lib/libc.so.6' is not a file"},
  };
  for (const Case& c : cases) {
    write_file(file, c.text);
    try {
      Catalog catalog({{root, "test root"}});
      ADD_FAILURE() << "accepted: " << c.message;
    } catch (const PluginError& e) {
      std::printf("%s\n", e.what());
      EXPECT_EQ(e.code(), Code::kInvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr(file.string() + ":"));
      EXPECT_THAT(e.what(), HasSubstr(c.message));
    }
  }
  // The control: the library named by its file name alone is fine.
  write_file(file, head + R"("library": "libloom_y.so"})");
  Catalog catalog({{root, "test root"}});
  EXPECT_EQ(catalog.find("x")->library, root / "x" / "libloom_y.so");
}

}  // namespace
}  // namespace loom::core
