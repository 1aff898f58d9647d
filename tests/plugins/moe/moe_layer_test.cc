// The MoE layer of plugins/moe ("moe" of kind mlp) as a module, built from a spec node
// through the plugin loader on one rank (kernels/cpu):
//  - backward against central finite differences, for the input and every parameter (router,
//    each expert's fc1 / fc2, the shared experts and their gate), of the scalar
//      J = <R, y> + w (aux + z),  w = the context's aux_loss_weight,
//    the objective the layer's backward differentiates (the router adds w times the gradient
//    of its own terms, loom/kinds/moe.h). Twice: through the plugin's f32 forward, and in f64
//    through an independent oracle (moe_oracle.h) whose forward the plugin's must match;
//  - grouped experts (grouped_gemm true) against the sequential reference (false) at f32,
//    bf16 and f16, with an expert that receives no token: its gradient is exactly zero;
//  - the alltoall and allgather dispatchers, identical on one rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/runtime/forward_context.h"
#include "core/schema/schema.h"
#include "loom/kinds.h"
#include "tests/plugins/moe/moe_oracle.h"
#include "tests/util/module_harness.h"

namespace loom::testing {
namespace {

using nlohmann::json;

std::vector<std::string> moe_plugins() { return {"kernels/cpu", "plugins/moe"}; }

// Validates a component node like the spec loader, filling defaults (children included).
void resolve(const core::Catalog& catalog, const std::string& kind, json& node,
             const std::string& pointer) {
  core::SchemaHooks hooks;
  hooks.component = [&](const std::string& k, json& value, const std::string& p) {
    resolve(catalog, k, value, p);
  };
  std::string impl = node.at("impl").get<std::string>();
  const core::ManifestComponent* component = catalog.component(kind, impl);
  if (component == nullptr) throw std::runtime_error("no component " + kind + " " + impl);
  node.erase("impl");
  core::validate(component->options, node, pointer, hooks);
  node["impl"] = impl;
}

IModule& build_moe(ModuleHarness& h, const MoeConfig& cfg, const std::string& dtype = "f32") {
  json node = cfg.node();
  resolve(h.plugins().catalog(), kinds::kMlp.kind, node, "/test");
  return h.build(kinds::kMlp, node, cfg.inherited(dtype));
}

// Every parameter normal(0, scale), one seed per parameter in declaration order.
void randomize(ModuleHarness& h, uint64_t seed, float scale) {
  for (core::Parameter& p : h.params().all()) h.fill_random(p.value, seed++, scale);
}

std::vector<double> f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

ParamValues param_values(ModuleHarness& h) {
  ParamValues out;
  for (core::Parameter& p : h.params().all()) out[p.name] = f64(h.values(p.value));
  return out;
}

// The metrics a forward reports (moe/aux_loss/layer_1, moe/z_loss/layer_1, ...).
class Metrics final : public core::MetricSink {
 public:
  void record(const std::string& name, const TensorView& value, MetricReduce) override {
    values[name] = *static_cast<const float*>(value.data);  // f32, host memory (cpu)
  }
  std::map<std::string, float> values;
};

// Outputs and gradients of one forward + backward.
struct Pass {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;
  std::map<std::string, float> metrics;
};

// max |a - b| / max |b| (0 / 0 = 0).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float f : v) m = std::max(m, std::fabs(static_cast<double>(f)));
  return m;
}

class MoeCheck {
 public:
  // x (B, T, C) in the layer's dtype; R (B, T, C) random, the same dtype.
  MoeCheck(ModuleHarness& h, IModule& layer, const MoeConfig& cfg, TensorView x, double aux_weight)
      : h_(h), m_(layer), cfg_(cfg), x_(x), w_(aux_weight) {
    r_ = h.tensor(x.dtype, {cfg.batch, cfg.seq, cfg.hidden});
    h.fill_random(r_, 4242);
    r64_ = f64(h.values(r_));
  }

  // Forward and backward with the context's aux_loss_weight = `aux_weight`, parameter
  // gradients zeroed first.
  Pass run(double aux_weight) {
    Pass p;
    h_.params().zero_grads();
    core::ForwardContext& ctx = context(aux_weight);
    TensorView y{}, dx{};
    throw_if_error(m_.forward(&ctx, &x_, 1, &y, 1), "moe forward");
    p.y = h_.values(y);
    p.metrics = metrics_.values;
    throw_if_error(m_.backward(&ctx, &r_, 1, &dx, 1), "moe backward");
    p.dx = h_.values(dx);
    for (core::Parameter& q : h_.params().all()) p.grads[q.name] = h_.values(q.grad);
    return p;
  }
  Pass run() { return run(w_); }

  // Backward (input and every parameter, every element) against central differences of J
  // through the plugin (f32, step eps, bound tol (|g| + 0.1 max|g|) + floor) and through the
  // oracle (f64, step 1e-6, bound oracle_tol (|g| + 0.1 max|g|)). Refuses, rather than skips:
  // a routing margin under 1e-3, an expert without tokens, router terms too small to show in
  // the gradient, and any step that changes a routing decision. Also checks the forward and
  // the reported aux / z metrics against the oracle.
  void check_gradients(double eps, double tol, double floor, double oracle_tol);

 private:
  // A training context with the given aux_loss_weight, its metrics into metrics_.
  core::ForwardContext& context(double aux_weight) {
    core::ForwardContext& ctx = h_.new_context(true);
    ctx.set_aux_loss_weight(aux_weight);
    metrics_.values.clear();
    ctx.set_metric_sink(&metrics_);
    return ctx;
  }
  // <R, y> (f64 sum) + w (aux + z) of the oracle's terms.
  double objective(const std::vector<double>& y, const MoeOracleOut& o) const {
    double j = 0;
    for (size_t i = 0; i < y.size(); ++i) j += r64_[i] * y[i];
    return j + w_ * (o.aux + o.z);
  }
  // J through the plugin's forward at the current values (pv, xv: the same values in f64
  // for the oracle's terms); the oracle's forward in `o`.
  double plugin_objective(const ParamValues& pv, const std::vector<double>& xv, MoeOracleOut* o) {
    core::ForwardContext& ctx = context(w_);
    TensorView y{};
    throw_if_error(m_.forward(&ctx, &x_, 1, &y, 1), "moe forward");
    std::vector<double> yp = f64(h_.values(y));
    *o = moe_oracle(cfg_, pv, xv);
    for (size_t i = 0; i < yp.size(); ++i)
      forward_diff_ = std::max(forward_diff_, std::fabs(yp[i] - o->y[i]));
    return objective(yp, *o);
  }

  ModuleHarness& h_;
  IModule& m_;
  MoeConfig cfg_;
  TensorView x_, r_;
  std::vector<double> r64_;
  double w_;
  Metrics metrics_;
  double forward_diff_ = 0;  // max |y_plugin - y_oracle| over every evaluation
};

void MoeCheck::check_gradients(double eps, double tol, double floor, double oracle_tol) {
  ASSERT_EQ(x_.dtype, DType::kF32);
  Pass base = run();
  ParamValues pv = param_values(h_);
  std::vector<double> xv = f64(h_.values(x_));
  MoeOracleOut o = moe_oracle(cfg_, pv, xv);
  const MoeRouting routing = o.routing;
  // Inputs away from ties: the kernels' f32 logits agree with the oracle's to ~1e-6, so a
  // margin of 1e-3 leaves the same choices to both; every perturbed point below is checked
  // to route alike as well.
  ASSERT_GT(routing.margin, 1e-3) << "inputs too close to a routing tie at " << routing.margin_at
                                  << "; choose other seeds";
  for (int64_t e = 0; e < cfg_.experts; ++e)
    ASSERT_GT(routing.per_expert[e], 0) << "expert " << e << " runs no token: its check is empty";
  // The forward against the oracle, and the router's reported terms against its aux and z.
  std::vector<float> oy(o.y.begin(), o.y.end());
  const double fwd = rel_diff(base.y, oy);
  EXPECT_LE(fwd, 1e-5) << "forward against the f64 oracle";
  std::printf("  forward: max |y - y_oracle| / max |y_oracle| = %.2e; routing margin %.3g (%s)\n",
              fwd, routing.margin, routing.margin_at.c_str());
  const std::string aux_metric = "moe/" + cfg_.balance + "/layer_1";
  if (cfg_.aux_coeff > 0) {
    ASSERT_TRUE(base.metrics.count(aux_metric)) << aux_metric << " not reported";
    EXPECT_NEAR(base.metrics[aux_metric] * cfg_.aux_coeff, o.aux, 1e-6 * (1 + o.aux));
  }
  if (cfg_.z_coeff > 0) {
    ASSERT_TRUE(base.metrics.count("moe/z_loss/layer_1"));
    EXPECT_NEAR(base.metrics["moe/z_loss/layer_1"] * cfg_.z_coeff, o.z, 1e-6 * (1 + o.z));
  }
  // The router's terms must matter in the gradient being checked (else a backward that
  // forgot them, or forgot the weight w, would pass).
  if (cfg_.aux_coeff > 0 || cfg_.z_coeff > 0) {
    Pass plain = run(0.0);
    const double share = rel_diff(plain.grads["router.weight"], base.grads["router.weight"]);
    std::printf("  the router terms change router.weight's gradient by %.3g of its largest\n",
                share);
    EXPECT_GT(share, 20 * tol) << "aux / z terms too small to be checked";
  }
  // One target per tensor: the input, then every parameter.
  struct Target {
    std::string name;
    float* data;
    std::vector<double>* f64_values;
    const std::vector<float>* analytic;
  };
  std::vector<Target> targets{{"input", static_cast<float*>(x_.data), &xv, &base.dx}};
  for (core::Parameter& p : h_.params().all()) {
    ASSERT_EQ(p.value.dtype, DType::kF32);
    targets.push_back(
        {p.name, static_cast<float*>(p.value.data), &pv[p.name], &base.grads[p.name]});
  }
  double worst = 0, worst_oracle = 0;
  for (const Target& t : targets) {
    const std::vector<float>& g = *t.analytic;
    ASSERT_EQ(g.size(), t.f64_values->size()) << t.name;
    const double scale = max_abs(g);
    EXPECT_GT(scale, 0) << t.name << ": an all-zero gradient checks nothing";
    double err = 0, err_oracle = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const float saved = t.data[i];
      double& v = (*t.f64_values)[i];
      const double a = g[i], bound = std::fabs(a) + 0.1 * scale;
      // Through the plugin (f32): the step actually taken in f32.
      MoeOracleOut op, om;
      t.data[i] = static_cast<float>(saved + eps);
      v = t.data[i];
      const double up = v;
      const double jp = plugin_objective(pv, xv, &op);
      t.data[i] = static_cast<float>(saved - eps);
      v = t.data[i];
      const double jm = plugin_objective(pv, xv, &om);
      const double numeric = (jp - jm) / (up - v);
      t.data[i] = saved;
      v = saved;
      ASSERT_TRUE(op.routing.same_choices(routing) && om.routing.same_choices(routing))
          << t.name << "[" << i << "]: a step of " << eps << " changes the routing";
      EXPECT_LE(std::fabs(numeric - a), tol * bound + floor)
          << t.name << "[" << i << "]: finite difference " << numeric << ", backward " << a
          << " (largest gradient of the tensor " << scale << ")";
      err = std::max(err, std::fabs(numeric - a) / bound);
      // Through the oracle (f64).
      const double h = 1e-6;
      v = saved + h;
      MoeOracleOut q = moe_oracle(cfg_, pv, xv);
      const double jq = objective(q.y, q);
      v = saved - h;
      MoeOracleOut s = moe_oracle(cfg_, pv, xv);
      const double js = objective(s.y, s);
      v = saved;
      ASSERT_TRUE(q.routing.same_choices(routing) && s.routing.same_choices(routing))
          << t.name << "[" << i << "]";
      const double exact = (jq - js) / (2 * h);
      EXPECT_LE(std::fabs(exact - a), oracle_tol * bound)
          << t.name << "[" << i << "]: oracle's finite difference " << exact << ", backward " << a
          << " (largest gradient of the tensor " << scale << ")";
      err_oracle = std::max(err_oracle, std::fabs(exact - a) / bound);
    }
    std::printf("  %-34s (%3zu) rel. error: f32 FD %.2e, f64 oracle FD %.2e\n", t.name.c_str(),
                g.size(), err, err_oracle);
    worst = std::max(worst, err);
    worst_oracle = std::max(worst_oracle, err_oracle);
  }
  const double ymax = max_abs(oy);
  EXPECT_LE(forward_diff_, 1e-5 * ymax) << "the plugin's forward left the oracle's at a step";
  std::printf(
      "  worst rel. error |fd - g| / (|g| + 0.1 max|g|): f32 FD %.2e (tol %.0e), f64 "
      "oracle FD %.2e (tol %.0e); forward vs oracle over all steps %.2e\n",
      worst, tol, worst_oracle, oracle_tol, forward_diff_ / ymax);
}

TensorView input(ModuleHarness& h, const MoeConfig& cfg, DType dtype, uint64_t seed) {
  TensorView x = h.tensor(dtype, {cfg.batch, cfg.seq, cfg.hidden});
  h.fill_random(x, seed);
  return x;
}

// ---- 1. finite differences --------------------------------------------------------------

// A configuration and the seed of its parameters (and, + 100, of its input): seeds whose
// routing margin is among the largest of the first few hundred.
struct FdCase {
  std::string name;
  MoeConfig cfg;
  uint64_t seed;
};
void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

// The coefficients of the router's terms are far above a training run's (1e-2, 1e-3) so that
// those terms weigh about as much as the experts' in the router's gradient being checked.

MoeConfig softmax_aux_z() {  // softmax top-2, aux_loss + z-loss, swiglu, plain shared expert
  MoeConfig c;
  c.aux_coeff = 20;
  c.z_coeff = 2;
  c.shared_ffn = 4;
  return c;
}

MoeConfig sigmoid_groups() {  // DeepSeek-V3 style: sigmoid, 4 groups keep 2, scaling, gate
  MoeConfig c;
  c.experts = 8;
  c.seq = 8;
  c.sigmoid = true;
  c.groups = 4;
  c.group_topk = 2;
  c.scaling = 2.5;
  c.activation = "gelu";
  c.balance = "seq_aux_loss";
  c.aux_coeff = 40;
  c.shared_ffn = 4;
  c.shared_gate = true;
  return c;
}

MoeConfig capacity(bool by_probs) {  // capacity ceil(12 * 2 / 4 * f) drops about half
  MoeConfig c;
  c.capacity_factor = by_probs ? 0.5 : 0.75;
  c.drop_by_probs = by_probs;
  c.activation = by_probs ? "gelu_tanh" : "swiglu";
  c.aux_coeff = 40;
  return c;
}

class MoeFiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(MoeFiniteDifferences, BackwardMatchesFiniteDifferences) {
  const MoeConfig& cfg = GetParam().cfg;
  ModuleHarness h(moe_plugins());
  IModule& layer = build_moe(h, cfg);
  randomize(h, GetParam().seed, 0.5f);
  TensorView x = input(h, cfg, DType::kF32, GetParam().seed + 100);
  if (cfg.capacity_factor > 0) {  // the case is about drops: there must be some
    MoeOracleOut o = moe_oracle(cfg, param_values(h), f64(h.values(x)));
    int64_t dropped = std::count(o.routing.experts.begin(), o.routing.experts.end(), -1);
    std::printf("  %lld of %lld choices dropped over capacity\n", static_cast<long long>(dropped),
                static_cast<long long>(cfg.tokens() * cfg.topk));
    ASSERT_GT(dropped, 0);
  }
  std::printf("%s:\n", GetParam().name.c_str());
  // f32 through the plugin: J (~10) summed in f64 from f32 outputs carries ~1e-6 of rounding,
  // ~5e-5 after dividing by the 2e-2 step: the 1e-4 floor; 5e-3 covers the step's truncation
  // error. f64 through the oracle: 1e-4, the f32 rounding of the backward's own sums.
  MoeCheck(h, layer, cfg, x, 0.75).check_gradients(1e-2, 5e-3, 1e-4, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MoeFiniteDifferences,
    ::testing::Values(FdCase{"softmax_top2_aux_z_swiglu", softmax_aux_z(), 51},
                      FdCase{"sigmoid_groups_scaled_gated_shared_gelu", sigmoid_groups(), 163},
                      FdCase{"capacity_drop_by_probs_gelu_tanh", capacity(true), 39},
                      FdCase{"capacity_drop_by_position_swiglu", capacity(false), 33}),
    [](const auto& info) { return info.param.name; });

// ---- 2. grouped experts against the sequential reference; 3. the two dispatchers -------

// A parameter dtype and how closely two computations of the same values must agree: a few
// units of the dtype's rounding (2^-24, 2^-8, 2^-11) at the tensor's largest value.
struct DtypeCase {
  std::string name;
  DType dtype;
  double tol;
};
void PrintTo(const DtypeCase& c, std::ostream* os) { *os << c.name; }

class MoeDtypes : public ::testing::TestWithParam<DtypeCase> {};

// max |a - b| over every output and gradient of two passes, each compared within `tol`
// relative to the second's largest value.
double expect_same(const Pass& a, const Pass& b, double tol, const std::string& what) {
  double worst = 0;
  auto one = [&](const std::string& name, const std::vector<float>& u,
                 const std::vector<float>& v) {
    const double d = rel_diff(u, v);
    worst = std::max(worst, d);
    EXPECT_LE(d, tol) << what << ": " << name;
  };
  one("y", a.y, b.y);
  one("dx", a.dx, b.dx);
  EXPECT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) one(name, g, b.grads.at(name));
  return worst;
}

// 5 tokens whose feature 0 is >= 2, and expert 3's router row with W[3][0] = -3: its logit
// lies about 6 below the others' for every token, so it receives none. Shared experts
// (gated) and the router's terms on, so that every path of backward runs.
MoeConfig starving() {
  MoeConfig c;
  c.batch = 1;
  c.seq = 5;
  c.aux_coeff = 1;
  c.z_coeff = 0.1;
  c.shared_ffn = 4;
  c.shared_gate = true;
  return c;
}

Pass run_starving(const MoeConfig& cfg, const DtypeCase& d, MoeRouting* routing) {
  ModuleHarness h(moe_plugins());
  IModule& layer = build_moe(h, cfg, d.name);
  randomize(h, 7, 0.5f);
  TensorView x = input(h, cfg, d.dtype, 8);
  std::vector<float> xv = h.values(x);
  for (int64_t t = 0; t < cfg.tokens(); ++t) xv[t * cfg.hidden] = 2.0f + 0.25f * t;
  h.set_values(x, xv);
  core::Parameter* w = h.params().find("router.weight");
  std::vector<float> wv = h.values(w->value);
  wv[3 * cfg.hidden] = -3.0f;
  h.set_values(w->value, wv);
  *routing = moe_oracle(cfg, param_values(h), f64(h.values(x))).routing;
  return MoeCheck(h, layer, cfg, x, 0.5).run();
}

TEST_P(MoeDtypes, GroupedExpertsMatchTheSequentialOnesAndAStarvedExpertGetsNoGradient) {
  const DtypeCase& d = GetParam();
  MoeConfig cfg = starving();
  MoeRouting routing, routing_seq;
  cfg.grouped_gemm = true;
  Pass grouped = run_starving(cfg, d, &routing);
  cfg.grouped_gemm = false;
  Pass sequential = run_starving(cfg, d, &routing_seq);
  ASSERT_EQ(routing.per_expert[3], 0) << "expert 3 should receive no token";
  for (int64_t e = 0; e < 3; ++e) ASSERT_GT(routing.per_expert[e], 0) << "expert " << e;
  const double worst = expect_same(grouped, sequential, d.tol, "grouped vs sequential");
  for (const Pass* p : {&grouped, &sequential}) {
    const char* path = p == &grouped ? "grouped" : "sequential";
    for (int64_t e = 0; e < cfg.experts; ++e)
      for (const char* fc : {"fc1", "fc2"}) {
        const std::string name =
            std::string("experts.linear_") + fc + ".weight" + std::to_string(e);
        const double g = max_abs(p->grads.at(name));
        if (e == 3)
          EXPECT_EQ(g, 0.0) << path << ": the starved expert's " << name << " has a gradient";
        else
          EXPECT_GT(g, 0.0) << path << ": " << name << " has no gradient";
      }
  }
  std::printf(
      "%s: grouped vs sequential, max rel. diff over y, dx and every gradient %.2e "
      "(tol %.1e); starved expert 3: max |grad| %g (grouped), %g (sequential)\n",
      d.name.c_str(), worst, d.tol,
      max_abs(grouped.grads.at("experts.linear_fc1.weight3")) +
          max_abs(grouped.grads.at("experts.linear_fc2.weight3")),
      max_abs(sequential.grads.at("experts.linear_fc1.weight3")) +
          max_abs(sequential.grads.at("experts.linear_fc2.weight3")));
}

TEST_P(MoeDtypes, AllToAllAndAllGatherDispatchersAreIdenticalOnOneRank) {
  const DtypeCase& d = GetParam();
  // Drops over capacity, gated shared experts and the router's terms: every dispatcher path.
  MoeConfig cfg = capacity(true);
  cfg.shared_ffn = 4;
  cfg.shared_gate = true;
  cfg.z_coeff = 1;
  auto run_with = [&](const std::string& dispatcher) {
    cfg.dispatcher = dispatcher;
    ModuleHarness h(moe_plugins());
    IModule& layer = build_moe(h, cfg, d.name);
    randomize(h, 31, 0.5f);
    return MoeCheck(h, layer, cfg, input(h, cfg, d.dtype, 131), 0.75).run();
  };
  const Pass all_to_all = run_with("alltoall"), all_gather = run_with("allgather");
  const double worst = expect_same(all_to_all, all_gather, 0.0, "alltoall vs allgather");
  std::printf(
      "%s: alltoall vs allgather, max rel. diff over y, dx and every gradient %.2e "
      "(identical required)\n",
      d.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MoeDtypes,
                         ::testing::Values(DtypeCase{"f32", DType::kF32, 1e-5},
                                           DtypeCase{"bf16", DType::kBF16, 1.6e-2},
                                           DtypeCase{"f16", DType::kF16, 2e-3}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom::testing
