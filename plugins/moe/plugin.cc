// The "moe" plugin: mixture-of-experts layers as Megatron-Core builds them (MoELayer,
// TopKRouter, the allgather and alltoall token dispatchers, grouped experts, shared
// experts), computing only through the ops of loom/ops.h.
#include <loom/sdk.h>

#include "plugins/moe/allgather_dispatcher.h"
#include "plugins/moe/alltoall_dispatcher.h"
#include "plugins/moe/moe_layer.h"
#include "plugins/moe/topk_router.h"

namespace loom::moe {
namespace {

class MoePlugin final : public Plugin {
 public:
  void register_components(Registrar& r) override {
    r.factory<MoeLayer>("moe");
    r.factory<TopkRouter>("topk");
    r.factory<AllGatherDispatcher>("allgather");
    r.factory<AllToAllDispatcher>("alltoall");
  }
};

}  // namespace
}  // namespace loom::moe

LOOM_PLUGIN(loom::moe::MoePlugin)
