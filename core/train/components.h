// The components a training run builds from its spec, in the order it needs them: the FP8
// recipe (handed to every module built after it), the model with the run's shape handed
// down (Megatron's config), the optimizer with the device and parameter dtype, the LR
// schedule with the optimizer's peak rate and the run's length, and a pipeline schedule
// when the spec names one. `loom spec validate --load` builds them too, so each plugin's own
// option checks run without training.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "core/plugin/plugin_manager.h"
#include "core/train/run_config.h"
#include "loom/cpp/object.h"
#include "loom/kinds/fp8_recipe.h"
#include "loom/kinds/model.h"
#include "loom/kinds/optimizer.h"
#include "loom/kinds/pipeline_schedule.h"

namespace loom::core {

struct RunComponents {
  // The FP8 recipe first: the model's modules hold it, so it is destroyed after them.
  ObjectPtr fp8_object;
  IFp8Recipe* fp8 = nullptr;  ///< null without /precision/fp8
  /// The model: one object per virtual pipeline chunk this rank runs (one without
  /// interleaving; each built as its pipeline stage when parallel.pp > 1).
  std::vector<ObjectPtr> model_objects;
  std::vector<IModel*> chunks;
  IModel* model = nullptr;  ///< chunks[0], or null without /model
  /// With FP8 (fp8_recipe 1.2): the quantisers each chunk's modules registered, in chunk
  /// order (their ids follow one another: chunk 0's first); empty for an older recipe.
  std::vector<int32_t> fp8_chunk_quantizers;
  ObjectPtr optimizer_object;
  IOptimizer* optimizer = nullptr;  ///< null without /optimizer
  ObjectPtr schedule_object;
  ILrSchedule* schedule = nullptr;  ///< null without /lr_schedule
  ObjectPtr pipeline_object;
  IPipelineSchedule* pipeline = nullptr;  ///< null without /parallel/pipeline_schedule
  double base_lr = 0;       ///< the optimizer's rate (IOptimizer::hyper), the schedule's peak
  double weight_decay = 0;  ///< the optimizer's decoupled weight decay
};

/// Builds every component node the spec has (see above). The kernel libraries must be
/// loaded (modules resolve their kernels while built). Throws what a factory throws, at the
/// node's spec pointer.
/// \param model_inherited  extra options for the model (return_logits, the data's
///                         tokenizer_vocab_size); they win over the run's own
/// \param pp_rank          this rank's pipeline stage: with parallel.pp > 1 the model is
///                         built once per virtual chunk with the inherited option
///                         "pipeline" {"rank", "size", "chunk", "chunks"} (kinds/model.h)
RunComponents build_components(const nlohmann::json& spec, const RunConfig& config,
                               PluginManager& plugins,
                               const nlohmann::json& model_inherited = nlohmann::json::object(),
                               int pp_rank = 0);

}  // namespace loom::core
