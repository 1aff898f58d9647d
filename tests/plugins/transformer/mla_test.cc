// Multi-latent attention in transformer_layer (the model's multi_latent_attention):
//  - an attention-only layer's forward against an independent f64 oracle written here from
//    DeepSeek-V2/V3's published formulas (query latent and its norm, the shared key/value
//    latent, the decoupled rotary key shared by the heads, causal softmax scaled by
//    1/sqrt(dn + dr), v of its own width, the output projection), with and without the
//    query latent, with both attention cores;
//  - the whole layer's backward against central finite differences, and the recomputation
//    policies giving the same gradients;
//  - the parameters' names and shapes, and the refusals (grouped-query attention,
//    qk_layernorm, q/k/v biases, v wider than q/k).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "loom/cpp/error.h"
#include "tests/plugins/transformer/module_check.h"

namespace loom::testing {
namespace {

using nlohmann::json;

constexpr int64_t kB = 2, kT = 5, kC = 8, kH = 2, kDn = 3, kDr = 2, kDv = 4, kQl = 6, kKvl = 5;

json mla_node(bool q_lora) {
  json m = {{"kv_lora_rank", kKvl}, {"qk_head_dim", kDn}, {"qk_pos_emb_head_dim", kDr},
            {"v_head_dim", kDv}};
  m["q_lora_rank"] = q_lora ? json(kQl) : json();
  return m;
}

json layer_node(const std::string& core = "dot_product") {
  return {{"impl", "transformer_layer"},
          {"norm", {{"impl", "rmsnorm"}, {"eps", 1e-6}}},
          {"attention", {{"impl", core}}},
          {"mlp", {{"impl", "mlp"}, {"activation", "swiglu"}}}};
}

json inherited(bool q_lora, bool mlp = true) {
  return {{"hidden_size", kC},          {"num_attention_heads", kH},
          {"ffn_hidden_size", 12},      {"add_bias_linear", false},
          {"add_qkv_bias", false},      {"init_std", 0.02},
          {"num_layers", 2},            {"layer_number", 1},
          {"position_embedding", "rope"}, {"rotary", {{"base", 100.0}, {"percent", 1.0}}},
          {"multi_latent_attention", mla_node(q_lora)}, {"has_mlp", mlp}};
}

std::map<std::string, std::vector<double>> param_values(ModuleHarness& h) {
  std::map<std::string, std::vector<double>> out;
  for (core::Parameter& p : h.params().all()) {
    std::vector<float> v = h.values(p.value);
    out[p.name] = {v.begin(), v.end()};
  }
  return out;
}

// rows (n, in) @ W^T, W (out, in).
std::vector<double> project(const std::vector<double>& x, int64_t n, int64_t in,
                            const std::vector<double>& w, int64_t out) {
  std::vector<double> y(static_cast<size_t>(n * out), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) y[r * out + o] += x[r * in + i] * w[o * in + i];
  return y;
}

std::vector<double> rms(const std::vector<double>& x, int64_t n, int64_t c,
                        const std::vector<double>& w) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < n; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < c; ++i) ms += x[r * c + i] * x[r * c + i];
    const double s = 1.0 / std::sqrt(ms / static_cast<double>(c) + 1e-6);
    for (int64_t i = 0; i < c; ++i) y[r * c + i] = x[r * c + i] * s * w[i];
  }
  return y;
}

// Rotates v[0 .. kDr) at position `pos` (NeoX / Llama rotate-half, base 100).
void rope(double* v, int64_t pos) {
  const int64_t half = kDr / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double inv = std::pow(100.0, -2.0 * static_cast<double>(i) / kDr);
    const double a = static_cast<double>(pos) * inv, x1 = v[i], x2 = v[i + half];
    v[i] = x1 * std::cos(a) - x2 * std::sin(a);
    v[i + half] = x2 * std::cos(a) + x1 * std::sin(a);
  }
}

// y = x + MLA(RMSNorm(x)) for an attention-only layer, positions 0 .. T-1.
std::vector<double> oracle(const std::map<std::string, std::vector<double>>& w,
                           const std::vector<double>& x, bool q_lora) {
  const int64_t n = kB * kT, dq = kDn + kDr;
  std::vector<double> xn = rms(x, n, kC, w.at("input_layernorm.weight"));
  std::vector<double> q;
  if (q_lora) {
    std::vector<double> cq = project(xn, n, kC, w.at("self_attention.linear_q_down_proj.weight"), kQl);
    cq = rms(cq, n, kQl, w.at("self_attention.q_layernorm.weight"));
    q = project(cq, n, kQl, w.at("self_attention.linear_q_up_proj.weight"), kH * dq);
  } else {
    q = project(xn, n, kC, w.at("self_attention.linear_q_proj.weight"), kH * dq);
  }
  std::vector<double> down =
      project(xn, n, kC, w.at("self_attention.linear_kv_down_proj.weight"), kKvl + kDr);
  std::vector<double> ckv(static_cast<size_t>(n * kKvl)), kpe(static_cast<size_t>(n * kDr));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < kKvl; ++i) ckv[r * kKvl + i] = down[r * (kKvl + kDr) + i];
    for (int64_t i = 0; i < kDr; ++i) kpe[r * kDr + i] = down[r * (kKvl + kDr) + kKvl + i];
  }
  ckv = rms(ckv, n, kKvl, w.at("self_attention.kv_layernorm.weight"));
  std::vector<double> kv =
      project(ckv, n, kKvl, w.at("self_attention.linear_kv_up_proj.weight"), kH * (kDn + kDv));
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kT; ++t) {
      rope(&kpe[(b * kT + t) * kDr], t);
      for (int64_t h = 0; h < kH; ++h) rope(&q[((b * kT + t) * kH + h) * dq + kDn], t);
    }
  std::vector<double> o(static_cast<size_t>(n * kH * kDv), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dq));
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t t = 0; t < kT; ++t) {
        const double* qt = &q[((b * kT + t) * kH + h) * dq];
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          const double* ku = &kv[((b * kT + u) * kH + h) * (kDn + kDv)];
          double dot = 0;
          for (int64_t i = 0; i < kDn; ++i) dot += qt[i] * ku[i];
          for (int64_t i = 0; i < kDr; ++i) dot += qt[kDn + i] * kpe[(b * kT + u) * kDr + i];
          s[u] = dot * scale;
          mx = std::max(mx, s[u]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t i = 0; i < kDv; ++i)
            o[((b * kT + t) * kH + h) * kDv + i] +=
                s[u] / z * kv[((b * kT + u) * kH + h) * (kDn + kDv) + kDn + i];
      }
  std::vector<double> y = project(o, n, kH * kDv, w.at("self_attention.linear_proj.weight"), kC);
  for (size_t i = 0; i < y.size(); ++i) y[i] += x[i];
  return y;
}

TEST(MultiLatentAttention, ForwardMatchesAnF64Oracle) {
  for (bool q_lora : {true, false})
    for (const char* core : {"dot_product", "fused"}) {
      SCOPED_TRACE(std::string(core) + (q_lora ? ", q latent" : ", q projection"));
      ModuleHarness h(transformer_plugins());
      IModule& layer = build_resolved(h, kinds::kLayer, layer_node(core), inherited(q_lora, false));
      randomize_params(h, 3, 0.5f);
      TensorView x = h.tensor(DType::kF32, {kB, kT, kC});
      h.fill_random(x, 5);
      IForwardContext& ctx = h.new_context(false);
      TensorView in[2] = {x, TensorView{}};
      TensorView y{};
      throw_if_error(layer.forward(&ctx, in, 2, &y, 1), "mla layer forward");
      std::vector<float> got = h.values(y), xf = h.values(x);
      std::vector<double> want = oracle(param_values(h), {xf.begin(), xf.end()}, q_lora);
      double err = 0, attn = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::fabs(got[i] - want[i]));
        attn = std::max(attn, std::fabs(want[i] - xf[i]));  // the attention's own part
      }
      std::printf("mla vs f64 oracle (%s, q_lora %d): max |diff| %.3g, max |attention| %.3g\n",
                  core, q_lora ? 1 : 0, err, attn);
      EXPECT_GT(attn, 0.05);
      EXPECT_LT(err, 2e-6 + 1e-5 * attn);
    }
}

Call layer_call(ModuleHarness& h) {
  TensorView x = h.tensor(DType::kF32, {kB, kT, kC});
  h.fill_random(x, 9);
  TensorView pos = h.tensor(DType::kI32, {kB, kT});  // the second sequence restarts at 0
  int32_t ids[] = {0, 1, 2, 3, 4, 0, 1, 2, 0, 1};
  std::copy(ids, ids + 10, static_cast<int32_t*>(pos.data));
  Call call;
  call.inputs = {x, pos};
  call.differentiable = {true, false};
  call.num_grad_inputs = 2;
  return call;
}

TEST(MultiLatentAttention, LayerMatchesFiniteDifferences) {
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora ? "q latent" : "q projection");
    ModuleHarness h(transformer_plugins());
    IModule& layer = build_resolved(h, kinds::kLayer, layer_node(), inherited(q_lora));
    randomize_params(h, 4, 0.4f);
    ModuleCheck(h, layer, layer_call(h)).check_gradients(1e-2, 5e-3, 10);
  }
}

TEST(MultiLatentAttention, RecomputePoliciesGiveTheSameGradients) {
  std::map<RecomputePolicy, Result> results;
  for (RecomputePolicy policy :
       {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
    ModuleHarness h(transformer_plugins());
    IModule& layer = build_resolved(h, kinds::kLayer, layer_node(), inherited(true));
    randomize_params(h, 6, 0.4f);
    Call call = layer_call(h);
    call.policy = policy;
    results[policy] = ModuleCheck(h, layer, call).run();
  }
  expect_same_grads(results[RecomputePolicy::kSelective], results[RecomputePolicy::kNone], 1e-6,
                    "selective vs none");
  expect_same_grads(results[RecomputePolicy::kFull], results[RecomputePolicy::kNone], 1e-6,
                    "full vs none");
}

TEST(MultiLatentAttention, ParametersHaveMegatronNamesAndShapes) {
  ModuleHarness h(transformer_plugins());
  build_resolved(h, kinds::kLayer, layer_node(), inherited(true));
  std::map<std::string, std::vector<int64_t>> want = {
      {"input_layernorm.weight", {kC}},
      {"self_attention.linear_q_down_proj.weight", {kQl, kC}},
      {"self_attention.q_layernorm.weight", {kQl}},
      {"self_attention.linear_q_up_proj.weight", {kH * (kDn + kDr), kQl}},
      {"self_attention.linear_kv_down_proj.weight", {kKvl + kDr, kC}},
      {"self_attention.kv_layernorm.weight", {kKvl}},
      {"self_attention.linear_kv_up_proj.weight", {kH * (kDn + kDv), kKvl}},
      {"self_attention.linear_proj.weight", {kC, kH * kDv}},
      {"pre_mlp_layernorm.weight", {kC}},
      {"mlp.linear_fc1.weight", {2, 12, kC}},
      {"mlp.linear_fc2.weight", {kC, 12}}};
  size_t seen = 0;
  for (core::Parameter& p : h.params().all()) {
    ASSERT_TRUE(want.count(p.name)) << p.name;
    ++seen;
    std::vector<int64_t> shape(p.info.global_shape, p.info.global_shape + p.info.ndim);
    EXPECT_EQ(shape, want[p.name]) << p.name;
    // The latent path is replicated over tensor-parallel ranks with per-rank partial
    // gradients: summed over the group.
    const bool latent = p.name.find("down_proj") != std::string::npos ||
                        p.name.find("q_layernorm") != std::string::npos ||
                        p.name.find("kv_layernorm") != std::string::npos;
    EXPECT_EQ((p.info.flags & kParamSequenceParallel) != 0, latent) << p.name;
  }
  EXPECT_EQ(seen, want.size());
}

TEST(MultiLatentAttention, IncompatibleOptionsAreRefused) {
  ModuleHarness h(transformer_plugins());
  auto refusal = [&](json options) {
    try {
      build_resolved(h, kinds::kLayer, layer_node(), options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("built");
  };
  json o = inherited(true);
  o["num_query_groups"] = 1;
  EXPECT_NE(refusal(o).find("/num_query_groups"), std::string::npos) << refusal(o);
  o = inherited(true);
  o["qk_layernorm"] = true;
  EXPECT_NE(refusal(o).find("/qk_layernorm"), std::string::npos) << refusal(o);
  o = inherited(true);
  o["add_qkv_bias"] = true;
  EXPECT_NE(refusal(o).find("/add_qkv_bias"), std::string::npos) << refusal(o);
  o = inherited(true);
  o["multi_latent_attention"]["v_head_dim"] = kDn + kDr + 1;
  EXPECT_NE(refusal(o).find("/multi_latent_attention/v_head_dim"), std::string::npos)
      << refusal(o);
  o = inherited(true);
  o["position_embedding"] = "learned";
  EXPECT_NE(refusal(o).find("position_embedding rope"), std::string::npos) << refusal(o);
}

}  // namespace
}  // namespace loom::testing
