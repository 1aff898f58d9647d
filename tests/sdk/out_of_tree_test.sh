#!/usr/bin/env bash
# The SDK's out-of-tree path, end to end: install the SDK with sdk/install.sh into a temp
# prefix, build the example plugin (sdk/examples/hello_plugin) with CMake and clang++
# against that prefix only, and check what came out:
#   - libloom_hello.so and plugin.json in build/hello/, plugin.json == manifest.json;
#   - the library exports exactly one symbol, loom_plugin_v1;
#   - loaded by a small host (built with the other compiler, g++), its PluginInfo carries the
#     ABI version, name, version and the manifest byte for byte, and its factory builds a
#     scale_norm whose forward and backward give the expected numbers;
#   - the pkg-config file's flags build an equivalent plugin by hand.
# Everything is written under $TEST_TMPDIR.
set -euo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { echo "--- $*"; }

: "${TEST_TMPDIR:?run this with bazel test //tests/sdk:out_of_tree_test}"
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
install_sh="$runfiles/sdk/install.sh"
example="$runfiles/sdk/examples/hello_plugin"
work="$TEST_TMPDIR/out_of_tree"
rm -rf "$work"
mkdir -p "$work"
export HOME="$work/home"  # CMake may write a package registry under $HOME
mkdir -p "$HOME"

for tool in clang++ c++ cmake nm pkg-config; do
  command -v "$tool" > /dev/null || fail "$tool not found on PATH (this test is tagged requires-clang; install clang, cmake, binutils and pkg-config)"
done
clang++ --version > /dev/null || fail "clang++ --version failed"
echo "clang++: $(clang++ --version | head -n 1)"

# --- install.sh ------------------------------------------------------------------------------
step "install.sh refuses a missing or empty PREFIX with exit code 2"
for args in "" "''"; do
  set +e
  eval "\"\$install_sh\" $args" > "$work/usage.out" 2>&1
  rc=$?
  set -e
  [[ $rc -eq 2 ]] || fail "install.sh $args exited $rc, expected 2; output: $(cat "$work/usage.out")"
  grep -q "usage:" "$work/usage.out" || fail "install.sh $args printed no usage: $(cat "$work/usage.out")"
done

step "install.sh PREFIX (relative to BUILD_WORKING_DIRECTORY, as under bazel run)"
prefix="$work/prefix"
(cd "$runfiles" && BUILD_WORKING_DIRECTORY="$work" "$install_sh" prefix)
for f in include/loom/sdk.h include/loom/cpp/plugin.h lib/pkgconfig/loom-sdk.pc \
  lib/cmake/LoomSDK/LoomSDKConfig.cmake lib/cmake/LoomSDK/LoomSDKConfigVersion.cmake \
  share/loom/plugin.lds share/loom/bazel/WORKSPACE share/loom/bazel/sdk/BUILD \
  share/loom/bazel/sdk/defs.bzl share/loom/bazel/sdk/plugin.lds \
  share/loom/bazel/sdk/include/loom/sdk.h; do
  [[ -f "$prefix/$f" ]] || fail "install.sh did not install $f"
done
grep -q 'workspace(name = "loom_sdk")' "$prefix/share/loom/bazel/WORKSPACE" ||
  fail "the installed Bazel workspace is not named loom_sdk"
if grep -rq "@nlohmann_json" "$prefix/share/loom/bazel"/sdk/BUILD; then
  fail "the installed Bazel workspace refers to @nlohmann_json, which only the loom repo has"
fi

step "install.sh is idempotent"
listing() { (cd "$prefix" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
listing > "$work/first.txt"
"$install_sh" "$prefix" > /dev/null
listing > "$work/second.txt"
diff "$work/first.txt" "$work/second.txt" || fail "a second install changed the prefix"

# --- CMake + clang++ -----------------------------------------------------------------------
step "build the example with CMake and clang++ against the installed SDK"
src="$work/src"
mkdir -p "$src"
cp -L "$example/CMakeLists.txt" "$example/manifest.json" "$example/hello_plugin.cc" "$src/"
chmod -R u+w "$src"
build="$work/build"
cmake -S "$src" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "cmake configure failed"; }
cmake --build "$build" -- -j 4 > "$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fail "cmake build failed"; }
if grep -i "warning" "$work/build.log"; then
  fail "the example builds with warnings (above)"
fi

so="$build/hello/libloom_hello.so"
sidecar="$build/hello/plugin.json"
[[ -f "$so" ]] || fail "$so was not built"
[[ -f "$sidecar" ]] || fail "$sidecar was not written"
cmp "$sidecar" "$src/manifest.json" || fail "plugin.json differs from manifest.json"

# exports_only_entry SO: the dynamic symbol table defines exactly loom_plugin_v1.
exports_only_entry() {
  local exported
  exported="$(nm -D --defined-only "$1" | awk '{print $NF}' | sort)"
  [[ "$exported" == "loom_plugin_v1" ]] ||
    fail "$1 must export exactly loom_plugin_v1, it exports: $(echo $exported)"
}
step "the library exports only loom_plugin_v1"
exports_only_entry "$so"
grep -aqF '"name": "hello"' "$so" || fail "the manifest text is not embedded in $so"

# --- Load it -------------------------------------------------------------------------------
step "load the plugin from a host built by g++ and run scale_norm"
cat > "$work/load_check.cc" <<'EOF'
// A minimal host: loads a plugin as the core does and drives the hello plugin's scale_norm.
#include <dlfcn.h>
#include <loom/sdk.h>

#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#define EXPECT(cond, ...)                                                         \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "load_check: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                          \
      std::fprintf(stderr, "\n");                                                 \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

using namespace loom;

std::string text(StringView v) { return v.size ? std::string(v.data, v.size) : std::string(); }

// Takes a status: returns "" on success, else its message (released).
std::string message_of(Status s) {
  if (s.code == Code::kOk) return "";
  std::string m = std::string(code_name(s.code)) + ": " + (s.message ? s.message : "(none)");
  status_release(&s);
  return m;
}

struct Host final : IHost {
  InterfaceInfo interface_info() const noexcept override { return kinds::kHost; }
  StringView core_version() const noexcept override { return make_string_view("0.1.0"); }
  void log(LogLevel, StringView source, StringView message) noexcept override {
    std::printf("[%s] %s\n", text(source).c_str(), text(message).c_str());
  }
  Status allocate(Device, uint64_t, uint64_t, void**) noexcept override {
    return make_status(Code::kUnimplemented, "no allocator in load_check");
  }
  void deallocate(Device, void*) noexcept override {}
  Status find_kernel(StringView, DeviceType, DType, const OpCall*, KernelDesc*) noexcept override {
    return make_status(Code::kNotFound, "no kernels in load_check");
  }
  Status communicator(StringView, ICommunicator**) noexcept override {
    return make_status(Code::kUnimplemented, "no communicators in load_check");
  }
  uint64_t seed() const noexcept override { return 1234; }
  Status copy(Device, void*, Device, const void*, uint64_t) noexcept override {
    return make_status(Code::kUnimplemented, "no devices in load_check");
  }
  Status fill_zero(Device, void*, uint64_t) noexcept override {
    return make_status(Code::kUnimplemented, "no devices in load_check");
  }
  void* compute_stream(Device) noexcept override { return nullptr; }
  Status synchronize(Device) noexcept override { return ok_status(); }
  Status group(ParallelRole, ICommunicator**) noexcept override {
    return make_status(Code::kUnimplemented, "no communicators in load_check");
  }
};

struct Registry final : IRegistry {
  struct Entry {
    std::string kind, name, description, schema;
    IFactory* factory;
  };
  std::vector<Entry> factories;
  InterfaceInfo interface_info() const noexcept override { return kinds::kRegistry; }
  Status add_factory(const FactoryDesc* d, IFactory* f) noexcept override {
    factories.push_back({d->interface.kind, d->name, d->description, d->options_schema_json, f});
    return ok_status();
  }
  Status add_kernel(const KernelDesc*) noexcept override {
    return make_status(Code::kInvalidArgument, "hello registers no kernels");
  }
  Status add_device_runtime(IDeviceRuntime*) noexcept override {
    return make_status(Code::kInvalidArgument, "hello registers no device runtime");
  }
};

struct BuildContext final : IBuildContext {
  Host* h;
  InterfaceInfo interface_info() const noexcept override { return kinds::kBuildContext; }
  StringView spec_pointer() const noexcept override { return make_string_view("/model/norm"); }
  Status build_child(StringView, InterfaceInfo, IObject**) noexcept override {
    return make_status(Code::kNotFound, "no children in load_check");
  }
  IHost* host() noexcept override { return h; }
  Status build_child_with(StringView, InterfaceInfo, StringView, IObject**) noexcept override {
    return make_status(Code::kNotFound, "no children in load_check");
  }
  StringView inherited() const noexcept override { return make_string_view("{}"); }
  IFp8Recipe* fp8_recipe() noexcept override { return nullptr; }
};

struct ForwardContext final : IForwardContext {
  std::vector<std::unique_ptr<unsigned char[]>> buffers;
  InterfaceInfo interface_info() const noexcept override { return kinds::kForwardContext; }
  bool training() const noexcept override { return true; }
  RecomputePolicy recompute() const noexcept override { return RecomputePolicy::kNone; }
  int32_t micro_batch() const noexcept override { return 0; }
  Status allocate(DType dtype, int32_t ndim, const int64_t* shape, Device device,
                  TensorView* out) noexcept override {
    TensorView v{};
    v.dtype = dtype;
    v.device = device;
    v.ndim = ndim;
    int64_t n = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {
      v.shape[i] = shape[i];
      v.strides[i] = n;
      n *= shape[i];
    }
    buffers.emplace_back(new unsigned char[n * dtype_size(dtype) + 1]);
    v.data = buffers.back().get();
    *out = v;
    return ok_status();
  }
  Status save(const void*, int32_t, const TensorView*) noexcept override { return ok_status(); }
  Status load(const void*, int32_t, TensorView*) noexcept override {
    return make_status(Code::kNotFound, "nothing saved");
  }
  void rng(const void*, uint64_t, uint64_t* key, uint64_t* counter) noexcept override {
    *key = 0;
    *counter = 0;
  }
  IKvCache* kv_cache() noexcept override { return nullptr; }
  void grads_ready(const void*) noexcept override {}
  // Keeps every buffer until the end (as a context may): release only checks the pointer.
  Status release(const TensorView* t) noexcept override {
    for (auto& b : buffers)
      if (b.get() == t->data) return ok_status();
    return make_status(Code::kInvalidArgument, "release: not this context's memory");
  }
  void drop_saved(const void*) noexcept override {}
  bool defer_weight_grads() const noexcept override { return false; }
  Status metric(StringView, const TensorView*, MetricReduce) noexcept override {
    return ok_status();
  }
  double aux_loss_weight() const noexcept override { return 0.0; }
  const TensorView* loss_grad() const noexcept override { return nullptr; }
  int32_t grad_first_write(const TensorView*) noexcept override { return 0; }
  uint64_t param_version() const noexcept override { return 0; }
};

TensorView cpu_f32(float* data, int64_t b, int64_t c) {  // (B, C) contiguous
  TensorView v{};
  v.data = data;
  v.dtype = DType::kF32;
  v.device = Device{DeviceType::kCpu, 0};
  v.ndim = 2;
  v.shape[0] = b;
  v.shape[1] = c;
  v.strides[0] = c;
  v.strides[1] = 1;
  return v;
}

int main(int argc, char** argv) {
  EXPECT(argc == 3, "usage: load_check LIB.so plugin.json");
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream sidecar;
  sidecar << in.rdbuf();

  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  EXPECT(lib != nullptr, "dlopen: %s", dlerror());
  auto entry = reinterpret_cast<PluginEntryFn>(dlsym(lib, LOOM_PLUGIN_ENTRY_V1));
  EXPECT(entry != nullptr, "no %s", LOOM_PLUGIN_ENTRY_V1);
  EXPECT(dlsym(lib, "loom_embedded_manifest") == nullptr, "loom_embedded_manifest is visible");
  const PluginInfo* info = entry();
  EXPECT(info->struct_size == sizeof(PluginInfo), "struct_size %u", info->struct_size);
  EXPECT(info->abi_major == LOOM_ABI_MAJOR && info->abi_minor <= LOOM_ABI_MINOR, "ABI %u.%u",
         info->abi_major, info->abi_minor);
  EXPECT(std::strcmp(info->name, "hello") == 0, "name '%s'", info->name);
  EXPECT(std::strcmp(info->version, "0.1.0") == 0, "version '%s'", info->version);
  EXPECT(sidecar.str() == info->manifest_json, "embedded manifest differs from plugin.json");
  auto build = nlohmann::json::parse(info->build_json);
  EXPECT(build.at("compiler").get<std::string>().rfind("clang", 0) == 0, "build %s",
         info->build_json);
  std::printf("loaded %s %s, ABI %u.%u, built by %s\n", info->name, info->version, info->abi_major,
              info->abi_minor, build.at("compiler").get<std::string>().c_str());

  Host host;
  void* state = nullptr;
  std::string m = message_of(info->init(&host, make_string_view("{}"), &state));
  EXPECT(m.empty(), "init: %s", m.c_str());
  Registry registry;
  m = message_of(info->register_components(state, &registry));
  EXPECT(m.empty(), "register_components: %s", m.c_str());
  EXPECT(registry.factories.size() == 1, "%zu factories", registry.factories.size());
  const Registry::Entry& f = registry.factories[0];
  EXPECT(f.kind == "norm" && f.name == "scale_norm", "factory (%s, %s)", f.kind.c_str(),
         f.name.c_str());
  auto manifest = nlohmann::json::parse(sidecar.str());
  EXPECT(nlohmann::json::parse(f.schema) == manifest["components"][0]["options"], "schema %s",
         f.schema.c_str());

  BuildContext bctx;
  bctx.h = &host;
  // A bad option is a clean status naming the option relative to the node ("/scale: ..."),
  // which the core reports at the node's spec pointer (sdk/README.md, "Errors").
  IObject* object = nullptr;
  m = message_of(
      f.factory->create(make_string_view(R"({"impl":"scale_norm","scale":-1})"), &bctx, &object));
  EXPECT(m.find(": /scale: expected a number > 0") != std::string::npos, "scale -1 gave '%s'",
         m.c_str());

  m = message_of(
      f.factory->create(make_string_view(R"({"impl":"scale_norm","scale":2.5})"), &bctx, &object));
  EXPECT(m.empty(), "create: %s", m.c_str());
  INorm* norm = interface_cast<INorm>(object);
  EXPECT(norm != nullptr, "the object is not a norm");
  EXPECT(norm->param_count() == 0 && norm->child_count() == 0, "has params or children");

  ForwardContext fctx;
  float x_data[6] = {1, -2, 3, 0.5f, 0, -4};  // (2, 3)
  TensorView x = cpu_f32(x_data, 2, 3);
  TensorView y{};
  m = message_of(norm->forward(&fctx, &x, 1, &y, 1));
  EXPECT(m.empty(), "forward: %s", m.c_str());
  EXPECT(y.ndim == 2 && y.shape[0] == 2 && y.shape[1] == 3, "y shape");
  for (int i = 0; i < 6; ++i)
    EXPECT(static_cast<float*>(y.data)[i] == x_data[i] * 2.5f, "y[%d] = %g", i,
           static_cast<float*>(y.data)[i]);
  float dy_data[6] = {1, 1, 1, 2, 2, 2};  // (2, 3)
  TensorView dy = cpu_f32(dy_data, 2, 3);
  TensorView dx{};
  m = message_of(norm->backward(&fctx, &dy, 1, &dx, 1));
  EXPECT(m.empty(), "backward: %s", m.c_str());
  for (int i = 0; i < 6; ++i)
    EXPECT(static_cast<float*>(dx.data)[i] == dy_data[i] * 2.5f, "dx[%d] = %g", i,
           static_cast<float*>(dx.data)[i]);
  // Unsupported dtype: a clean status, not a crash.
  TensorView bad = x;
  bad.dtype = DType::kBF16;
  m = message_of(norm->forward(&fctx, &bad, 1, &y, 1));
  EXPECT(m.rfind("unimplemented", 0) == 0, "bf16 forward gave '%s'", m.c_str());

  object->destroy();
  info->shutdown(state);
  std::printf("load_check: ok\n");
  return 0;
}
EOF
c++ -std=c++20 -Wall -Wextra -Wno-unused-parameter -I"$prefix/include" "$work/load_check.cc" \
  -o "$work/load_check" -ldl > "$work/load_check_build.log" 2>&1 ||
  { cat "$work/load_check_build.log"; fail "building the test host failed"; }
"$work/load_check" "$so" "$sidecar" || fail "the plugin does not load or run as expected"

# --- pkg-config ----------------------------------------------------------------------------
step "the pkg-config flags build an equivalent plugin"
pc=(env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config)
[[ "$("${pc[@]}" --modversion loom-sdk)" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "bad loom-sdk.pc version"
[[ -z "$("${pc[@]}" --libs loom-sdk | tr -d ' ')" ]] || fail "loom-sdk.pc Libs must be empty"
[[ -f "$("${pc[@]}" --variable=pluginlds loom-sdk)" ]] || fail "loom-sdk.pc pluginlds is not a file"
mkdir -p "$work/pc/hello"
{
  echo '// Generated: the manifest'"'"'s exact text.'
  printf '%s' 'extern "C" const char* loom_embedded_manifest() { return R"loom_manifest('
  cat "$src/manifest.json"
  printf '%s\n' ')loom_manifest"; }'
} > "$work/pc/manifest.cc"
# shellcheck disable=SC2046  # word splitting of the flags is intended
clang++ $("${pc[@]}" --cflags loom-sdk) $("${pc[@]}" --variable=plugin_ldflags loom-sdk) \
  "$src/hello_plugin.cc" "$work/pc/manifest.cc" -o "$work/pc/hello/libloom_hello.so" ||
  fail "building with the pkg-config flags failed"
cp "$src/manifest.json" "$work/pc/hello/plugin.json"
exports_only_entry "$work/pc/hello/libloom_hello.so"
"$work/load_check" "$work/pc/hello/libloom_hello.so" "$work/pc/hello/plugin.json" > /dev/null ||
  fail "the pkg-config-built plugin does not load or run as expected"

# --- loom CLI checks: the g++-built loom lists, loads and uses the clang-built plugin ---
# A copy of loom in a folder of its own, so it finds no install plugin directory beside its
# executable: the real one sits in bazel-bin, where it would scan bazel-bin/kernels and
# bazel-bin/plugins, files this test does not depend on and Bazel may still be (re)writing
# while it runs. Every plugin it sees comes from the test's runfiles.
mkdir -p "$work/isolated/bin"
cp "$runfiles/tools/loom" "$work/isolated/bin/loom"
loom="$work/isolated/bin/loom"
good_root="$work/good_root"
mkdir -p "$good_root/testgood" "$good_root/kernels_cpu"
cp "$runfiles/tests/plugins/good/plugin.json" "$runfiles/tests/plugins/good/libloom_testgood.so" \
  "$good_root/testgood/"
cp "$runfiles/kernels/cpu/plugin.json" "$runfiles/kernels/cpu/libloom_kernels_cpu.so" \
  "$good_root/kernels_cpu/"

step "loom plugins list shows hello and its component"
"$loom" plugins list --plugin-path "$build" > "$work/list.out" || fail "plugins list failed"
grep -q "^hello 0.1.0" "$work/list.out" || fail "plugins list: no hello: $(cat "$work/list.out")"
grep -Eq "norm +scale_norm" "$work/list.out" || fail "plugins list: no scale_norm: $(cat "$work/list.out")"

step "loom plugins describe scale_norm prints its options"
"$loom" plugins describe scale_norm --plugin-path "$build" > "$work/describe.out"
grep -Eq "scale +number exclusiveMinimum=0 default 1.0" "$work/describe.out" ||
  fail "describe: $(cat "$work/describe.out")"

step "loom plugins check loads the clang-built plugin into the g++-built loom"
"$loom" plugins check hello --plugin-path "$build" > "$work/check.out" 2>&1 ||
  fail "plugins check failed: $(cat "$work/check.out")"
# The ABI the installed headers describe (loom/version.h), which the plugin was built for.
abi_minor=$(sed -n 's/^#define LOOM_ABI_MINOR \([0-9]*\)$/\1/p' "$prefix/include/loom/version.h")
[[ -n "$abi_minor" ]] || fail "no LOOM_ABI_MINOR in the installed loom/version.h"
grep -Eq "^hello +0.1.0 +ok +ABI 1\.$abi_minor +clang" "$work/check.out" ||
  fail "check (ABI 1.$abi_minor expected): $(cat "$work/check.out")"

step "loom spec validate uses hello's scale_norm inside another plugin's model"
cat > "$work/spec.json" <<'JSON'
{"model": {"impl": "test_model", "vocab_size": 8, "norm": {"impl": "scale_norm", "scale": 2.5}}}
JSON
"$loom" spec validate "$work/spec.json" --load --plugin-path "$build" --plugin-path "$good_root" \
  --write-resolved "$work/resolved.json" > "$work/validate.out" 2>&1 ||
  fail "spec validate failed: $(cat "$work/validate.out")"
grep -Eq "/model/norm +norm +scale_norm +plugin hello" "$work/validate.out" ||
  fail "validate: $(cat "$work/validate.out")"
# hello, testgood and the CPU kernel library: --load also builds the components, with their
# kernels.
grep -q "plugins loaded and verified: 3" "$work/validate.out" || fail "validate: $(cat "$work/validate.out")"
grep -q '"scale": 2.5' "$work/resolved.json" || fail "resolved spec lacks the scale"
grep -q '"hidden_size": 4' "$work/resolved.json" || fail "resolved spec lacks the default hidden_size"

step "a bad option of hello's component is refused with its JSON pointer (exit 3)"
set +e
"$loom" spec validate "$work/spec.json" --set model.norm.scale=0 --plugin-path "$build" \
  --plugin-path "$good_root" > "$work/bad.out" 2>&1
rc=$?
set -e
[[ $rc -eq 3 ]] || fail "expected exit 3, got $rc: $(cat "$work/bad.out")"
grep -q "spec /model/norm/scale: expected number > 0, got 0" "$work/bad.out" ||
  fail "bad option message: $(cat "$work/bad.out")"

echo "PASS"
