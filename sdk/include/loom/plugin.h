// The plugin entry point: the one symbol a plugin exports.
//
//   extern "C" const loom::PluginInfo* loom_plugin_v1(void);
//
// It must be pure (no allocation, no device calls): the core calls it to read the ABI
// version before anything else runs. Then it calls `init` once, `register_components`
// once, and `shutdown` at orderly exit. The library is never unloaded.
//
// Writing one by hand is rare: loom/cpp/plugin.h has LOOM_PLUGIN(...) which fills this
// struct, turns exceptions into statuses and embeds the manifest.
#pragma once

#include <stdint.h>

#include "loom/host.h"
#include "loom/registry.h"
#include "loom/status.h"
#include "loom/version.h"

namespace loom {

/// What `loom_plugin_v1` returns. Static storage; fields are only appended.
struct PluginInfo {
  uint32_t struct_size;  ///< sizeof(PluginInfo) the plugin was built with
  uint32_t abi_major;    ///< LOOM_ABI_MAJOR at build time
  uint32_t abi_minor;    ///< LOOM_ABI_MINOR at build time
  const char* name;      ///< plugin name, e.g. "transformer"; [a-z0-9_.-]+
  const char* version;   ///< the plugin's own semantic version, e.g. "1.2.0"
  /// Build fingerprint, JSON text: {"compiler": "...", "cxx_stdlib": "libstdc++ 12",
  /// "cxx11_abi": 1, "glibcxx_debug": 0, "cuda": "13.0" or null, "sdk": "0.1.0"}.
  const char* build_json;
  /// The manifest, JSON text identical to the sidecar plugin.json: what the plugin
  /// provides (kinds, names, devices, dtypes, option schemas).
  const char* manifest_json;
  /// Called once after the ABI checks.
  /// \param host          the core's services; valid until shutdown returns
  /// \param options_json  the spec's `plugins.options.<name>` object as JSON text ("{}")
  /// \param[out] state    the plugin's state, passed back to the other two functions
  Status (*init)(IHost* host, StringView options_json, void** state);
  /// Called once after init: add factories and kernels.
  Status (*register_components)(void* state, IRegistry* registry);
  /// Called once at orderly exit, never from a static destructor.
  void (*shutdown)(void* state);
};

/// Signature of the entry point.
typedef const PluginInfo* (*PluginEntryFn)();

}  // namespace loom

/// Name of the entry symbol for ABI major 1.
#define LOOM_PLUGIN_ENTRY_V1 "loom_plugin_v1"

/// Marks a symbol as exported from a plugin built with -fvisibility=hidden.
#define LOOM_EXPORT __attribute__((visibility("default")))
