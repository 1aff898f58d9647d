// DistributedOptimizer in one process, against updates worked out by hand: plain SGD
// (w -= lr * (g * grad_scale + wd * w)) in a fake optimizer, the gradient norm from the
// gradients set, the casts into bf16 parameters, the 1.0 optimizer's per-shard path, the
// optimizer's checkpoint tensors; ParameterSet's buckets by reduction group, and its claims of
// a step's first gradient writes.
#include "core/optim/distributed_optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/parallel/local_communicator.h"
#include "core/plugin/host.h"
#include "core/plugin/registry.h"
#include "core/runtime/forward_context.h"
#include "kernels/cpu/cpu_kernels.h"
#include "loom/cpp/half.h"
#include "loom/cpp/nn/module_base.h"
#include "loom/cpp/nn/views.h"

namespace loom::core {
namespace {

// Three parameters: w (2, 3) and b (3) without weight decay, and an expert's e (4).
class Params final : public nn::ModuleBase<IGenericModule> {
 public:
  explicit Params(DType dtype) {
    add_param("w", dtype, nn::ParamSpec{{2, 3}, -1, kParamNone, ParamInit::kZeros});
    add_param("b", dtype, nn::ParamSpec{{3}, -1, kParamNoWeightDecay, ParamInit::kZeros});
    add_param("e", dtype, nn::ParamSpec{{4}, -1, kParamExpert, ParamInit::kZeros});
  }

 private:
  void run_forward(IForwardContext&, const TensorView*, int32_t, TensorView*, int32_t) override {}
  void run_backward(IForwardContext&, const TensorView*, int32_t, TensorView*, int32_t) override {}
};

// SGD without momentum and one state ("seen": how many updates touched each element), as
// optimizer 1.2 or, reporting 1.0, through update() alone.
class Sgd final : public Object<IOptimizer> {
 public:
  explicit Sgd(int32_t minor) : minor_(minor) {}
  int updates = 0, shard_calls = 0;
  InterfaceInfo interface_info() const noexcept override {
    return InterfaceInfo{kinds::kOptimizer.kind, 1, minor_};
  }
  int32_t state_count() const noexcept override { return 1; }
  const char* state_name(int32_t) const noexcept override { return "seen"; }
  Status update(const OptimizerStep* hp, bool decay, TensorView* master, const TensorView* grad,
                TensorView* states, void*) noexcept override {
    ++updates;
    step(*hp, decay, *master, *grad, states[0]);
    return ok_status();
  }
  Status update_many(const OptimizerStep* hp, int32_t count, const OptimizerShard* shards,
                     void*) noexcept override {
    ++shard_calls;
    for (int32_t i = 0; i < count; ++i) {
      const OptimizerShard& s = shards[i];
      step(*hp, s.decay != 0, s.master, s.grad, s.states[0]);
      if (present(s.param)) store_floats(static_cast<const float*>(s.master.data), s.param);
    }
    return ok_status();
  }
  Status hyper(OptimizerHyper* out) const noexcept override {
    copy_struct(OptimizerHyper{sizeof(OptimizerHyper), 0.1, 0.5}, out);
    return ok_status();
  }
  DType state_dtype(int32_t) const noexcept override {
    if (minor_ < 4) std::abort();  // the core must not ask an older optimizer
    return DType::kF32;
  }

 private:
  static void step(const OptimizerStep& hp, bool decay, const TensorView& master,
                   const TensorView& grad, const TensorView& seen) {
    float* w = static_cast<float*>(master.data);
    const float* g = static_cast<const float*>(grad.data);
    for (int64_t i = 0; i < numel(master); ++i) {
      double wd = decay ? hp.weight_decay : 0.0;
      w[i] = static_cast<float>(w[i] - hp.lr * (g[i] * hp.grad_scale + wd * w[i]));
      static_cast<float*>(seen.data)[i] += 1;
    }
  }
  int32_t minor_;
};

// A registry with the CPU kernel library (the optimizer's sumsq and cast).
const Registry& cpu_registry() {
  static const Registry registry = [] {
    Registry r;
    for (const KernelDesc& k : kernels::cpu::all_kernels()) r.add_kernel("kernels_cpu", k);
    return r;
  }();
  return registry;
}

// One process's communicators, made in `comms` as the optimizer asks for each role.
GroupOf local_groups(std::map<int, std::unique_ptr<LocalCommunicator>>& comms) {
  return [&comms](ParallelRole role) -> ICommunicator& {
    auto& c = comms[static_cast<int>(role)];
    if (!c) c = std::make_unique<LocalCommunicator>(parallel_role_name(role));
    return *c;
  };
}

struct Fixture {
  explicit Fixture(DType dtype, int32_t optimizer_minor = 2)
      : host(&cpu_registry(), 0), module(new Params(dtype)), sgd(new Sgd(optimizer_minor)) {
    params = std::make_unique<ParameterSet>(host, *module, kCpu, BucketOptions{0, 1, 1});
    // Weights 1, 2, 3, ... and gradients 0.5, -1, 1.5, ... in declaration order.
    float k = 0;
    for (Parameter& p : params->all()) {
      std::vector<float> w(static_cast<size_t>(p.numel())), g(w.size());
      for (size_t i = 0; i < w.size(); ++i, ++k) {
        w[i] = k + 1;
        g[i] = (static_cast<int>(k) % 2 == 0 ? 0.5f : -1.f) * (k + 1);
      }
      store_floats(w.data(), p.value);
      store_floats(g.data(), p.grad);
      weights.insert(weights.end(), w.begin(), w.end());
      grads.insert(grads.end(), g.begin(), g.end());
    }
    optimizer = std::make_unique<DistributedOptimizer>(
        host, *params, *sgd, OptimizerSetup{kCpu, dtype, false, false, 0}, local_groups(comms));
  }
  ~Fixture() {
    optimizer.reset();
    params.reset();
    module->destroy();
    sgd->destroy();
  }
  std::vector<float> values(const char* name) {
    Parameter* p = params->find(name);
    std::vector<float> v(static_cast<size_t>(p->numel()));
    load_floats(p->value, v.data());
    return v;
  }
  Host host;
  Params* module;
  Sgd* sgd;
  std::map<int, std::unique_ptr<LocalCommunicator>> comms;
  std::unique_ptr<ParameterSet> params;
  std::unique_ptr<DistributedOptimizer> optimizer;
  std::vector<float> weights, grads;  // declaration order: w, b, e
};

TEST(DistributedOptimizer, GradientNormIsOverEveryElementOnceAndUnscaled) {
  Fixture f(DType::kF32);
  double sumsq = 0;
  for (float g : f.grads) sumsq += static_cast<double>(g) * g;
  double norm = f.optimizer->grad_norm(4.0);
  EXPECT_NEAR(norm, std::sqrt(sumsq) / 4.0, 1e-12) << "achieved " << norm;
}

TEST(DistributedOptimizer, UpdatesEveryShardWithTheStepsScaleAndDecay) {
  Fixture f(DType::kF32);
  const double lr = 0.1, wd = 0.5, scale = 0.25;
  f.optimizer->update(OptimizerStep{sizeof(OptimizerStep), 1, lr, wd, scale, {}});
  EXPECT_EQ(f.sgd->shard_calls, 1);  // one update_many call for every shard
  EXPECT_EQ(f.sgd->updates, 0);
  size_t k = 0;
  for (const char* name : {"w", "b", "e"}) {
    bool decay = std::string(name) != "b";
    for (float got : f.values(name)) {
      double w = f.weights[k], g = f.grads[k++];
      double want = w - lr * (g * scale + (decay ? wd * w : 0.0));
      EXPECT_NEAR(got, want, 1e-6 * std::abs(want)) << name;
    }
  }
  EXPECT_EQ(f.optimizer->master_bytes(), 0u);  // f32 parameters are their own masters
  EXPECT_EQ(f.optimizer->state_bytes(), 13u * 4);
}

TEST(DistributedOptimizer, Bf16ParametersKeepF32MastersAndGetTheirCast) {
  Fixture f(DType::kBF16);
  const double lr = 0.1;
  f.optimizer->update(OptimizerStep{sizeof(OptimizerStep), 1, lr, 0.0, 1.0, {}});
  EXPECT_EQ(f.optimizer->master_bytes(), 13u * 4);
  // The masters started from the bf16 values (1, 2, ... are exact in bf16); the parameter
  // is the new master rounded to bf16.
  size_t k = 0;
  for (const char* name : {"w", "b", "e"})
    for (float got : f.values(name)) {
      float master = static_cast<float>(f.weights[k] - lr * f.grads[k]);
      ++k;
      EXPECT_EQ(got, bf16_to_f32(f32_to_bf16(master))) << name;
    }
}

TEST(DistributedOptimizer, AnOptimizer10UpdatesEachShardAndTheCoreCasts) {
  Fixture a(DType::kBF16, 2), b(DType::kBF16, 0);
  OptimizerStep hp{sizeof(OptimizerStep), 1, 0.1, 0.5, 1.0, {}};
  a.optimizer->update(hp);
  b.optimizer->update(hp);
  EXPECT_EQ(b.sgd->shard_calls, 0) << "update_many called on an optimizer 1.0";
  EXPECT_EQ(b.sgd->updates, 3);
  for (const char* name : {"w", "b", "e"}) EXPECT_EQ(a.values(name), b.values(name)) << name;
}

TEST(DistributedOptimizer, CheckpointTensorsNameTheMasterAndStatesOfEachParameter) {
  Fixture f(DType::kBF16);
  f.optimizer->prepare_checkpoint();
  std::vector<SaveTensor> out;
  for (Parameter& p : f.params->all()) f.optimizer->append_checkpoint_tensors(p, out);
  std::vector<std::string> names;
  for (const SaveTensor& t : out) names.push_back(t.name);
  EXPECT_THAT(names, ::testing::ElementsAre("optim.master.w", "optim.seen.w", "optim.master.b",
                                            "optim.seen.b", "optim.master.e", "optim.seen.e"));
  EXPECT_EQ(out[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(static_cast<const float*>(out[0].data)[5], 6.f);  // w's master, last element
}

TEST(ParameterSet, ExpertParametersGetTheirOwnBucketsAfterTheDenseOnes) {
  Host host(nullptr, 0);
  Params* module = new Params(DType::kF32);
  {
    ParameterSet params(host, *module, kCpu, BucketOptions{0, 4, 3});
    ASSERT_EQ(params.buckets().size(), 2u);
    const Bucket& dense = params.buckets()[0];
    const Bucket& experts = params.buckets()[1];
    EXPECT_EQ(dense.group, ParallelRole::kData);
    EXPECT_EQ(experts.group, ParallelRole::kExpertData);
    EXPECT_EQ(dense.params, (std::vector<size_t>{1, 0}));  // b, w: backward order
    EXPECT_EQ(experts.params, (std::vector<size_t>{2}));
    EXPECT_EQ(dense.size % 4, 0);    // padded to the data group's size
    EXPECT_EQ(experts.size % 3, 0);  // and the experts' to theirs
    EXPECT_EQ(experts.offset, dense.size);
    EXPECT_EQ(params.all()[2].reduce_group(), ParallelRole::kExpertData);
  }
  module->destroy();
}

// The step's first write of a kParamGradOverwrite gradient (IForwardContext::grad_first_write,
// served by ParameterSet::claim_grad): granted once per parameter between two zero_grads, to
// its gradient's address only, and never to a parameter without the flag or outside training.
class Overwritable final : public nn::ModuleBase<IGenericModule> {
 public:
  Overwritable() {
    add_param("w", DType::kF32, nn::ParamSpec{{2, 3}, -1, kParamGradOverwrite, ParamInit::kZeros});
    add_param("v", DType::kF32, nn::ParamSpec{{4}, -1, kParamGradOverwrite, ParamInit::kZeros});
    add_param("b", DType::kF32, nn::ParamSpec{{3}, -1, kParamNone, ParamInit::kZeros});
  }

 private:
  void run_forward(IForwardContext&, const TensorView*, int32_t, TensorView*, int32_t) override {}
  void run_backward(IForwardContext&, const TensorView*, int32_t, TensorView*, int32_t) override {}
};

// Sets every element of the (host) gradient `g` to `x`; whether every element equals `x`.
void fill(const TensorView& g, float x) {
  std::vector<float> v(static_cast<size_t>(numel(g)), x);
  store_floats(v.data(), g);
}
bool all_are(const TensorView& g, float x) {
  std::vector<float> v(static_cast<size_t>(numel(g)));
  load_floats(g, v.data());
  return std::all_of(v.begin(), v.end(), [x](float e) { return e == x; });
}

TEST(ParameterSet, GrantsTheFirstWriteOfAnOverwriteGradientOncePerStep) {
  Host host(nullptr, 0);
  Overwritable* module = new Overwritable();
  {
    ParameterSet params(host, *module, kCpu);
    const TensorView w = params.find("w")->grad, v = params.find("v")->grad;
    const TensorView b = params.find("b")->grad;
    EXPECT_TRUE(params.claim_grad(w.data));
    EXPECT_FALSE(params.claim_grad(w.data));  // the second write of the step adds
    EXPECT_FALSE(params.claim_grad(b.data));  // no flag: every write adds
    EXPECT_FALSE(params.claim_grad(static_cast<float*>(v.data) + 1));  // not its start
    EXPECT_FALSE(params.claim_grad(nullptr));
    params.zero_grads();  // the next step
    EXPECT_TRUE(params.claim_grad(w.data));
    EXPECT_TRUE(params.claim_grad(v.data));
    EXPECT_FALSE(params.claim_grad(v.data));

    // Through a forward context: training ones ask the claims they were given, once a write.
    params.zero_grads();
    auto claims = [&params](const void* grad) { return params.claim_grad(grad); };
    ForwardContext eval(host, false, RecomputePolicy::kNone, 0, 1, 1);
    eval.set_grad_claims(claims);
    EXPECT_EQ(eval.grad_first_write(&w), 0);  // no gradient outside training
    ForwardContext plain(host, true, RecomputePolicy::kNone, 0, 1, 1);
    EXPECT_EQ(plain.grad_first_write(&w), 0);  // no claims given: every write adds
    ForwardContext first(host, true, RecomputePolicy::kNone, 0, 1, 1);
    first.set_grad_claims(claims);
    ForwardContext second(host, true, RecomputePolicy::kNone, 1, 1, 1);
    second.set_grad_claims(claims);
    EXPECT_EQ(first.grad_first_write(&w), 1);
    EXPECT_EQ(second.grad_first_write(&w), 0);  // the step's other micro-batch adds
    EXPECT_EQ(second.grad_first_write(&v), 1);
    EXPECT_EQ(first.grad_first_write(nullptr), 0);
    EXPECT_EQ(nn::grad_write_beta(first, v), 1.f);  // the SDK's helper: add

    // zero_grads(true) keeps the overwrite gradients' values and zeroes the rest;
    // zero_unclaimed then zeroes those that no write claimed.
    fill(w, 3.f);
    fill(v, 4.f);
    fill(b, 5.f);
    params.zero_grads(true);
    EXPECT_TRUE(all_are(w, 3.f));
    EXPECT_TRUE(all_are(v, 4.f));
    EXPECT_TRUE(all_are(b, 0.f));
    EXPECT_TRUE(params.claim_grad(w.data));  // w is written this step, v is not
    params.zero_unclaimed();
    EXPECT_TRUE(all_are(w, 3.f));
    EXPECT_TRUE(all_are(v, 0.f));
    fill(v, 4.f);
    params.zero_unclaimed();  // once per kept step: nothing more
    EXPECT_TRUE(all_are(v, 4.f));
    params.zero_grads();  // a whole fill: every gradient
    EXPECT_TRUE(all_are(w, 0.f) && all_are(v, 0.f) && all_are(b, 0.f));
  }
  module->destroy();
}

// An overlapped reduction sends a bucket while backward still runs: its kept gradients that
// no write claimed are zeroed first (zero_unclaimed(bucket)), and then count as claimed, so
// that the step's closing zero_unclaimed leaves the reduced values alone.
TEST(ParameterSet, ZeroesABucketsUnclaimedOverwriteGradientsBeforeItGoesOut) {
  Host host(&cpu_registry(), 0);  // the optimizer's kernels
  Overwritable* module = new Overwritable();
  {
    // One parameter a bucket, in backward order: b, v, w.
    ParameterSet params(host, *module, kCpu, BucketOptions{1, 1, 1});
    ASSERT_EQ(params.buckets().size(), 3u);
    const Bucket& of_v = params.buckets()[1];
    ASSERT_EQ(params.all()[of_v.params.at(0)].name, "v");
    const TensorView w = params.find("w")->grad, v = params.find("v")->grad;
    fill(w, 3.f);
    fill(v, 4.f);
    params.zero_unclaimed(of_v);  // no kept step: nothing
    EXPECT_TRUE(all_are(v, 4.f));
    params.zero_grads(true);
    params.zero_unclaimed(of_v);  // v got no write: zeroed before the bucket goes out
    EXPECT_TRUE(all_are(v, 0.f));
    EXPECT_TRUE(all_are(w, 3.f));             // another bucket's
    EXPECT_FALSE(params.claim_grad(v.data));  // zeroed counts as claimed: a late write adds
    fill(v, 7.f);                             // the reduced values
    params.zero_unclaimed();                  // the step's end: w, unclaimed, only
    EXPECT_TRUE(all_are(v, 7.f));
    EXPECT_TRUE(all_are(w, 0.f));
    // A claimed gradient in the bucket keeps its write.
    fill(v, 5.f);
    params.zero_grads(true);
    EXPECT_TRUE(params.claim_grad(v.data));
    params.zero_unclaimed(of_v);
    EXPECT_TRUE(all_are(v, 5.f));

    // The optimizer's overlapped reduction does so as each bucket becomes final
    // (grads_ready): here all three at once, the module's one signal.
    Sgd* sgd = new Sgd(2);
    {
      std::map<int, std::unique_ptr<LocalCommunicator>> comms;
      DistributedOptimizer optimizer(host, params, *sgd,
                                     OptimizerSetup{kCpu, DType::kF32, false, true, 0},
                                     local_groups(comms));
      fill(w, 3.f);
      fill(v, 4.f);
      optimizer.begin_step(true);
      EXPECT_TRUE(params.claim_grad(w.data));  // w is written, v is not
      optimizer.grads_ready(params.all()[0].module);
      EXPECT_EQ(optimizer.released_buckets(), 3u);
      EXPECT_TRUE(all_are(w, 3.f));
      EXPECT_TRUE(all_are(v, 0.f));
      optimizer.finish_reduction();
      params.zero_unclaimed();
    }
    sgd->destroy();
  }
  module->destroy();
}

}  // namespace
}  // namespace loom::core
