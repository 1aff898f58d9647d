#!/usr/bin/env bash
# Installs the loom SDK into PREFIX, for building plugins outside the loom repository:
#
#   bazel run //sdk:install -- PREFIX     (a relative PREFIX is taken from your cwd)
#   sdk/install.sh PREFIX                 (directly, from the source tree or runfiles)
#
# Lays out
#   PREFIX/include/loom/...                        the SDK headers
#   PREFIX/lib/pkgconfig/loom-sdk.pc               pkg-config: Cflags, and the variables
#                                                  plugin_cxxflags, plugin_ldflags, pluginlds
#   PREFIX/lib/cmake/LoomSDK/LoomSDKConfig.cmake   find_package(LoomSDK): Loom::sdk and
#   PREFIX/lib/cmake/LoomSDK/LoomSDKConfigVersion.cmake    loom_add_plugin(...)
#   PREFIX/share/loom/plugin.lds                   the version script of every plugin
#   PREFIX/share/loom/bazel/                       a Bazel workspace named loom_sdk:
#       local_repository(name = "loom_sdk", path = "PREFIX/share/loom/bazel")
#       load("@loom_sdk//sdk:defs.bzl", "loom_plugin")
#
# Idempotent: what it owns (the paths above) is replaced, nothing else under PREFIX is
# touched. Needs nothing but coreutils.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bazel run //sdk:install -- PREFIX
       sdk/install.sh PREFIX

Installs the loom SDK (headers, pkg-config and CMake files, the plugin version script and
a Bazel workspace) into PREFIX, e.g. /usr/local or $HOME/.local/loom-sdk. A relative PREFIX
is resolved against the directory you ran the command from.
EOF
}

if [[ $# -eq 1 && ( "$1" == "-h" || "$1" == "--help" ) ]]; then
  usage
  exit 0
fi
if [[ $# -ne 1 ]]; then
  echo "install.sh: expected exactly one argument, the install PREFIX (got $#)" >&2
  usage >&2
  exit 2
fi
if [[ -z "$1" ]]; then
  echo "install.sh: the install PREFIX is empty" >&2
  usage >&2
  exit 2
fi

# --- Where the SDK's files are -------------------------------------------------------------
# Beside this script (the source tree, or the runfiles tree when a test calls it), else in
# the runfiles of the sh_binary (`bazel run` starts bazel-bin/sdk/install).
find_sdk_dir() {
  local here candidates=()
  here="$(dirname "$0")"
  candidates+=("$here")
  candidates+=("$0.runfiles/loom/sdk")
  [[ -n "${RUNFILES_DIR:-}" ]] && candidates+=("$RUNFILES_DIR/loom/sdk")
  [[ -n "${TEST_SRCDIR:-}" ]] && candidates+=("$TEST_SRCDIR/loom/sdk")
  candidates+=("$PWD/sdk")
  local dir
  for dir in "${candidates[@]}"; do
    if [[ -f "$dir/include/loom/sdk.h" && -f "$dir/plugin.lds" && -f "$dir/defs.bzl" &&
          -f "$dir/cmake/LoomSDKConfig.cmake" ]]; then
      (cd "$dir" && pwd)
      return 0
    fi
  done
  echo "install.sh: cannot find the SDK's files (include/loom/sdk.h, plugin.lds, defs.bzl," \
       "cmake/) beside $0 or in its runfiles; run it as \`bazel run //sdk:install -- PREFIX\`" >&2
  return 1
}
sdk="$(find_sdk_dir)"

# --- PREFIX ----------------------------------------------------------------------------------
prefix="$1"
if [[ "$prefix" != /* ]]; then
  # Under `bazel run` the cwd is the runfiles tree; the user meant their own cwd.
  prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix"
fi
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"

version="$(sed -n 's/^#define LOOM_SDK_VERSION "\(.*\)"$/\1/p' "$sdk/include/loom/version.h")"
if [[ -z "$version" ]]; then
  echo "install.sh: no LOOM_SDK_VERSION in $sdk/include/loom/version.h" >&2
  exit 1
fi

# install_file SRC DST: copies SRC's content (following runfiles symlinks) with mode 0644.
install_file() {
  install -D -m 0644 "$1" "$2"
}

# install_headers DESTDIR: the header tree include/loom/** into DESTDIR/loom.
install_headers() {
  local dest="$1" header
  rm -rf "$dest/loom"
  while IFS= read -r -d '' header; do
    install_file "$sdk/include/$header" "$dest/$header"
  done < <(cd "$sdk/include" && find -L loom -type f -name '*.h' -print0 | sort -z)
}

# --- Headers, version script -------------------------------------------------------------------
install_headers "$prefix/include"
install_file "$sdk/plugin.lds" "$prefix/share/loom/plugin.lds"

# --- pkg-config ----------------------------------------------------------------------------------
mkdir -p "$prefix/lib/pkgconfig"
cat > "$prefix/lib/pkgconfig/loom-sdk.pc" <<EOF
# The loom SDK (installed by loom's sdk/install.sh). Plugins link no loom library, so Libs
# is empty. Build a plugin in one step with
#   c++ \$(pkg-config --cflags loom-sdk) \$(pkg-config --variable=plugin_ldflags loom-sdk) \\
#       plugin.cc manifest.cc -o NAME/libloom_NAME.so
# where manifest.cc holds the manifest's exact text (what loom_plugin and loom_add_plugin
# generate; the manifest must not contain the closing delimiter):
#   extern "C" const char* loom_embedded_manifest() { return R"loom_manifest(<manifest.json>)loom_manifest"; }
prefix=$prefix
includedir=\${prefix}/include
datadir=\${prefix}/share/loom
pluginlds=\${datadir}/plugin.lds
plugin_cxxflags=-fPIC -fvisibility=hidden -fvisibility-inlines-hidden
plugin_ldflags=\${plugin_cxxflags} -shared -Wl,--version-script=\${pluginlds} -Wl,--exclude-libs,ALL -Wl,-z,defs

Name: loom-sdk
Description: loom plugin SDK: headers and build flags for loom plugins (nlohmann/json from the system include path)
Version: $version
Cflags: -I\${includedir} -std=c++20
Libs:
EOF
chmod 0644 "$prefix/lib/pkgconfig/loom-sdk.pc"

# --- CMake -----------------------------------------------------------------------------------
cmake_dir="$prefix/lib/cmake/LoomSDK"
rm -rf "$cmake_dir"
install_file "$sdk/cmake/LoomSDKConfig.cmake" "$cmake_dir/LoomSDKConfig.cmake"
sed "s/@LOOM_SDK_VERSION@/$version/g" "$sdk/cmake/LoomSDKConfigVersion.cmake.in" \
  > "$cmake_dir/LoomSDKConfigVersion.cmake"
chmod 0644 "$cmake_dir/LoomSDKConfigVersion.cmake"

# --- Bazel workspace -------------------------------------------------------------------------
bazel_dir="$prefix/share/loom/bazel"
rm -rf "$bazel_dir"
mkdir -p "$bazel_dir/sdk"
cat > "$bazel_dir/WORKSPACE" <<'EOF'
# The loom SDK as a Bazel workspace (installed by loom's sdk/install.sh). Use it from your
# own WORKSPACE with
#   local_repository(name = "loom_sdk", path = "<PREFIX>/share/loom/bazel")
# and in a BUILD file
#   load("@loom_sdk//sdk:defs.bzl", "loom_plugin")
#   loom_plugin(name = "hello", srcs = ["hello_plugin.cc"])
workspace(name = "loom_sdk")
EOF
cat > "$bazel_dir/BUILD" <<'EOF'
# The loom SDK workspace; everything is in the sdk/ package.
EOF
cat > "$bazel_dir/sdk/BUILD" <<'EOF'
# The loom SDK (installed by loom's sdk/install.sh): headers, the loom_plugin macro
# (defs.bzl) and the plugin version script (plugin.lds).
#
# nlohmann/json comes from the system include path (Debian: nlohmann-json3-dev), so this
# workspace needs no other repository.

exports_files([
    "defs.bzl",
    "plugin.lds",
])

cc_library(
    name = "sdk",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
    visibility = ["//visibility:public"],
)
EOF
install_file "$sdk/defs.bzl" "$bazel_dir/sdk/defs.bzl"
install_file "$sdk/plugin.lds" "$bazel_dir/sdk/plugin.lds"
install_headers "$bazel_dir/sdk/include"
chmod 0644 "$bazel_dir/WORKSPACE" "$bazel_dir/BUILD" "$bazel_dir/sdk/BUILD"

echo "Installed the loom SDK $version into $prefix:"
echo "  headers     $prefix/include/loom"
echo "  pkg-config  $prefix/lib/pkgconfig/loom-sdk.pc"
echo "  CMake       $cmake_dir (find_package(LoomSDK); loom_add_plugin)"
echo "  Bazel       $bazel_dir (local_repository(name = \"loom_sdk\", path = \"$bazel_dir\"))"
