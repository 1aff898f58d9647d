// The "transformer" plugin: decoder-only GPT-2 and LLaMA-style models as modules with an
// explicit forward and backward, computing only through the ops of loom/ops.h.
#include <loom/sdk.h>

#include "plugins/transformer/dot_product_attention.h"
#include "plugins/transformer/gpt_model.h"
#include "plugins/transformer/norm.h"
#include "plugins/transformer/mlp.h"
#include "plugins/transformer/transformer_layer.h"

namespace loom::transformer {
namespace {

class TransformerPlugin final : public Plugin {
 public:
  void register_components(Registrar& r) override {
    r.factory<GptModel>("gpt");
    r.factory<TransformerLayer>("transformer_layer");
    r.factory<LayerNorm>("layernorm");
    r.factory<RmsNorm>("rmsnorm");
    r.factory<DotProductAttention>("dot_product");
    r.factory<Mlp>("mlp");
  }
};

}  // namespace
}  // namespace loom::transformer

LOOM_PLUGIN(loom::transformer::TransformerPlugin)
