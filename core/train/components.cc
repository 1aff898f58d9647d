#include "core/train/components.h"

#include <fmt/format.h>

#include "core/component/builder.h"
#include "core/util/errors.h"
#include "loom/kinds.h"

namespace loom::core {

RunComponents build_components(const nlohmann::json& spec, const RunConfig& config,
                               PluginManager& plugins, const nlohmann::json& model_inherited,
                               int pp_rank) {
  const TrainConfig& train = config.train;
  const std::string params_dtype = dtype_name(config.precision.params);
  RunComponents c;
  if (!config.precision.fp8.is_null()) {
    c.fp8_object = build_component(plugins, config.precision.fp8, kinds::kFp8Recipe,
                                   "/precision/fp8", {{"device", train.device_name}});
    c.fp8 = interface_cast<IFp8Recipe>(c.fp8_object.get());
  }
  nlohmann::json inherited = {{"seq_length", train.seq_length},
                              {"micro_batch_size", train.micro_batch_size},
                              {"params_dtype", params_dtype},
                              {"device", train.device_name},
                              {"sequence_parallel", config.parallel.sequence_parallel},
                              {"cp_comm_type", config.parallel.cp_comm_type}};
  for (const auto& [k, v] : model_inherited.items()) inherited[k] = v;
  if (spec.contains("model")) {
    const ParallelConfig& par = config.parallel;
    const int chunks = par.pp > 1 ? par.vpp : 1;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      nlohmann::json stage = inherited;
      if (par.pp > 1) {
        nlohmann::json where = par.pipeline_split;
        where.update({{"rank", pp_rank}, {"size", par.pp}, {"chunk", chunk}, {"chunks", chunks}});
        stage["pipeline"] = where;
      }
      const bool count = c.fp8 != nullptr && c.fp8->interface_info().minor >= 2;
      const int32_t before = count ? c.fp8->quantizer_count() : 0;
      c.model_objects.push_back(
          build_component(plugins, spec["model"], kinds::kModel, "/model", stage, c.fp8));
      if (count) c.fp8_chunk_quantizers.push_back(c.fp8->quantizer_count() - before);
      c.chunks.push_back(interface_cast<IModel>(c.model_objects.back().get()));
      if (par.pp > 1 && c.chunks.back()->interface_info().minor < 1)
        throw SpecError("/model", fmt::format("'{}' was built against SDK 1.4 or older and "
                                              "cannot be a pipeline stage (model 1.1 has "
                                              "IModel::info); set parallel.pp 1",
                                              spec["model"].value("impl", "?")));
    }
    c.model = c.chunks.front();
  }

  bool lr_known = false;
  if (spec.contains("optimizer")) {
    c.optimizer_object =
        build_component(plugins, spec["optimizer"], kinds::kOptimizer, "/optimizer",
                        {{"device", train.device_name}, {"params_dtype", params_dtype}});
    c.optimizer = interface_cast<IOptimizer>(c.optimizer_object.get());
    if (has_hyper(*c.optimizer)) {
      OptimizerHyper hyper{};
      hyper.struct_size = sizeof(OptimizerHyper);
      throw_if_error(c.optimizer->hyper(&hyper), "the optimizer's learning rate (hyper)");
      c.base_lr = hyper.lr;
      c.weight_decay = hyper.weight_decay;
      lr_known = true;
    } else {  // an optimizer built against SDK 1.4: its options by name (kinds/optimizer.h)
      c.weight_decay = spec["optimizer"].value("weight_decay", 0.0);
      c.base_lr = spec["optimizer"].value("lr", 0.0);
      lr_known = spec["optimizer"].contains("lr");
    }
  }
  if (spec.contains("lr_schedule")) {
    nlohmann::json sched_inherited = {{"train_steps", train.steps}};
    if (lr_known) sched_inherited["lr"] = c.base_lr;
    c.schedule_object = build_component(plugins, spec["lr_schedule"], kinds::kLrSchedule,
                                        "/lr_schedule", sched_inherited);
    c.schedule = interface_cast<ILrSchedule>(c.schedule_object.get());
  }
  if (!config.parallel.pipeline_schedule.is_null()) {
    c.pipeline_object = build_component(plugins, config.parallel.pipeline_schedule,
                                        kinds::kPipelineSchedule, "/parallel/pipeline_schedule");
    c.pipeline = interface_cast<IPipelineSchedule>(c.pipeline_object.get());
  }
  return c;
}

}  // namespace loom::core
