// The fp8 plugin: FP8 recipes with per-tensor scales (scaling_recipe.h). Names, descriptions
// and option schemas are in manifest.json.
#include <loom/sdk.h>

#include "plugins/fp8/delayed_scaling.h"
#include "plugins/fp8/tensorwise_scaling.h"

namespace {

class Fp8 final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<loom::fp8::DelayedScaling>("delayed");
    r.factory<loom::fp8::TensorwiseScaling>("tensorwise");
  }
};

}  // namespace

LOOM_PLUGIN(Fp8)
