// ScheduleExecutor against hand-written plans and a fake model whose gradients are known in
// closed form: a chain of stages h_1 = w_1 * (token + c), h_s = w_s * h_{s-1}, loss = the
// masked mean over tokens of sum_c h_S (C = 2 channels). d(loss)/d(w_s) is the product of
// the other weights times the mean of sum_c (token + c): the oracle. The model records what
// it was asked to do, so the tests also check the order the plan asked for, the split
// backward, the losses and that every plan rule is enforced with its action's index.
#include "core/train/schedule_executor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/plugin/host.h"
#include "core/train/no_pipelining.h"
#include "loom/cpp/comm_work.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"

namespace loom::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 3, kC = 2;

// One stage of the chain (its weight, its gradient, what it was asked).
class ChainStage final : public Object<IModel> {
 public:
  ChainStage(double weight, int32_t rank, int32_t stages, std::vector<std::string>* log)
      : weight_(weight), rank_(rank), stages_(stages), log_(log) {}
  double grad = 0;
  int weight_passes = 0;

  Status info(ModelInfo* out) const noexcept override {
    ModelInfo m{};
    m.struct_size = sizeof(ModelInfo);
    m.vocab_size = 16;
    m.num_layers = stages_;
    m.layer_begin = rank_;
    m.layer_end = rank_ + 1;
    m.pp_rank = rank_;
    m.pp_size = stages_;
    m.chunk = 0;
    m.chunks = 1;
    m.first_stage = rank_ == 0;
    m.last_stage = rank_ == stages_ - 1;
    m.hidden = make_view(nullptr, DType::kF32, {kB, kT, kC});
    copy_struct(m, out);
    return ok_status();
  }
  Status cost(const CostQuery*, ModelCost*) const noexcept override { return ok_status(); }
  int32_t param_count() const noexcept override { return 0; }
  Status param_info(int32_t, ParamInfo*) const noexcept override { return ok_status(); }
  Status bind_param(int32_t, const TensorView*, const TensorView*) noexcept override {
    return ok_status();
  }
  Status init_param(int32_t, uint64_t) noexcept override { return ok_status(); }
  int32_t child_count() const noexcept override { return 0; }
  Status child(int32_t, StringView*, IModule**) noexcept override { return ok_status(); }
  Status step_end(const StepEvent*) noexcept override { return ok_status(); }

  Status forward(IForwardContext* ctx, const TensorView* in, int32_t n_in, TensorView* out,
                 int32_t n_out) noexcept override {
    return guard([&] {
      note(*ctx, "F");
      const bool first = rank_ == 0, last = rank_ == stages_ - 1;
      LOOM_CHECK(n_in == (first ? 5 : 6) && n_out == 5, "counts ", n_in, " ", n_out);
      TensorView x = allocate(*ctx, DType::kF32, {kB, kT, kC});  // this stage's input
      float* xf = static_cast<float*>(x.data);
      if (first) {
        const int32_t* tokens = static_cast<const int32_t*>(in[0].data);
        for (int64_t i = 0; i < kB * kT; ++i)
          for (int64_t c = 0; c < kC; ++c) xf[i * kC + c] = static_cast<float>(tokens[i] + c);
      } else {
        std::memcpy(xf, in[5].data, sizeof(float) * kB * kT * kC);
      }
      throw_if_error(ctx->save(this, 0, &x));
      TensorView y = allocate(*ctx, DType::kF32, {kB, kT, kC});
      float* yf = static_cast<float*>(y.data);
      for (int64_t i = 0; i < kB * kT * kC; ++i) yf[i] = static_cast<float>(weight_) * xf[i];
      if (!last) {
        out[2] = y;
        return;
      }
      const float* mask = static_cast<const float*>(in[2].data);
      double sum = 0, count = 0;
      for (int64_t i = 0; i < kB * kT; ++i) {
        count += mask[i];
        for (int64_t c = 0; c < kC; ++c) sum += mask[i] * yf[i * kC + c];
      }
      TensorView totals = allocate(*ctx, DType::kF32, {3});
      float* t = static_cast<float*>(totals.data);
      t[0] = static_cast<float>(sum / count);
      t[1] = static_cast<float>(sum);
      t[2] = static_cast<float>(count);
      throw_if_error(ctx->save(this, 1, &in[2]));
      out[0] = make_view(t, DType::kF32, nullptr, 0);
      out[3] = make_view(t + 1, DType::kF32, nullptr, 0);
      out[4] = make_view(t + 2, DType::kF32, nullptr, 0);
    });
  }

  Status backward(IForwardContext* ctx, const TensorView* grad_out, int32_t n_grad_out,
                  TensorView* grad_in, int32_t n_grad_in) noexcept override {
    return guard([&] {
      const bool deferred = ctx->defer_weight_grads();
      note(*ctx, deferred ? "BI" : "B");
      const bool first = rank_ == 0, last = rank_ == stages_ - 1;
      TensorView x{};
      throw_if_error(ctx->load(this, 0, &x));
      TensorView dy = allocate(*ctx, DType::kF32, {kB, kT, kC});
      float* dyf = static_cast<float*>(dy.data);
      if (last) {
        LOOM_CHECK(n_grad_out >= 1, "grad outputs ", n_grad_out);
        TensorView mask{};
        throw_if_error(ctx->load(this, 1, &mask));
        const float* m = static_cast<const float*>(mask.data);
        double count = 0;
        for (int64_t i = 0; i < kB * kT; ++i) count += m[i];
        float dloss = *static_cast<const float*>(grad_out[0].data);
        for (int64_t i = 0; i < kB * kT; ++i)
          for (int64_t c = 0; c < kC; ++c)
            dyf[i * kC + c] = static_cast<float>(dloss * m[i] / count);
      } else {
        LOOM_CHECK(n_grad_out == 3 && present(grad_out[2]), "stage output gradient");
        std::memcpy(dyf, grad_out[2].data, sizeof(float) * kB * kT * kC);
      }
      if (deferred) {
        throw_if_error(ctx->save(this, 2, &dy));
      } else {
        grad += dot(dy, x);
        ctx->grads_ready(this);
      }
      if (!first) {
        LOOM_CHECK(n_grad_in == 6, "grad inputs ", n_grad_in);
        TensorView dx = allocate(*ctx, DType::kF32, {kB, kT, kC});
        float* dxf = static_cast<float*>(dx.data);
        for (int64_t i = 0; i < kB * kT * kC; ++i) dxf[i] = static_cast<float>(weight_) * dyf[i];
        grad_in[5] = dx;
      }
    });
  }

  Status backward_weight(IForwardContext* ctx) noexcept override {
    return guard([&] {
      note(*ctx, "BW");
      TensorView x{}, dy{};
      throw_if_error(ctx->load(this, 0, &x));
      throw_if_error(ctx->load(this, 2, &dy));
      grad += dot(dy, x);
      ++weight_passes;
      ctx->grads_ready(this);
    });
  }

 private:
  static double dot(const TensorView& a, const TensorView& b) {
    double s = 0;
    for (int64_t i = 0; i < numel(a); ++i)
      s += static_cast<const float*>(a.data)[i] *
           static_cast<double>(static_cast<const float*>(b.data)[i]);
    return s;
  }
  void note(IForwardContext& ctx, const char* what) {
    log_->push_back(std::string(what) + std::to_string(ctx.micro_batch()));
  }
  double weight_;
  int32_t rank_, stages_;
  std::vector<std::string>* log_;
};

// Micro-batch m: tokens m + i (i the position), every token counted but the last of row 1.
struct Data {
  std::vector<Batch> batches;
  explicit Data(int32_t m) : batches(static_cast<size_t>(m)) {
    for (int32_t k = 0; k < m; ++k) {
      Batch& b = batches[static_cast<size_t>(k)];
      b.batch = kB;
      b.seq_length = kT;
      for (int64_t i = 0; i < kB * kT; ++i) {
        b.tokens.push_back(static_cast<int32_t>(k + i));
        b.labels.push_back(0);
        b.loss_mask.push_back(i == kB * kT - 1 ? 0.f : 1.f);
      }
    }
  }
  // The mean over counted tokens of sum_c (token + c), micro-batch m.
  double feature(int32_t m) const {
    const Batch& b = batches[static_cast<size_t>(m)];
    double s = 0, n = 0;
    for (int64_t i = 0; i < kB * kT; ++i) {
      n += b.loss_mask[static_cast<size_t>(i)];
      for (int64_t c = 0; c < kC; ++c)
        s += b.loss_mask[static_cast<size_t>(i)] * (b.tokens[static_cast<size_t>(i)] + c);
    }
    return s / n;
  }
};

StepPlanContext context_for(Data& data, double loss_weight) {
  StepPlanContext step;
  step.input = [&data](int32_t m) {
    return MicroBatchInput{&data.batches[static_cast<size_t>(m)], m};
  };
  step.loss_weight = loss_weight;
  return step;
}

class ScheduleExecutorTest : public ::testing::Test {
 protected:
  Host host_{nullptr, 0};
  std::vector<std::string> log_;
};

TEST_F(ScheduleExecutorTest, NoPipeliningRunsEachMicroBatchAndGivesTheAnalyticGradient) {
  constexpr int32_t kM = 3;
  EXPECT_EQ(no_pipelining_plan(2).size(), 4u);
  ChainStage model(0.5, 0, 1, &log_);
  ScheduleExecutor executor(host_, kCpu, {&model});
  Data data(kM);
  uint64_t before = host_.cpu_memory().current;
  StepLosses losses =
      executor.run(no_pipelining_plan(kM), kM, context_for(data, 1.0 / kM), "no_pipelining");
  EXPECT_THAT(log_, ElementsAre("F0", "B0", "F1", "B1", "F2", "B2"));
  EXPECT_EQ(losses.micro_batches, kM);
  double loss = 0, grad = 0;
  for (int32_t m = 0; m < kM; ++m) {
    loss += 0.5 * data.feature(m);
    grad += data.feature(m) / kM;  // d(mean over micro-batches of 0.5 f_m) / d w
  }
  EXPECT_NEAR(losses.sum_of_means, loss, 1e-5 * loss);
  EXPECT_NEAR(model.grad, grad, 1e-6 * grad) << "achieved " << model.grad << " vs " << grad;
  EXPECT_EQ(host_.cpu_memory().current, before) << "a micro-batch's memory outlived its step";
}

TEST_F(ScheduleExecutorTest, AnOrderOfTheSchedulesChoosingAndASplitBackwardGiveTheSameGradient) {
  constexpr int32_t kM = 3;
  Data data(kM);
  ChainStage joint(0.5, 0, 1, &log_);
  ScheduleExecutor a(host_, kCpu, {&joint});
  a.run(no_pipelining_plan(kM), kM, context_for(data, 1.0 / kM), "no_pipelining");
  log_.clear();
  // All forwards, then the backwards in reverse, split into input and weight passes.
  std::vector<PipelineAction> plan = {
      {PipelineOp::kForward, 0, 0},       {PipelineOp::kForward, 1, 0},
      {PipelineOp::kForward, 2, 0},       {PipelineOp::kBackwardInput, 2, 0},
      {PipelineOp::kBackwardInput, 1, 0}, {PipelineOp::kBackwardWeight, 2, 0},
      {PipelineOp::kBackward, 0, 0},      {PipelineOp::kBackwardWeight, 1, 0}};
  ChainStage split(0.5, 0, 1, &log_);
  ScheduleExecutor b(host_, kCpu, {&split});
  std::vector<std::string> ready;
  StepPlanContext step = context_for(data, 1.0 / kM);
  step.grads_ready = [&](const void* owner) { ready.push_back(owner == &split ? "model" : "?"); };
  b.run(plan, kM, step, "hand-written");
  EXPECT_THAT(log_, ElementsAre("F0", "F1", "F2", "BI2", "BI1", "BW2", "B0", "BW1"));
  EXPECT_EQ(split.weight_passes, 2);
  EXPECT_NEAR(split.grad, joint.grad, 1e-12) << split.grad << " vs " << joint.grad;
  // Only the chunk's last gradient pass (the final backward_weight) hands gradients over.
  EXPECT_THAT(ready, ElementsAre("model"));
}

TEST_F(ScheduleExecutorTest, APlanThatBreaksARuleIsRefusedNamingTheAction) {
  ChainStage model(1.0, 0, 1, &log_);
  ScheduleExecutor executor(host_, kCpu, {&model});
  auto refusal = [&](std::vector<PipelineAction> plan, int32_t m) {
    try {
      executor.check(plan, m, "bad");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Code::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  using P = PipelineOp;
  EXPECT_THAT(refusal({{P::kBackward, 0, 0}, {P::kForward, 0, 0}}, 1),
              HasSubstr("pipeline schedule 'bad': action 0 (backward of micro-batch 0, chunk 0) "
                        "comes before its forward"));
  EXPECT_THAT(refusal({{P::kForward, 0, 0}, {P::kForward, 0, 0}}, 1), HasSubstr("action 1"));
  EXPECT_THAT(refusal({{P::kForward, 0, 0}}, 1),
              HasSubstr("micro-batch 0 of chunk 0 has no backward in the plan"));
  EXPECT_THAT(refusal({{P::kForward, 0, 0}, {P::kBackward, 0, 0}}, 2),
              HasSubstr("micro-batch 1 of chunk 0 has no forward"));
  EXPECT_THAT(refusal({{P::kForward, 0, 0}, {P::kBackwardInput, 0, 0}}, 1),
              HasSubstr("has no backward_weight"));
  EXPECT_THAT(refusal({{P::kForward, 0, 0}, {P::kBackward, 0, 0}, {P::kBackwardWeight, 0, 0}}, 1),
              HasSubstr("needs a backward_input before it"));
  EXPECT_THAT(refusal({{P::kForward, 3, 0}}, 2), HasSubstr("outside [0, 2)"));
  EXPECT_THAT(refusal({{P::kForward, 0, 1}}, 1), HasSubstr("outside [0, 1) (this rank's chunks)"));
  EXPECT_THAT(refusal({{P::kRecvActivation, 0, 0}}, 1), HasSubstr("first stage"));
  EXPECT_THAT(refusal({{P::kForward, 0, 0}, {P::kSendActivation, 0, 0}}, 1),
              HasSubstr("last stage"));
  EXPECT_TRUE(log_.empty()) << "a refused plan ran";
}

// Two ranks' pipeline group in one process: messages by (destination, tag) through queues.
class Pipe {
 public:
  void put(int32_t to, int32_t tag, std::vector<char> bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_[{to, tag}].push_back(std::move(bytes));
    cv_.notify_all();
  }
  std::vector<char> take(int32_t me, int32_t tag) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !queue_[{me, tag}].empty(); });
    std::vector<char> bytes = std::move(queue_[{me, tag}].front());
    queue_[{me, tag}].pop_front();
    return bytes;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<int32_t, int32_t>, std::deque<std::vector<char>>> queue_;
};

// A receive of the pipe, done when waited for.
class PipeReceive final : public Object<ICommWork> {
 public:
  PipeReceive(Pipe& pipe, int32_t rank, int32_t tag, TensorView into)
      : pipe_(pipe), rank_(rank), tag_(tag), into_(into) {}
  Status wait() noexcept override {
    if (!done_) {
      std::vector<char> bytes = pipe_.take(rank_, tag_);
      done_ = true;
      if (bytes.size() != nbytes(into_)) return make_status(Code::kInvalidArgument, "size");
      std::memcpy(into_.data, bytes.data(), bytes.size());
    }
    return ok_status();
  }
  bool done() noexcept override { return done_; }

 private:
  Pipe& pipe_;
  int32_t rank_, tag_;
  TensorView into_;
  bool done_ = false;
};

class PipeCommunicator final : public Object<ICommunicator> {
 public:
  PipeCommunicator(Pipe& pipe, int32_t rank) : pipe_(pipe), rank_(rank) {}
  int32_t rank() const noexcept override { return rank_; }
  int32_t size() const noexcept override { return 2; }
  Status send_async(const TensorView* t, int32_t peer, int32_t tag, void*,
                    ICommWork** out) noexcept override {
    const char* p = static_cast<const char*>(t->data);
    pipe_.put(peer, tag, std::vector<char>(p, p + nbytes(*t)));
    return completed_work(ok_status(), out);
  }
  // Returns at once (a receive may be posted ahead of its data); wait() takes the message.
  Status recv_async(TensorView* t, int32_t peer, int32_t tag, void*,
                    ICommWork** out) noexcept override {
    *out = new PipeReceive(pipe_, rank_, tag, *t);
    return ok_status();
  }
  Status send(const TensorView*, int32_t, int32_t, void*) noexcept override { return no(); }
  Status recv(TensorView*, int32_t, int32_t, void*) noexcept override { return no(); }
  Status all_reduce(TensorView*, ReduceOp, void*) noexcept override { return no(); }
  Status reduce_scatter(const TensorView*, TensorView*, ReduceOp, void*) noexcept override {
    return no();
  }
  Status all_gather(const TensorView*, TensorView*, void*) noexcept override { return no(); }
  Status broadcast(TensorView*, int32_t, void*) noexcept override { return no(); }
  Status all_to_all(const TensorView*, const int64_t*, const int64_t*, TensorView*, const int64_t*,
                    const int64_t*, void*) noexcept override {
    return no();
  }
  Status barrier() noexcept override { return no(); }
  void set_timeout_ms(int64_t) noexcept override {}
  Status all_reduce_async(TensorView*, ReduceOp, void*, ICommWork**) noexcept override {
    return no();
  }
  Status reduce_scatter_async(const TensorView*, TensorView*, ReduceOp, void*,
                              ICommWork**) noexcept override {
    return no();
  }
  Status all_gather_async(const TensorView*, TensorView*, void*, ICommWork**) noexcept override {
    return no();
  }
  Status broadcast_async(TensorView*, int32_t, void*, ICommWork**) noexcept override {
    return no();
  }

 private:
  static Status no() { return make_status(Code::kUnimplemented, "pipe: send/recv only"); }
  Pipe& pipe_;
  int32_t rank_;
};

// 1F1B on two stages with four micro-batches, each rank's plan written by hand.
std::vector<PipelineAction> one_f_one_b(int32_t rank) {
  using P = PipelineOp;
  if (rank == 0)
    return {{P::kForward, 0, 0},        {P::kSendActivation, 0, 0}, {P::kForward, 1, 0},
            {P::kSendActivation, 1, 0}, {P::kRecvGrad, 0, 0},       {P::kBackward, 0, 0},
            {P::kForward, 2, 0},        {P::kSendActivation, 2, 0}, {P::kRecvGrad, 1, 0},
            {P::kBackward, 1, 0},       {P::kForward, 3, 0},        {P::kSendActivation, 3, 0},
            {P::kRecvGrad, 2, 0},       {P::kBackward, 2, 0},       {P::kRecvGrad, 3, 0},
            {P::kBackward, 3, 0}};
  std::vector<PipelineAction> plan;
  for (int32_t m = 0; m < 4; ++m)
    for (P op : {P::kRecvActivation, P::kForward, P::kBackward, P::kSendGrad})
      plan.push_back({op, m, 0});
  return plan;
}

TEST_F(ScheduleExecutorTest, TwoStagesExchangeActivationsAndGradientsAndMatchOneStage) {
  constexpr int32_t kM = 4;
  const double w0 = 0.5, w1 = -1.5;
  Data data(kM);
  Pipe pipe;
  std::vector<std::string> log0, log1;
  ChainStage first(w0, 0, 2, &log0), last(w1, 1, 2, &log1);
  StepLosses loss0, loss1;
  std::string error;
  auto rank = [&](int32_t r) {
    try {
      PipeCommunicator comm(pipe, r);
      ScheduleExecutor executor(host_, kCpu, {r == 0 ? &first : &last});
      StepPlanContext step = context_for(data, 1.0 / kM);
      step.pipeline = &comm;
      (r == 0 ? loss0 : loss1) = executor.run(one_f_one_b(r), kM, step, "1f1b");
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_EQ(loss0.micro_batches, 0);  // the loss lives on the last stage
  EXPECT_EQ(loss1.micro_batches, kM);
  double loss = 0, mean_feature = 0;
  for (int32_t m = 0; m < kM; ++m) {
    loss += w0 * w1 * data.feature(m);
    mean_feature += data.feature(m) / kM;
  }
  EXPECT_NEAR(loss1.sum_of_means, loss, 1e-5 * std::abs(loss));
  // d/dw0 = w1 * mean feature, d/dw1 = w0 * mean feature.
  EXPECT_NEAR(first.grad, w1 * mean_feature, 1e-5 * std::abs(w1 * mean_feature));
  EXPECT_NEAR(last.grad, w0 * mean_feature, 1e-5 * std::abs(w0 * mean_feature));
  EXPECT_THAT(log1, ElementsAre("F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"));
}

TEST_F(ScheduleExecutorTest, TransfersWithoutAPipelineGroupAreRefused) {
  Data data(1);
  ChainStage first(1.0, 0, 2, &log_);
  ScheduleExecutor executor(host_, kCpu, {&first});
  std::vector<PipelineAction> plan = {{PipelineOp::kForward, 0, 0},
                                      {PipelineOp::kSendActivation, 0, 0},
                                      {PipelineOp::kRecvGrad, 0, 0},
                                      {PipelineOp::kBackward, 0, 0}};
  try {
    executor.run(plan, 1, context_for(data, 1.0), "1f1b");
    ADD_FAILURE() << "ran without a pipeline group";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no pipeline group of more than one rank (parallel.pp)"));
  }
}

}  // namespace
}  // namespace loom::core
