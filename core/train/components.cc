#include "core/train/components.h"

#include "core/component/builder.h"
#include "core/util/errors.h"
#include "loom/kinds.h"

namespace loom::core {

RunComponents build_components(const nlohmann::json& spec, const RunConfig& config,
                               PluginManager& plugins, const nlohmann::json& model_inherited) {
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
                              {"sequence_parallel", config.parallel.sequence_parallel}};
  for (const auto& [k, v] : model_inherited.items()) inherited[k] = v;
  if (spec.contains("model")) {
    c.model_object =
        build_component(plugins, spec["model"], kinds::kModel, "/model", inherited, c.fp8);
    c.model = interface_cast<IModel>(c.model_object.get());
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
