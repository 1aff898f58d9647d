// The version of this loom build.
#pragma once

#include "loom/version.h"

namespace loom::core {

/// Version of the loom core and command ("0.1.0"); the SDK it provides has the same.
inline constexpr const char* kLoomVersion = LOOM_SDK_VERSION;

}  // namespace loom::core
