// Multi-token prediction in the gpt model (plugins/transformer/mtp.h): the objective
//   J = loss + w * mtp_loss   (w: the context's aux_loss_weight, mtp_loss: the reported metric)
// against central differences for the MTP parameters and the shared ones (tied and untied
// output weights); the forward's mtp_loss against an f64 oracle written here (with the
// transformer layers' output projections zeroed, so that every layer is the identity and
// the oracle needs only the embedding, the norms, eh_proj and the shared head); positions
// masked out give no gradient; full recomputation gives the same gradients; parameter
// names; and the configurations MTP does not support refused with their spec pointers.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "core/util/errors.h"
#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

constexpr int64_t kB = 2, kT = 6, kC = 8, kV = 11;

json mtp_model(bool tied, int64_t depths = 2) {
  return {{"impl", "gpt"},
          {"num_layers", 1},
          {"hidden_size", kC},
          {"num_attention_heads", 2},
          {"ffn_hidden_size", 12},
          {"vocab_size", kV},
          {"position_embedding", "rope"},
          {"add_bias_linear", false},
          {"tie_embeddings", tied},
          {"mtp_num_layers", depths},
          {"mtp_loss_scaling_factor", 0.3},
          {"layer",
           {{"impl", "transformer_layer"},
            {"norm", {{"impl", "rmsnorm"}}},
            {"mlp", {{"impl", "mlp"}, {"activation", "swiglu"}}}}},
          {"final_norm", {{"impl", "rmsnorm"}}}};
}

json root() {
  return {{"seq_length", kT},
          {"micro_batch_size", kB},
          {"params_dtype", "f32"},
          {"device", "cpu"},
          {"return_logits", false}};
}

class Metrics final : public core::MetricSink {
 public:
  void record(const std::string& name, const TensorView& value, MetricReduce) override {
    values[name] = *static_cast<const float*>(value.data);  // f32, host memory (cpu)
  }
  std::map<std::string, float> values;
};

// tokens, labels, loss mask (position 4 of row 1 masked).
struct Batch {
  std::vector<int32_t> tokens, labels;
  std::vector<float> mask;
};

Batch make_batch() {
  Batch b;
  for (int32_t i = 0; i < kB * kT; ++i) {
    b.tokens.push_back((i * 7 + 3) % kV);
    b.labels.push_back((i * 5 + 1) % kV);
    b.mask.push_back(i == kT + 4 ? 0.f : 1.f);
  }
  return b;
}

// One training pass of the model with aux_loss_weight w: J = loss + w * mtp_loss, and the
// metrics; with `backward`, the parameter gradients (zeroed first) by name.
struct Pass {
  double loss = 0, objective = 0;
  std::map<std::string, float> metrics;
  std::map<std::string, std::vector<float>> grads;
};

class MtpRun {
 public:
  MtpRun(ModuleHarness& h, IModule& model, const Batch& batch, double w,
         RecomputePolicy policy = RecomputePolicy::kNone)
      : h_(h), m_(model), w_(w), policy_(policy) {
    tokens_ = h.tensor(DType::kI32, {kB, kT});
    labels_ = h.tensor(DType::kI32, {kB, kT});
    mask_ = h.tensor(DType::kF32, {kB, kT});
    set(batch);
  }
  void set(const Batch& b) {
    std::copy(b.tokens.begin(), b.tokens.end(), static_cast<int32_t*>(tokens_.data));
    std::copy(b.labels.begin(), b.labels.end(), static_cast<int32_t*>(labels_.data));
    h_.set_values(mask_, b.mask);
  }
  Pass run(bool backward) {
    Pass p;
    if (backward) h_.params().zero_grads();
    core::ForwardContext& ctx = h_.new_context(true, policy_);
    ctx.set_aux_loss_weight(w_);
    Metrics metrics;
    ctx.set_metric_sink(&metrics);
    TensorView in[4] = {tokens_, labels_, mask_, TensorView{}};
    TensorView loss{};
    throw_if_error(m_.forward(&ctx, in, 4, &loss, 1), "forward");
    p.loss = h_.values(loss)[0];
    p.metrics = metrics.values;
    p.objective = p.loss + w_ * metrics.values.at("mtp_loss");
    if (!backward) return p;
    TensorView dloss = h_.tensor(DType::kF32, {});
    h_.set_values(dloss, {1.f});
    throw_if_error(m_.backward(&ctx, &dloss, 1, nullptr, 0), "backward");
    for (core::Parameter& q : h_.params().all()) p.grads[q.name] = h_.values(q.grad);
    return p;
  }

 private:
  ModuleHarness& h_;
  IModule& m_;
  double w_;
  RecomputePolicy policy_;
  TensorView tokens_, labels_, mask_;
};

// Central differences of J on up to `samples` elements of every parameter whose name
// passes `pick`.
void check_gradients(ModuleHarness& h, MtpRun& run, double eps, double tol, int samples) {
  Pass base = run.run(true);
  int checked = 0;
  for (core::Parameter& p : h.params().all()) {
    const std::vector<float>& g = base.grads.at(p.name);
    double scale = 0;
    for (float x : g) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    float* data = static_cast<float*>(p.value.data);
    const int64_t n = p.numel();
    std::set<int64_t> picks;
    for (int64_t k = 0; k < samples && k < n; ++k) picks.insert((k * 7919 + n / 3) % n);
    for (int64_t i : picks) {
      const float saved = data[i];
      data[i] = saved + static_cast<float>(eps);
      const double plus = run.run(false).objective;
      data[i] = saved - static_cast<float>(eps);
      const double minus = run.run(false).objective;
      data[i] = saved;
      const double numeric = (plus - minus) / (2 * eps), a = g[static_cast<size_t>(i)];
      EXPECT_LE(std::fabs(numeric - a), tol * (std::fabs(a) + 0.1 * scale) + 1e-4)
          << p.name << "[" << i << "]: finite difference " << numeric << ", backward " << a;
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(Mtp, UntiedMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& model = build_resolved(h, kinds::kModel, mtp_model(false), root());
  randomize_params(h, 21, 0.3f);
  MtpRun run(h, model, make_batch(), 1.0);
  Pass p = run.run(true);
  // The MTP terms must weigh in the objective's gradient (else the check proves little).
  double eh = 0;
  for (float x : p.grads.at("mtp.layers.1.eh_proj.weight")) eh = std::max(eh, std::fabs(1.0 * x));
  EXPECT_GT(eh, 1e-3);
  check_gradients(h, run, 3e-3, 5e-3, 4);
}

TEST(Mtp, TiedMatchesFiniteDifferences) {
  ModuleHarness h(transformer_plugins());
  IModule& model = build_resolved(h, kinds::kModel, mtp_model(true, 1), root());
  randomize_params(h, 22, 0.3f);
  MtpRun run(h, model, make_batch(), 0.7);
  check_gradients(h, run, 3e-3, 5e-3, 4);
}

// RMSNorm over C of x with weight g (eps 1e-5, the schema's default).
std::vector<double> rms(const double* x, const std::vector<float>& g) {
  double ms = 0;
  for (int64_t c = 0; c < kC; ++c) ms += x[c] * x[c];
  const double r = 1.0 / std::sqrt(ms / kC + 1e-5);
  std::vector<double> y(kC);
  for (int64_t c = 0; c < kC; ++c) y[c] = x[c] * r * g[c];
  return y;
}

// Cross entropy of h (C) through the output weight w (V, C) against `label`.
double cross_entropy(const std::vector<double>& h, const std::vector<float>& w, int32_t label) {
  std::vector<double> z(kV);
  double m = -1e300;
  for (int64_t v = 0; v < kV; ++v) {
    z[v] = 0;
    for (int64_t c = 0; c < kC; ++c) z[v] += h[c] * w[v * kC + c];
    m = std::max(m, z[v]);
  }
  double s = 0;
  for (double x : z) s += std::exp(x - m);
  return m + std::log(s) - z[label];
}

TEST(Mtp, LossMatchesOracleWithIdentityLayers) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ModuleHarness h(transformer_plugins());
    IModule& model = build_resolved(h, kinds::kModel, mtp_model(tied, 2), root());
    randomize_params(h, 23, 0.5f);
    // Zero every layer's output projections: each layer is then x + 0 + 0.
    std::map<std::string, std::vector<float>> p;
    for (core::Parameter& q : h.params().all()) {
      if (q.name.find("linear_proj.weight") != std::string::npos ||
          q.name.find("linear_fc2.weight") != std::string::npos)
        h.set_values(q.value, std::vector<float>(static_cast<size_t>(q.numel()), 0.f));
      p[q.name] = h.values(q.value);
    }
    Batch batch = make_batch();
    MtpRun run(h, model, batch, 1.0);
    Pass got = run.run(false);

    const std::vector<float>& table = p.at("embedding.word_embeddings.weight");
    const std::vector<float>& out = tied ? table : p.at("output_layer.weight");
    // h^0 = final_norm(embedding) (the decoder is the identity); the main loss from it.
    std::vector<std::vector<double>> h0;
    double main_sum = 0, main_count = 0;
    for (int64_t i = 0; i < kB * kT; ++i) {
      std::vector<double> e(table.begin() + batch.tokens[i] * kC,
                            table.begin() + (batch.tokens[i] + 1) * kC);
      h0.push_back(rms(e.data(), p.at("decoder.final_layernorm.weight")));
      main_sum += batch.mask[i] * cross_entropy(h0.back(), out, batch.labels[i]);
      main_count += batch.mask[i];
    }
    EXPECT_NEAR(got.loss, main_sum / main_count, 1e-5) << "the main loss stays the main loss";
    std::vector<std::vector<double>> prev = h0;
    double total = 0;
    for (int64_t k = 1; k <= 2; ++k) {
      const std::string d = "mtp.layers." + std::to_string(k - 1) + ".";
      const std::vector<float>& eh = p.at(d + "eh_proj.weight");  // (2C, C) input-major
      std::vector<std::vector<double>> next;
      double sum = 0, count = 0;
      for (int64_t r = 0; r < kB; ++r)
        for (int64_t i = 0; i < kT; ++i) {
          const int64_t at = r * kT + i;
          const bool inside = i + k < kT;
          const int32_t id = inside ? batch.tokens[at + k] : 0;
          std::vector<double> e(table.begin() + id * kC, table.begin() + (id + 1) * kC);
          std::vector<double> en = rms(e.data(), p.at(d + "enorm.weight"));
          std::vector<double> hn = rms(prev[at].data(), p.at(d + "hnorm.weight"));
          std::vector<double> u(kC, 0.0);
          for (int64_t o = 0; o < kC; ++o)
            for (int64_t c = 0; c < kC; ++c)
              u[o] += en[c] * eh[c * kC + o] + hn[c] * eh[(kC + c) * kC + o];
          next.push_back(rms(u.data(), p.at(d + "final_layernorm.weight")));
          if (!inside) continue;  // the last k positions are masked
          sum += batch.mask[at + k] * cross_entropy(next.back(), out, batch.labels[at + k]);
          count += batch.mask[at + k];
        }
      const double lk = sum / count;
      EXPECT_NEAR(got.metrics.at("mtp/loss/depth_" + std::to_string(k)), lk, 1e-5 * (1 + lk));
      total += lk;
      prev = next;
    }
    total *= 0.3 / 2;
    EXPECT_NEAR(got.metrics.at("mtp_loss"), total, 1e-6 * (1 + total));
    std::printf("  %s: mtp_loss %.6f, oracle %.6f\n", tied ? "tied" : "untied",
                got.metrics.at("mtp_loss"), total);
  }
}

// A position masked out contributes nothing: changing the label of a masked position (row
// 1, position 4: masked for the main loss, and for depth k at position 4 - k once rolled)
// leaves every gradient as it was; all positions masked, every gradient is zero.
TEST(Mtp, MaskedPositionsGiveNoGradient) {
  ModuleHarness h(transformer_plugins());
  IModule& model = build_resolved(h, kinds::kModel, mtp_model(false), root());
  randomize_params(h, 24, 0.3f);
  Batch batch = make_batch();
  MtpRun run(h, model, batch, 1.0);
  Pass a = run.run(true);
  batch.labels[kT + 4] = (batch.labels[kT + 4] + 3) % kV;
  run.set(batch);
  Pass b = run.run(true);
  for (const auto& [name, g] : a.grads) EXPECT_EQ(g, b.grads.at(name)) << name;
  batch.mask.assign(batch.mask.size(), 0.f);
  run.set(batch);
  Pass z = run.run(true);
  EXPECT_EQ(z.metrics.at("mtp_loss"), 0.f);
  for (const auto& [name, g] : z.grads)
    for (float x : g) ASSERT_EQ(x, 0.f) << name;
}

TEST(Mtp, FullRecomputeGivesTheSameGradients) {
  std::vector<Pass> passes;
  for (RecomputePolicy policy : {RecomputePolicy::kNone, RecomputePolicy::kFull}) {
    ModuleHarness h(transformer_plugins());
    json node = mtp_model(true);
    node["hidden_dropout"] = 0.1;  // the depths' embedding dropout replays alike
    IModule& model = build_resolved(h, kinds::kModel, node, root());
    randomize_params(h, 25, 0.3f);
    MtpRun run(h, model, make_batch(), 1.0, policy);
    passes.push_back(run.run(true));
  }
  EXPECT_EQ(passes[0].objective, passes[1].objective);
  for (const auto& [name, g] : passes[0].grads)
    EXPECT_LE(relative_diff(passes[1].grads.at(name), g), 1e-6) << name;
}

TEST(Mtp, ParameterNamesFollowMegatron) {
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kModel, mtp_model(false), root());
  std::set<std::string> names;
  for (core::Parameter& p : h.params().all()) names.insert(p.name);
  for (const char* d : {"mtp.layers.0.", "mtp.layers.1."})
    for (const char* n : {"enorm.weight", "hnorm.weight", "eh_proj.weight",
                          "final_layernorm.weight", "transformer_layer.mlp.linear_fc1.weight",
                          "transformer_layer.self_attention.linear_qkv.weight"})
      EXPECT_TRUE(names.count(std::string(d) + n)) << d << n;
  core::Parameter* eh = h.params().find("mtp.layers.0.eh_proj.weight");
  ASSERT_NE(eh, nullptr);
  EXPECT_EQ(eh->info.shape[0], 2 * kC);
  EXPECT_EQ(eh->info.shape[1], kC);
  EXPECT_EQ(eh->info.tp_split_dim, -1);
  EXPECT_FALSE(names.count("mtp.layers.2.eh_proj.weight"));
}

void expect_refused(json node, json options, const std::string& pointer, const std::string& words) {
  ModuleHarness h(transformer_plugins());
  try {
    build_resolved(h, kinds::kModel, node, options);
    ADD_FAILURE() << "built; expected a refusal at " << pointer;
  } catch (const core::SpecError& e) {
    EXPECT_EQ(e.pointer(), pointer) << e.what();
    EXPECT_NE(e.problem().find(words), std::string::npos) << e.what();
  }
}

TEST(MtpRules, UnsupportedLayoutsAreRefused) {
  json options = root();
  options["pipeline"] = {{"rank", 1}, {"size", 2}, {"chunk", 0}, {"chunks", 1}};
  json node = mtp_model(false);
  node["num_layers"] = 2;
  expect_refused(node, options, "/test/mtp_num_layers",
                 "multi-token prediction with parallel.pp > 1 is not supported yet");
  node = mtp_model(false);
  node["position_embedding"] = "learned";
  expect_refused(node, root(), "/test/mtp_num_layers", "learned absolute position embeddings");
  node = mtp_model(false);
  node["hybrid_layer_pattern"] = "*";
  expect_refused(node, root(), "/test/mtp_num_layers", "hybrid_layer_pattern is not supported");
  node = mtp_model(false);
  node["mtp_num_layers"] = -1;
  expect_refused(node, root(), "/test/mtp_num_layers", "");
}

}  // namespace
}  // namespace loom::testing
