// The comm_nccl plugin: comm_backend "nccl", collectives and point-to-point for CUDA tensors
// over NCCL. Names, description and options are in manifest.json.
//
// The CUDA runtime header comes first so that the build fingerprint (loom/cpp/fingerprint.h)
// names the CUDA version this plugin was built with.
#include <cuda_runtime_api.h>
#include <loom/sdk.h>

#include "plugins/comm_nccl/nccl_backend.h"

namespace {

class CommNccl final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<loom::comm_nccl::NcclBackend>("nccl");
  }
};

}  // namespace

LOOM_PLUGIN(CommNccl)
