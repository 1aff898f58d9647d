// The mamba plugin's modules, built from spec nodes through the plugin loader on one rank
// (kernels/cpu):
//  - the mamba2 mixer's forward against an independent f64 oracle written here from the
//    published Mamba-2 formulas (projections, causal conv + SiLU, the scan as its plain
//    recurrence, the gated RMSNorm over groups, the output projection), at chunk sizes that
//    do not divide T;
//  - the mixer's and the Mamba layer's backward against central finite differences, for the
//    input and every parameter; full recomputation gives the same gradients;
//  - hybrid_layer_pattern in the gpt model: the layers built per symbol (their parameter
//    names), and a bad pattern refused naming the position of the bad symbol.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loom/cpp/error.h"
#include "loom/kinds.h"
#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

std::vector<std::string> mamba_plugins() {
  std::vector<std::string> out = transformer_plugins();
  out.push_back("plugins/mamba");
  return out;
}

// C = 8, H = expand * C / P = 4 heads of P = 4, G = 2 groups, N = 3, W = 3.
constexpr int64_t kB = 2, kT = 7, kC = 8, kP = 4, kH = 4, kG = 2, kN = 3, kW = 3;

json mixer_node(int64_t chunk) {
  return {{"impl", "mamba2"}, {"state_dim", kN}, {"head_dim", kP},     {"num_groups", kG},
          {"expand", 2},      {"d_conv", kW},    {"chunk_size", chunk}};
}

json inherited(const std::string& dtype = "f32") {
  return {{"hidden_size", kC},
          {"init_std", 0.3},
          {"num_layers", 2},
          {"params_dtype", dtype},
          {"device", "cpu"}};
}

std::map<std::string, std::vector<double>> param_values(ModuleHarness& h) {
  std::map<std::string, std::vector<double>> out;
  for (core::Parameter& p : h.params().all()) {
    std::vector<float> v = h.values(p.value);
    out[p.name] = {v.begin(), v.end()};
  }
  return out;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// The mixer's forward in f64, from its parameters (names of mamba_mixer.h) and x (B, T, C).
std::vector<double> oracle(std::map<std::string, std::vector<double>> w,
                           const std::vector<double>& x) {
  const int64_t hg = kH / kG, gw = hg * kP + 2 * kN, cc = kG * gw, inner = kH * kP;
  const auto& wz = w.at("in_proj_z.weight");      // (H P, C)
  const auto& wxbc = w.at("in_proj_xbc.weight");  // (G, gw, C)
  const auto& wdt = w.at("in_proj_dt.weight");    // (H, C)
  const auto& cw = w.at("conv1d.weight");         // (G, gw, W)
  const auto& cb = w.at("conv1d.bias");           // (G, gw)
  const auto& a_log = w.at("A_log");
  const auto& d = w.at("D");
  const auto& dt_bias = w.at("dt_bias");
  const auto& nw = w.at("norm.weight");        // (H P)
  const auto& wout = w.at("out_proj.weight");  // (C, H P)
  auto proj = [&](const std::vector<double>& m, int64_t rows, int64_t b, int64_t t) {
    std::vector<double> out(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < kC; ++c) out[r] += x[(b * kT + t) * kC + c] * m[r * kC + c];
    return out;
  };
  std::vector<double> y_out(static_cast<size_t>(kB * kT * kC));
  for (int64_t b = 0; b < kB; ++b) {
    std::vector<std::vector<double>> xbc(kT), z(kT), dt(kT);
    for (int64_t t = 0; t < kT; ++t) {
      xbc[t] = proj(wxbc, cc, b, t);
      z[t] = proj(wz, inner, b, t);
      dt[t] = proj(wdt, kH, b, t);
    }
    std::vector<std::vector<double>> act(kT, std::vector<double>(cc));
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t j = 0; j < cc; ++j) {
        double u = cb[j];
        for (int64_t k = 0; k < kW; ++k) {
          const int64_t s = t + k - (kW - 1);
          if (s >= 0) u += cw[j * kW + k] * xbc[s][j];
        }
        act[t][j] = silu(u);
      }
    std::vector<std::vector<double>> y(kT, std::vector<double>(inner));
    for (int64_t h = 0; h < kH; ++h) {
      const int64_t g = h / hg, xo = g * gw + (h % hg) * kP, bo = g * gw + hg * kP, co = bo + kN;
      const double a = -std::exp(a_log[h]);
      std::vector<double> s(static_cast<size_t>(kP * kN), 0.0);
      for (int64_t t = 0; t < kT; ++t) {
        const double raw = dt[t][h] + dt_bias[h];
        const double step = raw > 20 ? raw : std::log1p(std::exp(raw));
        const double decay = std::exp(step * a);
        for (int64_t p = 0; p < kP; ++p) {
          double acc = 0;
          for (int64_t n = 0; n < kN; ++n) {
            double& st = s[p * kN + n];
            st = decay * st + step * act[t][xo + p] * act[t][bo + n];
            acc += st * act[t][co + n];
          }
          y[t][h * kP + p] = acc + d[h] * act[t][xo + p];
        }
      }
    }
    const int64_t group = inner / kG;
    for (int64_t t = 0; t < kT; ++t) {
      std::vector<double> gated(static_cast<size_t>(inner));
      for (int64_t i = 0; i < inner; ++i) gated[i] = y[t][i] * silu(z[t][i]);
      for (int64_t g = 0; g < kG; ++g) {
        double ms = 0;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) ms += gated[i] * gated[i];
        const double rstd = 1.0 / std::sqrt(ms / static_cast<double>(group) + 1e-5);
        for (int64_t i = g * group; i < (g + 1) * group; ++i) gated[i] *= rstd * nw[i];
      }
      for (int64_t c = 0; c < kC; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < inner; ++i) acc += gated[i] * wout[c * inner + i];
        y_out[(b * kT + t) * kC + c] = acc;
      }
    }
  }
  return y_out;
}

TEST(MambaMixer, ForwardMatchesAnF64OracleAtEveryChunkSize) {
  for (int64_t chunk : {1, 3, 4, 128}) {
    SCOPED_TRACE("chunk_size " + std::to_string(chunk));
    ModuleHarness h(mamba_plugins());
    IModule& mixer = build_resolved(h, kinds::kMixer, mixer_node(chunk), inherited());
    randomize_params(h, 7, 0.4f);
    TensorView x = h.tensor(DType::kF32, {kB, kT, kC});
    h.fill_random(x, 3);
    IForwardContext& ctx = h.new_context(false);
    TensorView y{};
    throw_if_error(mixer.forward(&ctx, &x, 1, &y, 1), "mamba2 forward");
    std::vector<float> got = h.values(y);
    std::vector<float> xf = h.values(x);
    std::vector<double> want = oracle(param_values(h), {xf.begin(), xf.end()});
    ASSERT_EQ(got.size(), want.size());
    double err = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, std::fabs(got[i] - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    std::printf("mamba2 vs f64 oracle, chunk %ld: max |diff| %.3g (max |y| %.3g)\n",
                static_cast<long>(chunk), err, scale);
    EXPECT_GT(scale, 0.1);  // not a trivially small output
    EXPECT_LT(err, 2e-5 * scale);
  }
}

TEST(MambaMixer, ParametersHaveMegatronShapesAndInit) {
  ModuleHarness h(mamba_plugins());
  build_resolved(h, kinds::kMixer, mixer_node(4), inherited());
  std::map<std::string, std::vector<int64_t>> want = {
      {"in_proj_z.weight", {kH * kP, kC}},
      {"in_proj_xbc.weight", {kG, kH / kG * kP + 2 * kN, kC}},
      {"in_proj_dt.weight", {kH, kC}},
      {"conv1d.weight", {kG, kH / kG * kP + 2 * kN, kW}},
      {"conv1d.bias", {kG, kH / kG * kP + 2 * kN}},
      {"A_log", {kH}},
      {"D", {kH}},
      {"dt_bias", {kH}},
      {"norm.weight", {kH * kP}},
      {"out_proj.weight", {kC, kH * kP}}};
  std::set<std::string> seen;
  for (core::Parameter& p : h.params().all()) {
    ASSERT_TRUE(want.count(p.name)) << p.name;
    seen.insert(p.name);
    std::vector<int64_t> shape(p.info.global_shape, p.info.global_shape + p.info.ndim);
    EXPECT_EQ(shape, want[p.name]) << p.name;
    std::vector<float> v = h.values(p.value);
    if (p.name == "A_log") {  // A = -exp(A_log) in [-16, -1]
      for (float a : v) EXPECT_TRUE(a >= 0.f && a <= std::log(16.f) + 1e-6f) << a;
    }
    if (p.name == "dt_bias")  // softplus(dt_bias) in [dt_min, dt_max]
      for (float b : v) {
        const double dt = std::log1p(std::exp(static_cast<double>(b)));
        EXPECT_TRUE(dt >= 0.001 - 1e-7 && dt <= 0.1 + 1e-7) << dt;
      }
    if (p.name == "D" || p.name == "norm.weight") {
      for (float f : v) EXPECT_EQ(f, 1.f);
    }
  }
  EXPECT_EQ(seen.size(), want.size());
}

Call mixer_call(ModuleHarness& h, uint64_t seed) {
  TensorView x = h.tensor(DType::kF32, {kB, kT, kC});
  h.fill_random(x, seed, 0.8f);
  Call call;
  call.inputs = {x};
  call.differentiable = {true};
  return call;
}

TEST(MambaMixer, BackwardMatchesFiniteDifferences) {
  for (int64_t chunk : {3, 4, 128}) {
    SCOPED_TRACE("chunk_size " + std::to_string(chunk));
    ModuleHarness h(mamba_plugins());
    IModule& mixer = build_resolved(h, kinds::kMixer, mixer_node(chunk), inherited());
    randomize_params(h, 11, 0.4f);
    ModuleCheck check(h, mixer, mixer_call(h, 5));
    check.check_gradients(1e-2, 5e-3, 12);
  }
}

json layer_node() {
  return {{"impl", "mamba_layer"},
          {"norm", {{"impl", "rmsnorm"}, {"eps", 1e-6}}},
          {"mixer", mixer_node(4)}};
}

TEST(MambaLayer, BackwardMatchesFiniteDifferencesAndFullRecompute) {
  ModuleHarness h(mamba_plugins());
  IModule& layer = build_resolved(h, kinds::kLayer, layer_node(), inherited());
  randomize_params(h, 13, 0.4f);
  Call call = mixer_call(h, 9);
  call.inputs.push_back(TensorView{});  // no position ids
  call.differentiable.push_back(false);
  call.num_grad_inputs = 2;
  ModuleCheck check(h, layer, call);
  check.check_gradients(5e-3, 5e-3, 8);
  Result plain = check.run();
  check.call().policy = RecomputePolicy::kFull;
  Result full = check.run();
  expect_same_grads(plain, full, 1e-6, "full recompute");
  ASSERT_TRUE(plain.param_grads.count("mixer.A_log"));
  ASSERT_TRUE(plain.param_grads.count("norm.weight"));
}

TEST(MambaLayer, PackedDocumentsAreRefused) {
  ModuleHarness h(mamba_plugins());
  IModule& layer = build_resolved(h, kinds::kLayer, layer_node(), inherited());
  TensorView x = h.tensor(DType::kF32, {1, kT, kC});
  TensorView seg = h.tensor(DType::kI32, {1, kT});
  TensorView in[3] = {x, TensorView{}, seg};
  TensorView y{};
  IForwardContext& ctx = h.new_context(true);
  Status s = layer.forward(&ctx, in, 3, &y, 1);
  ASSERT_EQ(s.code, Code::kInvalidArgument);
  std::string message = take_message(&s);
  EXPECT_NE(message.find("segment ids"), std::string::npos) << message;
}

TEST(MambaMixer, BadShapesAreRefusedNamingTheOption) {
  ModuleHarness h(mamba_plugins());
  auto refusal = [&](json node) {
    try {
      build_resolved(h, kinds::kMixer, node, inherited());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("built");
  };
  json bad = mixer_node(4);
  bad["num_groups"] = 3;  // 4 heads
  EXPECT_NE(refusal(bad).find("/num_groups: 3 does not divide the 4 SSM heads"), std::string::npos)
      << refusal(bad);
  bad = mixer_node(4);
  bad["head_dim"] = 5;  // d_inner 16
  EXPECT_NE(refusal(bad).find("/expand"), std::string::npos) << refusal(bad);
  bad = mixer_node(4);
  bad["dt_min"] = 0.5;  // above dt_max 0.1
  EXPECT_NE(refusal(bad).find("/dt_min"), std::string::npos) << refusal(bad);
}

// A hybrid gpt model: M (Mamba), * (attention only), - (MLP only).
json hybrid_model(const std::string& pattern, int64_t layers) {
  json m = json::parse(R"({
    "impl": "gpt", "hidden_size": 8, "num_attention_heads": 2, "ffn_hidden_size": 12,
    "vocab_size": 16, "max_position_embeddings": 8, "position_embedding": "none",
    "add_bias_linear": false, "tie_embeddings": false,
    "layer": {"impl": "transformer_layer", "norm": {"impl": "rmsnorm"},
              "mlp": {"impl": "mlp", "activation": "swiglu"}},
    "mamba_layer": {"impl": "mamba_layer"},
    "final_norm": {"impl": "rmsnorm"}
  })");
  m["num_layers"] = layers;
  m["hybrid_layer_pattern"] = pattern;
  m["mamba_layer"]["mixer"] = mixer_node(4);
  return m;
}

std::string build_model(ModuleHarness& h, const json& model) {
  json node = model;
  try {
    build_resolved(
        h, kinds::kModel, node,
        {{"seq_length", 8}, {"micro_batch_size", 1}, {"params_dtype", "f32"}, {"device", "cpu"}});
  } catch (const Error& e) {
    return e.what();
  }
  return "built";
}

TEST(HybridPattern, BuildsEachLayerFromItsSymbol) {
  ModuleHarness h(mamba_plugins());
  ASSERT_EQ(build_model(h, hybrid_model("M*M-", 4)), "built");
  std::set<std::string> names;
  for (core::Parameter& p : h.params().all()) names.insert(p.name);
  for (const char* want :
       {"decoder.layers.0.norm.weight", "decoder.layers.0.mixer.in_proj_xbc.weight",
        "decoder.layers.1.input_layernorm.weight",
        "decoder.layers.1.self_attention.linear_qkv.weight", "decoder.layers.2.mixer.A_log",
        "decoder.layers.3.pre_mlp_layernorm.weight", "decoder.layers.3.mlp.linear_fc1.weight"})
    EXPECT_TRUE(names.count(want)) << want;
  for (const char* absent :
       {"decoder.layers.1.pre_mlp_layernorm.weight", "decoder.layers.1.mlp.linear_fc1.weight",
        "decoder.layers.3.input_layernorm.weight",
        "decoder.layers.3.self_attention.linear_qkv.weight"})
    EXPECT_FALSE(names.count(absent)) << absent;
}

TEST(HybridPattern, ExpertLayersTakeTheMoeAndMlpLayersTheDenseMlp) {
  std::vector<std::string> plugins = mamba_plugins();
  plugins.push_back("plugins/moe");
  ModuleHarness h(plugins);
  json m = hybrid_model("ME*-", 4);
  m["layer"]["mlp"] = json::parse(R"({"impl": "moe", "num_experts": 2, "activation": "swiglu",
                                      "router": {"impl": "topk", "topk": 2}})");
  m["layer"]["dense_mlp"] = {{"impl", "mlp"}, {"activation", "swiglu"}};
  ASSERT_EQ(build_model(h, m), "built");
  std::set<std::string> names;
  for (core::Parameter& p : h.params().all()) names.insert(p.name);
  EXPECT_TRUE(names.count("decoder.layers.1.mlp.router.weight"));
  EXPECT_FALSE(names.count("decoder.layers.1.input_layernorm.weight"));
  EXPECT_TRUE(names.count("decoder.layers.3.mlp.linear_fc1.weight"));
  EXPECT_FALSE(names.count("decoder.layers.3.mlp.router.weight"));
}

TEST(HybridPattern, BadPatternsAreRefusedWithTheirPosition) {
  ModuleHarness h(mamba_plugins());
  std::string e = build_model(h, hybrid_model("M*X-", 4));
  EXPECT_NE(e.find("'X' at position 2"), std::string::npos) << e;
  e = build_model(h, hybrid_model("M*M-", 3));
  EXPECT_NE(e.find("/num_layers: 3, but /hybrid_layer_pattern \"M*M-\" has 4 layers"),
            std::string::npos)
      << e;
  json no_node = hybrid_model("M*", 2);
  no_node.erase("mamba_layer");
  e = build_model(h, no_node);
  EXPECT_NE(e.find("/mamba_layer"), std::string::npos) << e;
  e = build_model(h, hybrid_model("M*E-", 4));
  EXPECT_NE(e.find("layer 2 is a mixture of experts (E)"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::testing
