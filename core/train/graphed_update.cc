#include "core/train/graphed_update.h"

#include <fmt/format.h>

#include <exception>
#include <string>

#include "core/train/graphed_pass.h"
#include "core/util/errors.h"
#include "loom/cpp/op_args.h"

namespace loom::core {
namespace {

constexpr const char* kWhere = "/train/cuda_graph 'step'";
constexpr uint64_t kBlockDoubles = ops::kStepScalarCount + 1;  // the scalars, the sum of squares

// grad_norm_clip's kernel, once the optimizer is known to read step scalars.
Kernel clip_kernel(Host& host, Device device, const IOptimizer& optimizer) {
  if (!has_step_scalars(optimizer)) {
    const InterfaceInfo info = optimizer.interface_info();
    throw InvalidArgument(fmt::format(
        "{}: the optimizer is optimizer {}.{}, which reads its step's learning rate and "
        "gradient scale on the host only (1.3 added step scalars): rebuild its plugin against "
        "this SDK, or set /train/cuda_graph to \"forward_backward\"",
        kWhere, info.major, info.minor));
  }
  Kernel k = Kernel::optional(host, ops::kGradNormClip, device, DType::kF64);
  if (!k)
    throw InvalidArgument(fmt::format(
        "{}: no kernel serves \"{}\" on the {} device: rebuild its kernel library against "
        "this SDK, or set /train/cuda_graph to \"forward_backward\"",
        kWhere, ops::kGradNormClip, device_type_name(device.type)));
  return k;
}

}  // namespace

GraphedUpdate::GraphedUpdate(Host& host, Device device, DistributedOptimizer& optim,
                             const IOptimizer& optimizer, double max_norm)
    : host_(host),
      device_(device),
      optim_(optim),
      runtime_(graph_runtime(host, device, "step")),
      clip_(clip_kernel(host, device, optimizer)),
      max_norm_(max_norm) {
  // Outside any capture (the shared pool), for as long as the graph lives.
  throw_if_error(host_.allocate(device_, kBlockDoubles * 8, 256, &block_),
                 fmt::format("{}: the step scalars", kWhere));
}

GraphedUpdate::~GraphedUpdate() {
  runtime_.graph_destroy(device_.index, graph_);
  host_.deallocate(device_, block_);
}

void GraphedUpdate::capture(const OptimizerStep& hp) {
  const TensorView scalars = make_view(block_, DType::kF64, {ops::kStepScalarCount}, device_);
  const TensorView sumsq =
      make_view(static_cast<double*>(block_) + ops::kStepScalarCount, DType::kF64, {1}, device_);
  throw_if_error(runtime_.capture_begin(device_.index),
                 fmt::format("{}: starting the capture of the optimizer's step", kWhere));
  std::exception_ptr failed;
  try {
    optim_.grad_sumsq(sumsq);
    clip_({sumsq}, {scalars}, ops::GradNormClipAttrs{max_norm_});
    OptimizerStep h = hp;
    h.struct_size = sizeof(OptimizerStep);
    h.scalars = scalars;
    optim_.update(h, /*verify_cast=*/false);
  } catch (...) {
    failed = std::current_exception();
  }
  void* graph = nullptr;
  Status ended = runtime_.capture_end(device_.index, &graph);
  if (failed) {
    runtime_.graph_destroy(device_.index, graph);
    status_release(&ended);
    try {
      std::rethrow_exception(failed);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("{}: capturing the optimizer's step failed: {}; or set "
                                        "/train/cuda_graph to \"forward_backward\"",
                                        kWhere, e.what()));
    }
  }
  throw_if_error(ended, fmt::format("{}: capturing the optimizer's step", kWhere));
  graph_ = graph;
  captured_weight_decay_ = hp.weight_decay;
}

GraphedUpdate::Result GraphedUpdate::run(const OptimizerStep& hp, double norm_divisor,
                                         bool loss_finite) {
  if (graph_ != nullptr && hp.weight_decay != captured_weight_decay_)
    throw Error(Code::kFailedPrecondition,
                fmt::format("{}: the weight decay changed from {} to {} after the capture, "
                            "which holds it: keep it constant or set /train/cuda_graph to "
                            "\"forward_backward\"",
                            kWhere, captured_weight_decay_, hp.weight_decay));
  double s[ops::kStepScalarCount] = {};
  s[ops::kStepLr] = hp.lr;
  s[ops::kStepIndex] = static_cast<double>(hp.step);
  s[ops::kStepGradScale] = hp.grad_scale;
  s[ops::kStepSkip] = loss_finite ? 0.0 : 1.0;
  s[ops::kStepNormDivisor] = norm_divisor;
  throw_if_error(host_.copy(device_, block_, kCpu, s, sizeof(s)),
                 fmt::format("{}: copying the step scalars in", kWhere));
  if (graph_ == nullptr) capture(hp);
  throw_if_error(runtime_.graph_replay(device_.index, graph_),
                 fmt::format("{}: replaying the optimizer's step", kWhere));
  ++replays_;
  throw_if_error(host_.copy(kCpu, s, device_, block_, sizeof(s)),
                 fmt::format("{}: reading the gradient norm back", kWhere));
  return Result{s[ops::kStepGradNorm], s[ops::kStepSkip] != 0.0};
}

}  // namespace loom::core
