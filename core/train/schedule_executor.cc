#include "core/train/schedule_executor.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "core/runtime/parameters.h"
#include "core/train/plan_rules.h"
#include "core/util/errors.h"
#include "loom/cpp/comm_work.h"
#include "loom/cpp/nn/context_parallel.h"
#include "loom/cpp/tensor.h"

namespace loom::core {
namespace {

// This rank's part of each sequence: all of it, or with context parallelism (cp ranks) the
// two chunks of T / (2 cp) tokens that the attention's ring expects
// (loom/cpp/nn/context_parallel.h): chunks r and 2cp-1-r, in that order.
struct SequencePart {
  int32_t rank = 0, size = 1;
  bool whole() const { return size == 1; }
};

// One of the batch's (B, T) inputs of 4-byte elements (or, with `positions` and no data, the
// position ids 0..T-1) as the model takes it: the host memory itself for a whole sequence
// on the CPU; else this rank's part, gathered into `ctx` and copied to `device`. An absent
// input stays empty.
TensorView input_view(IHost& host, ForwardContext& ctx, const void* data, DType dtype,
                      const Batch& batch, Device device, SequencePart part,
                      bool positions = false) {
  const int64_t b = batch.batch, t = batch.seq_length;
  if (data == nullptr && !(positions && !part.whole())) return empty_view();
  TensorView v = make_view(const_cast<void*>(data), dtype, {b, t}, kCpu);
  if (!part.whole()) {
    const int64_t c = t / (2 * part.size);
    TensorView local = allocate(ctx, dtype, {b, 2 * c}, kCpu);
    const auto chunks = nn::context_parallel_chunks(part.rank, part.size);
    auto* out = static_cast<int32_t*>(local.data);  // 4-byte elements, copied as bits
    const auto* in = static_cast<const int32_t*>(data);
    for (int64_t s = 0; s < b; ++s)
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t i = 0; i < c; ++i) {
          const int64_t from = chunks[static_cast<size_t>(half)] * c + i;
          out[(s * 2 + half) * c + i] =
              in != nullptr ? in[s * t + from] : static_cast<int32_t>(from);
        }
    v = local;
  }
  if (device.type == DeviceType::kCpu) return v;
  TensorView d = allocate(ctx, dtype, {v.shape[0], v.shape[1]}, device);
  copy_from_host(host, v.data, d);
  return d;
}

double read_scalar(IHost& host, const TensorView& v, const char* what) {
  float x = 0;
  throw_if_error(host.copy(kCpu, &x, v.device, v.data, 4), what);
  return x;
}

// A receive buffer shaped like `like` (data null: a shape) on `device`, from `ctx`.
TensorView allocate_like(ForwardContext& ctx, const TensorView& like, Device device) {
  TensorView out{};
  throw_if_error(ctx.allocate(like.dtype, like.ndim, like.shape, device, &out),
                 "pipeline receive buffer");
  return out;
}

}  // namespace

struct ScheduleExecutor::InFlight {
  std::unique_ptr<ForwardContext> ctx;
  TensorView received{};       // the previous stage's output: this chunk's input
  TensorView output{};         // this chunk's output, for the next stage
  TensorView received_grad{};  // the gradient of `output`, from the next stage
  TensorView input_grad{};     // the gradient of `received`, for the previous stage
  double grad_weight = 0;      // the loss gradient of a last stage
  std::vector<CommWorkPtr> sends;
};

ScheduleExecutor::ScheduleExecutor(IHost& host, Device device, std::vector<IModel*> chunks)
    : host_(host), device_(device), chunks_(std::move(chunks)) {
  if (chunks_.empty()) throw InvalidArgument("schedule executor: no model chunk");
  for (size_t c = 0; c < chunks_.size(); ++c) {
    ModelInfo info{};
    info.struct_size = sizeof(ModelInfo);
    if (chunks_[c]->interface_info().minor >= 1) {
      throw_if_error(chunks_[c]->info(&info), fmt::format("model chunk {}: IModel::info", c));
    } else {  // a model built against SDK 1.4: the whole network
      info.pp_size = info.chunks = 1;
      info.first_stage = info.last_stage = 1;
    }
    if (info.chunks != static_cast<int32_t>(chunks_.size()) ||
        info.chunk != static_cast<int32_t>(c))
      throw InvalidArgument(fmt::format(
          "schedule executor: model chunk {} was built as chunk {} of {}, but this rank runs {} "
          "chunks",
          c, info.chunk, info.chunks, chunks_.size()));
    infos_.push_back(info);
  }
}

int32_t ScheduleExecutor::virtual_stage(int32_t chunk) const {
  const ModelInfo& i = info(chunk);
  return chunk * i.pp_size + i.pp_rank;
}

int32_t ScheduleExecutor::tag(int32_t m, int32_t sender, bool gradient) const {
  const int32_t stages = info(0).pp_size * info(0).chunks;
  return (m * stages + sender) * 2 + (gradient ? 1 : 0);
}

void ScheduleExecutor::check(const std::vector<PipelineAction>& plan, int32_t micro_batches,
                             const std::string& schedule) const {
  std::vector<ChunkPlace> places;
  for (size_t c = 0; c < chunks_.size(); ++c)
    places.push_back({infos_[c].first_stage != 0, infos_[c].last_stage != 0,
                      chunks_[c]->interface_info().minor >= 1});
  check_plan(plan, micro_batches, places, schedule);
}

StepLosses ScheduleExecutor::run(const std::vector<PipelineAction>& plan, int32_t micro_batches,
                                 const StepPlanContext& step, const std::string& schedule) {
  check(plan, micro_batches, schedule);
  const int32_t chunks = static_cast<int32_t>(chunks_.size());
  // The action after which each chunk's gradients are final (its last backward,
  // backward_input or backward_weight: signals of earlier passes could come before a later
  // pass adds to the same gradients), and each micro-batch's last action.
  std::vector<size_t> last_gradient(static_cast<size_t>(chunks), plan.size());
  std::map<std::pair<int32_t, int32_t>, size_t> last_action;
  bool transfers = false;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PipelineAction& a = plan[i];
    if (a.op == PipelineOp::kBackward || a.op == PipelineOp::kBackwardInput ||
        a.op == PipelineOp::kBackwardWeight)
      last_gradient[static_cast<size_t>(a.chunk)] = i;
    last_action[{a.micro_batch, a.chunk}] = i;
    transfers = transfers || is_pipeline_send(a.op) || is_pipeline_receive(a.op);
  }
  if (transfers && (step.pipeline == nullptr || step.pipeline->size() < 2))
    throw InvalidArgument(fmt::format(
        "pipeline schedule '{}': the plan sends between stages, but this run has no pipeline "
        "group of more than one rank (parallel.pp)",
        schedule));

  inputs_.assign(static_cast<size_t>(micro_batches), MicroBatchInput{});
  std::map<std::pair<int32_t, int32_t>, InFlight> flights;
  std::vector<InFlight> draining;  // done but for sends still under way
  StepLosses out;
  const int32_t pp = info(0).pp_size, rank = info(0).pp_rank;
  const int32_t next = (rank + 1) % pp, prev = (rank + pp - 1) % pp;
  // Receives are posted one ahead: when a receive has its data, the plan's next receive is
  // posted, so that its transfer overlaps the passes before its action (the wait stays at
  // the action). Posting opens the micro-batch's context and its buffer.
  std::map<size_t, CommWorkPtr> posted;  // action index -> receive under way
  size_t unposted = 0;                   // receives before this index are posted or done
  auto post = [&](size_t j) {
    const PipelineAction& a = plan[j];
    InFlight& f = flights[{a.micro_batch, a.chunk}];
    if (!f.ctx) open(f, a.micro_batch, step);
    const bool activation = a.op == PipelineOp::kRecvActivation;
    TensorView& buffer = activation ? f.received : f.received_grad;
    buffer = allocate_like(*f.ctx, info(a.chunk).hidden, device_);
    const int32_t sender = virtual_stage(a.chunk) + (activation ? -1 : 1);
    ICommWork* work = nullptr;
    throw_if_error(
        step.pipeline->recv_async(&buffer, activation ? prev : next,
                                  tag(a.micro_batch, sender, !activation), nullptr, &work),
        fmt::format("pipeline schedule '{}': posting action {} ({} of micro-batch {}, "
                    "chunk {})",
                    schedule, j, pipeline_op_name(a.op), a.micro_batch, a.chunk));
    posted[j] = CommWorkPtr(work);
  };
  auto post_from = [&](size_t from) {  // the first receive at or after `from` not posted yet
    for (unposted = std::max(unposted, from); unposted < plan.size(); ++unposted)
      if (is_pipeline_receive(plan[unposted].op)) {
        post(unposted++);
        return;
      }
  };
  try {
    if (transfers) post_from(0);
    for (size_t i = 0; i < plan.size(); ++i) {
      const PipelineAction& a = plan[i];
      const int32_t m = a.micro_batch, c = a.chunk;
      InFlight& f = flights[{m, c}];
      if (!f.ctx) open(f, m, step);
      const std::string what =
          fmt::format("pipeline schedule '{}': action {} ({} of micro-batch {}, chunk {})",
                      schedule, i, pipeline_op_name(a.op), m, c);
      ICommWork* work = nullptr;
      const auto started = std::chrono::steady_clock::now();
      switch (a.op) {
        case PipelineOp::kRecvActivation:
        case PipelineOp::kRecvGrad: {
          if (!posted.count(i)) post(i);
          CommWorkPtr received = std::move(posted[i]);
          posted.erase(i);
          throw_if_error(received->wait(), what);
          post_from(i + 1);
          break;
        }
        case PipelineOp::kForward:
          forward(f, m, c, step, out);
          break;
        case PipelineOp::kSendActivation:
          throw_if_error(step.pipeline->send_async(&f.output, next, tag(m, virtual_stage(c), false),
                                                   nullptr, &work),
                         what);
          f.sends.emplace_back(work);
          break;
        case PipelineOp::kBackward:
        case PipelineOp::kBackwardInput:
          backward(f, c, a.op == PipelineOp::kBackwardInput,
                   i == last_gradient[static_cast<size_t>(c)], step);
          if (step.after_backward) step.after_backward(m);
          break;
        case PipelineOp::kBackwardWeight:
          if (i == last_gradient[static_cast<size_t>(c)] && step.grads_ready)
            f.ctx->set_grads_ready(step.grads_ready);
          throw_if_error(chunks_[static_cast<size_t>(c)]->backward_weight(f.ctx.get()),
                         what + ": model backward_weight");
          f.ctx->set_grads_ready(nullptr);
          f.ctx->rethrow_grads_ready_error();
          break;
        case PipelineOp::kSendGrad:
          throw_if_error(step.pipeline->send_async(&f.input_grad, prev,
                                                   tag(m, virtual_stage(c), true), nullptr, &work),
                         what);
          f.sends.emplace_back(work);
          break;
      }
      if (step.timeline != nullptr) {
        auto seconds = [&](std::chrono::steady_clock::time_point t) {
          return std::chrono::duration<double>(t - step.timeline_origin).count();
        };
        step.timeline->push_back(
            {info(0).pp_rank, a, seconds(started), seconds(std::chrono::steady_clock::now())});
      }
      // A micro-batch whose chunk is done frees its memory (once its sends have finished).
      if (last_action[{m, c}] == i) {
        auto node = flights.extract({m, c});
        draining.push_back(std::move(node.mapped()));
      }
      for (InFlight& d : draining)
        if (d.ctx && sends_done(d)) d.ctx.reset();
    }
  } catch (...) {
    // The transfers under way use the contexts' memory. A send finishes once its peer has
    // posted the receive (peers post ahead), so it is waited for. A receive posted ahead
    // may never get its data now that this rank stops (its peer may be waiting for this
    // rank), and waiting could take the whole collective timeout: it is not waited for, and
    // it and the context it writes into are kept for ever (the step failed and the run
    // ends; the communicator closes its connections when it goes, which ends the receive).
    for (auto& [index, received] : posted) {
      const PipelineAction& a = plan[index];
      auto node = flights.extract({a.micro_batch, a.chunk});
      if (!node.empty()) static_cast<void>(new InFlight(std::move(node.mapped())));
      static_cast<void>(received.release());
    }
    posted.clear();
    for (auto& [key, f] : flights) drain(f, nullptr);
    for (InFlight& d : draining) drain(d, nullptr);
    throw;
  }
  Status first = ok_status();
  for (InFlight& d : draining) drain(d, &first);
  throw_if_error(first, fmt::format("pipeline schedule '{}': a send between stages", schedule));
  return out;
}

void ScheduleExecutor::open(InFlight& f, int32_t m, const StepPlanContext& step) {
  MicroBatchInput& in = inputs_[static_cast<size_t>(m)];
  if (in.batch == nullptr) {
    in = step.input(m);
    if (in.batch == nullptr)
      throw Error(Code::kInternal, fmt::format("schedule executor: no data for micro-batch {}", m));
  }
  f.ctx = std::make_unique<ForwardContext>(host_, true, step.recompute, in.rng_index, step.seed,
                                           step.step, step.module_ids);
  f.ctx->set_metric_sink(step.metrics);
  f.ctx->set_aux_loss_weight(step.loss_weight);
  f.ctx->set_grad_claims(step.grad_first_write);
  f.ctx->set_param_version(step.param_version);
}

void ScheduleExecutor::forward_inputs(ForwardContext& ctx, const Batch& batch,
                                      const TensorView& received, const StepPlanContext& step,
                                      TensorView (&in)[6]) const {
  SequencePart part;
  if (step.context != nullptr && step.context->size() > 1) {
    part = {step.context->rank(), step.context->size()};
    if (batch.seq_length % (2 * part.size) != 0)
      throw InvalidArgument(fmt::format(
          "context parallelism: a micro-batch of {} tokens per sequence does not split into 2 x "
          "cp = {} equal chunks",
          batch.seq_length, 2 * part.size));
  }
  in[0] = input_view(host_, ctx, batch.tokens.data(), DType::kI32, batch, device_, part);
  in[1] = input_view(host_, ctx, batch.labels.data(), DType::kI32, batch, device_, part);
  in[2] = input_view(host_, ctx, batch.loss_mask.data(), DType::kF32, batch, device_, part);
  // Position ids follow the chunks: without ids of its own a split sequence gets its
  // tokens' places in the whole.
  in[3] = input_view(host_, ctx, batch.position_ids.empty() ? nullptr : batch.position_ids.data(),
                     DType::kI32, batch, device_, part, true);
  in[4] = input_view(host_, ctx, batch.segment_ids.empty() ? nullptr : batch.segment_ids.data(),
                     DType::kI32, batch, device_, part);
  in[5] = received;
}

std::pair<double, double> ScheduleExecutor::loss_of(IModel& model, const TensorView* outputs,
                                                    double weight,
                                                    const StepPlanContext& step) const {
  double mean = read_scalar(host_, outputs[0], "reading the loss");
  if (step.context == nullptr || step.context->size() == 1) return {mean, weight};
  // Context-parallel ranks hold parts of one sequence: the micro-batch's mean is the sum of
  // their losses over the sum of their tokens, and each rank's share of the gradient its
  // share of the tokens.
  if (model.interface_info().minor < 1 || !present(outputs[3]) || !present(outputs[4]))
    throw InvalidArgument(
        "context parallelism needs the loss as (sum, tokens) from the model (outputs [3] and "
        "[4], model 1.1)");
  double local_tokens = read_scalar(host_, outputs[4], "reading the loss's tokens");
  double totals[2] = {read_scalar(host_, outputs[3], "reading the loss's sum"), local_tokens};
  TensorView v = make_view(totals, DType::kF64, {2});
  throw_if_error(step.context->all_reduce(&v, ReduceOp::kSum, nullptr),
                 "the loss's (sum, tokens) over the context-parallel group");
  if (!(totals[1] > 0)) return {0.0, 0.0};
  // Each token's gradient is the one a single rank gives it (so FP8 and f16 see the same
  // magnitudes); the data-parallel reduction then averages over cp x dp ranks where the cp
  // shares must add up, which the trainer undoes when it unscales (Trainer::step; Megatron
  // scales its loss by cp instead).
  return {totals[0] / totals[1], weight * local_tokens / totals[1]};
}

void ScheduleExecutor::forward(InFlight& f, int32_t m, int32_t c, const StepPlanContext& step,
                               StepLosses& out) {
  const ModelInfo& where = info(c);
  IModel& model = *chunks_[static_cast<size_t>(c)];
  ForwardContext& ctx = *f.ctx;
  TensorView in[6];
  forward_inputs(ctx, *inputs_[static_cast<size_t>(m)].batch, f.received, step, in);
  // The loss's gradient, known before the forward unless context-parallel ranks share the
  // micro-batch (loss_of): handed to the model now (IForwardContext::loss_grad) and passed
  // to its backward as the same view.
  if (where.last_stage != 0 && (step.context == nullptr || step.context->size() == 1)) {
    const float dloss = static_cast<float>(step.loss_weight);
    TensorView seed = allocate(ctx, DType::kF32, {}, device_);
    copy_from_host(host_, &dloss, seed);
    ctx.set_loss_grad(seed);
  }
  // A model 1.1 gives up to five outputs; one built against SDK 1.4 the loss and logits.
  const bool v11 = model.interface_info().minor >= 1;
  const int32_t n_out = v11 ? 5 : (step.logits ? 2 : 1);
  TensorView outputs[5] = {};
  throw_if_error(model.forward(&ctx, in, where.first_stage != 0 ? 5 : 6, outputs, n_out),
                 "model forward");
  if (where.last_stage == 0) {
    f.output = outputs[2];
    return;
  }
  if (step.logits && n_out > 1 && present(outputs[1])) step.logits(m, outputs[1]);
  auto [mean, weight] = loss_of(model, outputs, step.loss_weight, step);
  f.grad_weight = weight;
  out.sum_of_means += mean;
  out.micro_batches += 1;
}

std::optional<double> ScheduleExecutor::forward_only(const Batch& batch,
                                                     const StepPlanContext& step) {
  const int32_t pp = info(0).pp_size, rank = info(0).pp_rank;
  const int32_t next = (rank + 1) % pp, prev = (rank + pp - 1) % pp;
  // Tags apart from a training step's (which are below micro-batches x stages x 2).
  constexpr int32_t kForwardOnlyTag = 1 << 30;
  std::optional<double> loss;
  TensorView received{};
  for (int32_t c = 0; c < static_cast<int32_t>(chunks_.size()); ++c) {
    const ModelInfo& where = info(c);
    IModel& model = *chunks_[static_cast<size_t>(c)];
    ForwardContext ctx(host_, false, RecomputePolicy::kNone, 0, step.seed, step.step,
                       step.module_ids);
    const std::string what = fmt::format("forward-only pass of chunk {}", c);
    if (where.first_stage == 0) {
      if (step.pipeline == nullptr || step.pipeline->size() < 2)
        throw InvalidArgument(what + ": a pipeline stage without a pipeline group");
      received = allocate_like(ctx, where.hidden, device_);
      ICommWork* work = nullptr;
      throw_if_error(step.pipeline->recv_async(
                         &received, prev, kForwardOnlyTag + virtual_stage(c) - 1, nullptr, &work),
                     what + ": receiving its input");
      throw_if_error(CommWorkPtr(work)->wait(), what + ": receiving its input");
    }
    TensorView in[6];
    forward_inputs(ctx, batch, received, step, in);
    const int32_t n_out = model.interface_info().minor >= 1 ? 5 : (step.logits ? 2 : 1);
    TensorView outputs[5] = {};
    throw_if_error(model.forward(&ctx, in, where.first_stage != 0 ? 5 : 6, outputs, n_out),
                   what + ": model forward");
    if (where.last_stage == 0) {
      ICommWork* work = nullptr;
      throw_if_error(step.pipeline->send_async(&outputs[2], next,
                                               kForwardOnlyTag + virtual_stage(c), nullptr, &work),
                     what + ": sending its output");
      throw_if_error(CommWorkPtr(work)->wait(), what + ": sending its output");
      continue;
    }
    if (step.logits && n_out > 1 && present(outputs[1])) step.logits(0, outputs[1]);
    loss = loss_of(model, outputs, 0.0, step).first;
  }
  return loss;
}

void ScheduleExecutor::backward(InFlight& f, int32_t c, bool split, bool last_for_chunk,
                                const StepPlanContext& step) {
  const ModelInfo& where = info(c);
  IModel& model = *chunks_[static_cast<size_t>(c)];
  ForwardContext& ctx = *f.ctx;
  ctx.set_defer_weight_grads(split);
  // The chunk's final gradient pass hands buckets to the reduction as they become final.
  if (last_for_chunk && step.grads_ready) ctx.set_grads_ready(step.grads_ready);
  TensorView grad_outputs[3] = {};
  int32_t n_grad_outputs = 3;
  if (where.last_stage != 0) {
    if (const TensorView* seed = ctx.loss_grad()) {  // set in forward: f.grad_weight's value
      grad_outputs[0] = *seed;
    } else {
      float dloss = static_cast<float>(f.grad_weight);
      grad_outputs[0] = allocate(ctx, DType::kF32, {}, device_);
      copy_from_host(host_, &dloss, grad_outputs[0]);
    }
    n_grad_outputs = 1;
  } else {
    grad_outputs[2] = f.received_grad;
  }
  TensorView grad_inputs[6] = {};
  throw_if_error(model.backward(&ctx, grad_outputs, n_grad_outputs, grad_inputs,
                                where.first_stage != 0 ? 0 : 6),
                 "model backward");
  ctx.set_grads_ready(nullptr);
  ctx.rethrow_grads_ready_error();
  if (where.first_stage == 0) f.input_grad = grad_inputs[5];
}

bool ScheduleExecutor::sends_done(InFlight& f) {
  for (CommWorkPtr& w : f.sends)
    if (!w->done()) return false;
  drain(f, nullptr);
  return true;
}

void ScheduleExecutor::drain(InFlight& f, Status* first) {
  for (CommWorkPtr& w : f.sends) {
    Status s = w->wait();
    if (first != nullptr && first->code == Code::kOk)
      *first = s;
    else
      status_release(&s);
  }
  f.sends.clear();
  f.ctx.reset();
}

}  // namespace loom::core
