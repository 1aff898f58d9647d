// The comm_gloo plugin: comm_backend "gloo", collectives and point-to-point for CPU
// tensors over Gloo's TCP transport. Names, description and options are in manifest.json.
#include <loom/sdk.h>

#include "plugins/comm_gloo/gloo_backend.h"

namespace {

class CommGloo final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<loom::comm_gloo::GlooBackend>("gloo");
  }
};

}  // namespace

LOOM_PLUGIN(CommGloo)
