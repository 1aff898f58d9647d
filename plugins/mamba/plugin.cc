// The "mamba" plugin: the Mamba-2 mixer and the Mamba layer of hybrid models (Megatron-Core's
// MambaMixer and MambaLayer; the gpt model's hybrid_layer_pattern places them), computing only
// through the ops of loom/ops.h (causal_conv1d, ssd_scan, rmsnorm_gated, gemm).
#include <loom/sdk.h>

#include "plugins/mamba/mamba_layer.h"
#include "plugins/mamba/mamba_mixer.h"

namespace loom::mamba {
namespace {

class MambaPlugin final : public Plugin {
 public:
  void register_components(Registrar& r) override {
    r.factory<MambaLayer>("mamba_layer");
    r.factory<MambaMixer>("mamba2");
  }
};

}  // namespace
}  // namespace loom::mamba

LOOM_PLUGIN(loom::mamba::MambaPlugin)
