// loom SDK version and plugin ABI version.
//
// The ABI major changes only when an existing interface or value struct changes shape;
// the minor grows when something is appended (a method at the end of an interface, a field
// at the end of a struct, a new interface kind). The core loads a plugin when
// plugin.major == core.major and plugin.minor <= core.minor.
#pragma once

/// Plugin ABI major version: must be equal between core and plugin.
#define LOOM_ABI_MAJOR 1
/// Plugin ABI minor version: the core must provide at least the plugin's minor.
#define LOOM_ABI_MINOR 4
/// SDK release (semantic version of the headers; informational).
#define LOOM_SDK_VERSION "0.1.0"

#define LOOM_STRINGIFY_IMPL(x) #x
#define LOOM_STRINGIFY(x) LOOM_STRINGIFY_IMPL(x)
/// "MAJOR.MINOR" of the ABI these headers describe, as a string literal.
#define LOOM_ABI_STRING LOOM_STRINGIFY(LOOM_ABI_MAJOR) "." LOOM_STRINGIFY(LOOM_ABI_MINOR)
