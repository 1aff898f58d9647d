// The SDK's module toolkit (loom/cpp/nn.h), used unqualified inside the mamba plugin.
#pragma once

#include <loom/cpp/nn.h>

namespace loom::mamba {

using namespace loom::nn;  // NOLINT(build/namespaces): the plugin is written on the toolkit

}  // namespace loom::mamba
