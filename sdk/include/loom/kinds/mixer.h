// kinds::kMixer: a sequence mixer other than attention (Mamba-2 / SSD, gated delta net).
//   forward inputs:  [0] hidden (B, T, C)
//   forward outputs: [0] hidden (B, T, C)
// Decoding state (convolution and SSM state per sequence) is reached through methods that
// will be appended for inference; training uses IModule alone.
#pragma once

#include "loom/kinds/module.h"

namespace loom {

class IMixer : public IModule {
 protected:
  ~IMixer() = default;
};

}  // namespace loom
