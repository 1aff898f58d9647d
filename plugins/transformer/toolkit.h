// The SDK's module toolkit (loom/cpp/nn.h), used unqualified inside the transformer plugin.
#pragma once

#include <loom/cpp/nn.h>

namespace loom::transformer {

using namespace loom::nn;  // NOLINT(build/namespaces): the plugin is written on the toolkit

}  // namespace loom::transformer
