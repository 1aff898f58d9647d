// loom SDK version and plugin ABI version.
//
// The versioning rule (the SDK README has the history):
// - Every interface kind has its own (major, minor) in loom/kinds.h. Appending a method to
//   an interface, or a field to a struct it takes, bumps that kind's minor; appending to a
//   base interface (IModule) bumps the minor of every kind built on it.
// - LOOM_ABI_MINOR bumps whenever any public interface or struct grows (any kind's minor
//   above, a new kind, a field appended to a value struct such as PluginInfo).
// - LOOM_ABI_MAJOR changes only when an existing interface or value struct changes shape
//   (a method moved, removed or retyped): never within a major.
// - The core loads a plugin when plugin.major == core.major and plugin.minor <= core.minor,
//   so plugins built against older minors keep loading. Across the boundary each side
//   checks the other's interface_info() before calling a method newer than what the other
//   was built with: the core calls a module kind's 1.1 method only on an object that says
//   1.1, and a plugin checks the host's or a context's minor before calling theirs.
// - Value structs start with struct_size, so a reader knows which fields the writer had.
#pragma once

/// Plugin ABI major version: must be equal between core and plugin.
#define LOOM_ABI_MAJOR 1
/// Plugin ABI minor version: the core must provide at least the plugin's minor.
#define LOOM_ABI_MINOR 18
/// SDK release (semantic version of the headers; informational).
#define LOOM_SDK_VERSION "0.1.0"

#define LOOM_STRINGIFY_IMPL(x) #x
#define LOOM_STRINGIFY(x) LOOM_STRINGIFY_IMPL(x)
/// "MAJOR.MINOR" of the ABI these headers describe, as a string literal.
#define LOOM_ABI_STRING LOOM_STRINGIFY(LOOM_ABI_MAJOR) "." LOOM_STRINGIFY(LOOM_ABI_MINOR)
