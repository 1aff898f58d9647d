#include "core/train/graphed_pass.h"

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "core/runtime/parameters.h"
#include "core/util/errors.h"
#include "loom/cpp/op_args.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds.h"

namespace loom::core {
namespace {

enum Buffer { kTokens, kLabels, kLossMask, kPositions, kSegments, kLossGrad, kLoss };

constexpr const char* kWhere = "/train/cuda_graph";

}  // namespace

IDeviceRuntime& graph_runtime(Host& host, Device device, const char* mode) {
  if (device.type == DeviceType::kCpu)
    throw InvalidArgument(
        fmt::format("{} '{}' needs a device whose runtime captures graphs, not the CPU: set "
                    "/train/device to \"cuda\", or /train/cuda_graph to \"none\"",
                    kWhere, mode));
  IDeviceRuntime& rt = host.runtime(device);
  const InterfaceInfo info = rt.interface_info();
  if (info.minor < 1)
    throw InvalidArgument(
        fmt::format("{} '{}': the {} device runtime is device_runtime {}.{}, which has no "
                    "graphs (1.1 added them): rebuild its kernel library against this SDK, or set "
                    "/train/cuda_graph to \"none\"",
                    kWhere, mode, device_type_name(device.type), info.major, info.minor));
  return rt;
}

GraphedPass::GraphedPass(Host& host, Device device, IModel& model, const char* mode)
    : host_(host), device_(device), model_(model), runtime_(graph_runtime(host, device, mode)) {}

GraphedPass::~GraphedPass() {
  runtime_.graph_destroy(device_.index, graph_);
  host_.deallocate(device_, block_);
}

TensorView GraphedPass::buffer(int which, DType dtype, std::vector<int64_t> shape) const {
  return make_view(buffers_[which], dtype, shape.data(), static_cast<int32_t>(shape.size()),
                   device_);
}

void GraphedPass::allocate_buffers(const Shape& shape) {
  // One block, outside any capture (the shared pool), for as long as the graph lives: the
  // inputs one after the other, so that one copy brings a micro-batch in; the loss last.
  const uint64_t cells = static_cast<uint64_t>(shape.batch * shape.seq_length);
  const uint64_t bytes[kBuffers] = {cells * 4,
                                    cells * 4,
                                    cells * 4,
                                    shape.positions ? cells * 4 : 0,
                                    shape.segments ? cells * 4 : 0,
                                    4,
                                    4};
  uint64_t offsets[kBuffers] = {}, total = 0;
  for (int i = 0; i < kBuffers; ++i) {
    offsets[i] = total;
    total += (bytes[i] + 255) / 256 * 256;
  }
  throw_if_error(host_.allocate(device_, total, 256, &block_),
                 fmt::format("{}: the graph's static inputs", kWhere));
  for (int i = 0; i < kBuffers; ++i)
    buffers_[i] = bytes[i] > 0 ? static_cast<char*>(block_) + offsets[i] : nullptr;
  staging_.assign(offsets[kLoss], 0);  // everything the host writes: all but the loss
  shape_ = shape;
}

void GraphedPass::load(const Batch& batch, double loss_weight) {
  const Shape shape{batch.batch, batch.seq_length, !batch.position_ids.empty(),
                    !batch.segment_ids.empty()};
  if (block_ == nullptr) allocate_buffers(shape);
  if (!(shape == shape_))
    throw InvalidArgument(fmt::format(
        "{}: a micro-batch of {} x {} tokens (positions {}, segments {}) where the captured "
        "graph takes {} x {} (positions {}, segments {}): a graph replays fixed shapes; keep "
        "the micro-batch shape fixed or set /train/cuda_graph to \"none\"",
        kWhere, shape.batch, shape.seq_length, shape.positions, shape.segments, shape_.batch,
        shape_.seq_length, shape_.positions, shape_.segments));
  const uint64_t bytes = static_cast<uint64_t>(shape.batch * shape.seq_length) * 4;
  auto put = [&](Buffer which, const void* data, uint64_t n) {
    const auto offset = static_cast<char*>(buffers_[which]) - static_cast<char*>(block_);
    std::memcpy(staging_.data() + offset, data, n);
  };
  put(kTokens, batch.tokens.data(), bytes);
  put(kLabels, batch.labels.data(), bytes);
  put(kLossMask, batch.loss_mask.data(), bytes);
  if (shape.positions) put(kPositions, batch.position_ids.data(), bytes);
  if (shape.segments) put(kSegments, batch.segment_ids.data(), bytes);
  const float dloss = static_cast<float>(loss_weight);
  put(kLossGrad, &dloss, 4);
  throw_if_error(host_.copy(device_, block_, kCpu, staging_.data(), staging_.size()),
                 fmt::format("{}: copying the micro-batch in", kWhere));
}

void GraphedPass::pass(ForwardContext& ctx) {
  // As ScheduleExecutor::forward and ::backward for one whole-model stage, on the static
  // buffers (the model sees the same views a direct step builds from the batch).
  const int64_t b = shape_.batch, t = shape_.seq_length;
  TensorView in[5] = {buffer(kTokens, DType::kI32, {b, t}), buffer(kLabels, DType::kI32, {b, t}),
                      buffer(kLossMask, DType::kF32, {b, t}),
                      shape_.positions ? buffer(kPositions, DType::kI32, {b, t}) : empty_view(),
                      shape_.segments ? buffer(kSegments, DType::kI32, {b, t}) : empty_view()};
  const int32_t n_out = model_.interface_info().minor >= 1 ? 5 : 1;
  TensorView outputs[5] = {};
  const TensorView loss_grad = buffer(kLossGrad, DType::kF32, {});
  ctx.set_loss_grad(loss_grad);  // loaded before each replay, read by the backward below
  throw_if_error(model_.forward(&ctx, in, 5, outputs, n_out), "model forward");
  if (outputs[0].data == nullptr || outputs[0].dtype != DType::kF32)
    throw Error(Code::kInternal, "model forward gave no f32 loss");
  throw_if_error(host_.copy(device_, buffers_[kLoss], device_, outputs[0].data, 4),
                 "copying the loss out");
  TensorView grad_outputs[3] = {loss_grad, {}, {}};
  TensorView grad_inputs[6] = {};
  throw_if_error(model_.backward(&ctx, grad_outputs, 1, grad_inputs, 0), "model backward");
}

void GraphedPass::capture(int32_t rng_index, const StepPlanContext& step) {
  // The direct steps' activations sit in the shared pool's cache; the graph's pool cannot
  // flush that cache while it captures, so hand it back to the driver first (the graph's
  // activations would otherwise need a second copy of that memory).
  throw_if_error(runtime_.empty_cache(device_.index),
                 fmt::format("{}: emptying the cache before the capture", kWhere));
  throw_if_error(runtime_.capture_begin(device_.index),
                 fmt::format("{}: starting the capture", kWhere));
  std::exception_ptr failed;
  std::string refusal;
  {
    ForwardContext ctx(host_, true, step.recompute, rng_index, step.seed, step.step,
                       step.module_ids);
    ctx.set_metric_sink(step.metrics);
    ctx.set_aux_loss_weight(step.loss_weight);
    ctx.set_capturing(true);
    if (overwrites_) ctx.set_grad_claims(step.grad_first_write);
    // param_version stays 0: a replay repeats only the capture's kernels, so what a module
    // derived from the parameters in one micro-batch could not be derived again next step.
    try {
      pass(ctx);
    } catch (...) {
      failed = std::current_exception();
    }
    refusal = ctx.capture_refusal();
    // The context's memory goes back to the graph's pool here, inside the capture.
  }
  void* graph = nullptr;
  Status ended = runtime_.capture_end(device_.index, &graph);
  if (!refusal.empty()) {
    runtime_.graph_destroy(device_.index, graph);
    status_release(&ended);
    throw InvalidArgument(
        fmt::format("{}: the forward and backward cannot be replayed as a graph: {}; or set "
                    "/train/cuda_graph to \"none\"",
                    kWhere, refusal));
  }
  if (failed) {
    runtime_.graph_destroy(device_.index, graph);
    status_release(&ended);
    try {
      std::rethrow_exception(failed);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("{}: capturing the forward and backward failed: {}", kWhere,
                                        e.what()));
    }
  }
  throw_if_error(ended, fmt::format("{}: capturing the forward and backward", kWhere));
  graph_ = graph;
}

StepLosses GraphedPass::run(int32_t micro_batches, const StepPlanContext& step) {
  if (step.grads_ready || step.logits || step.timeline != nullptr)
    throw Error(Code::kInternal,
                "GraphedPass: a step with gradient hooks, logits or a timeline cannot be "
                "replayed");
  StepLosses out;
  for (int32_t m = 0; m < micro_batches; ++m) {
    const MicroBatchInput in = step.input(m);
    if (in.batch == nullptr)
      throw Error(Code::kInternal, fmt::format("graphed pass: no data for micro-batch {}", m));
    load(*in.batch, step.loss_weight);
    if (graph_ == nullptr) {
      // A weight gradient's first write overwrites it (grad_first_write) only in a graph that
      // runs once a step: replayed for every micro-batch, it would overwrite each time.
      overwrites_ = overwrites(micro_batches, step);
      capture(in.rng_index, step);
    } else if (overwrites_ && micro_batches != 1) {
      throw Error(Code::kInternal,
                  fmt::format("{}: the graph was captured for one micro-batch a step, with the "
                              "weight gradients' first writes overwriting them; a step of {} "
                              "micro-batches cannot replay it",
                              kWhere, micro_batches));
    }
    throw_if_error(runtime_.graph_replay(device_.index, graph_),
                   fmt::format("{}: replaying micro-batch {}", kWhere, m));
    ++replays_;
    float mean = 0;
    throw_if_error(host_.copy(kCpu, &mean, device_, buffers_[kLoss], 4),
                   fmt::format("{}: reading micro-batch {}'s loss", kWhere, m));
    out.sum_of_means += mean;
    out.micro_batches += 1;
    if (step.after_backward) step.after_backward(m);
  }
  return out;
}

}  // namespace loom::core
