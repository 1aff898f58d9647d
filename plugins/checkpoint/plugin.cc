// The checkpoint plugin: the checkpoint formats "sharded" (loom's training checkpoints) and
// "safetensors" (Hugging Face GPT-2 / LLaMA / Mixtral / Qwen2-MoE export and import). Names,
// descriptions and option schemas are in manifest.json.
#include <loom/sdk.h>

#include "plugins/checkpoint/safetensors_format.h"
#include "plugins/checkpoint/sharded_format.h"

namespace {

class CheckpointPlugin final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<loom::checkpoint::ShardedFormat>("sharded");
    r.factory<loom::checkpoint::SafetensorsFormat>("safetensors");
  }
};

}  // namespace

LOOM_PLUGIN(CheckpointPlugin)
