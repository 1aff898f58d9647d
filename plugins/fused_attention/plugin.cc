// The "fused_attention" plugin: the attention core as the fused attention_fwd /
// attention_bwd ops (TransformerEngine / FlashAttention style).
#include <loom/sdk.h>

#include "plugins/fused_attention/fused_attention.h"

namespace loom::fused_attention {
namespace {

class FusedAttentionPlugin final : public Plugin {
 public:
  void register_components(Registrar& r) override { r.factory<FusedAttention>("fused"); }
};

}  // namespace
}  // namespace loom::fused_attention

LOOM_PLUGIN(loom::fused_attention::FusedAttentionPlugin)
