#include "tests/plugins/moe/moe_oracle.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace loom::testing {

nlohmann::json MoeConfig::node() const {
  nlohmann::json router = {{"impl", "topk"},
                           {"topk", topk},
                           {"score_function", sigmoid ? "sigmoid" : "softmax"},
                           {"load_balancing_type", balance},
                           {"aux_loss_coeff", aux_coeff}};
  if (z_coeff > 0) router["z_loss_coeff"] = z_coeff;
  if (scaling > 0) router["topk_scaling_factor"] = scaling;
  if (groups > 0) {
    router["num_groups"] = groups;
    router["group_topk"] = group_topk;
  }
  nlohmann::json n = {{"impl", "moe"},
                      {"num_experts", experts},
                      {"moe_ffn_hidden_size", ffn},
                      {"activation", activation},
                      {"router", router},
                      {"dispatcher", {{"impl", dispatcher}}},
                      {"grouped_gemm", grouped_gemm}};
  if (capacity_factor > 0) {
    n["expert_capacity_factor"] = capacity_factor;
    n["token_drop_policy"] = drop_by_probs ? "probs" : "position";
  }
  if (shared_ffn > 0) {
    n["shared_expert_intermediate_size"] = shared_ffn;
    n["shared_expert_gate"] = shared_gate;
  }
  return n;
}

nlohmann::json MoeConfig::inherited(const std::string& params_dtype) const {
  return {{"hidden_size", hidden},
          {"ffn_hidden_size", 2 * ffn},
          {"add_bias_linear", false},
          {"init_std", 0.02},
          {"num_layers", 2},
          {"layer_number", 1},
          {"params_dtype", params_dtype}};
}

namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

double activation(const std::string& kind, double v) {
  if (kind == "gelu") return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  const double k = std::sqrt(2.0 / M_PI);  // gelu_tanh
  return 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
}

// An MLP without biases on one row x (C): fc2 (C, F) . act(fc1 . x), fc1 (F, C) or, for
// swiglu, (2, F, C) with silu(gate) * up.
std::vector<double> mlp(const std::string& act, const std::vector<double>& fc1,
                        const std::vector<double>& fc2, const double* x, int64_t c, int64_t f) {
  auto dot = [&](int64_t row) {
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += fc1[row * c + j] * x[j];
    return s;
  };
  std::vector<double> a(static_cast<size_t>(f));
  for (int64_t i = 0; i < f; ++i) {
    if (act == "swiglu") {
      const double gate = dot(i), up = dot(f + i);
      a[i] = gate * sigmoid(gate) * up;
    } else {
      a[i] = activation(act, dot(i));
    }
  }
  std::vector<double> y(static_cast<size_t>(c), 0.0);
  for (int64_t o = 0; o < c; ++o)
    for (int64_t i = 0; i < f; ++i) y[o] += fc2[o * f + i] * a[i];
  return y;
}

// Indices of v sorted best first (higher value; the lower index on a tie, as the kernels).
std::vector<int64_t> ranked(const std::vector<double>& v, const std::vector<int64_t>& among) {
  std::vector<int64_t> idx = among;
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  return idx;
}

// Records a decision's gap between the last kept and the first rejected candidate.
void note(MoeRouting& r, const std::vector<double>& v, const std::vector<int64_t>& order,
          size_t kept, const std::string& what) {
  if (kept == 0 || kept >= order.size()) return;
  const double gap = v[order[kept - 1]] - v[order[kept]];
  if (gap < r.margin) {
    r.margin = gap;
    r.margin_at = what;
  }
}

// Each row of (rows, k) values sorted.
std::vector<int32_t> row_sets(std::vector<int32_t> v, size_t k) {
  for (size_t at = 0; at + k <= v.size(); at += k) std::sort(v.begin() + at, v.begin() + at + k);
  return v;
}

}  // namespace

bool MoeRouting::same_choices(const MoeRouting& o) const {
  const size_t n = static_cast<size_t>(k);
  return k == o.k && row_sets(experts, n) == row_sets(o.experts, n) &&
         row_sets(aux_topk, n) == row_sets(o.aux_topk, n);
}

MoeOracleOut moe_oracle(const MoeConfig& cfg, const ParamValues& params,
                        const std::vector<double>& x) {
  const int64_t n = cfg.tokens(), c = cfg.hidden, e = cfg.experts, k = cfg.topk;
  const std::vector<double>& w = params.at("router.weight");  // (E, C)
  MoeOracleOut out;
  MoeRouting& r = out.routing;
  r.k = k;
  r.experts.assign(static_cast<size_t>(n * k), -1);
  r.probs.assign(static_cast<size_t>(n * k), 0.0);
  r.aux_topk.assign(static_cast<size_t>(n * k), -1);
  std::vector<double> aux_scores(static_cast<size_t>(n * e));  // (N, E)
  std::vector<int64_t> all(static_cast<size_t>(e));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < n; ++t) {
    const std::string at = "token " + std::to_string(t);
    std::vector<double> logit(static_cast<size_t>(e)), score(static_cast<size_t>(e));
    for (int64_t i = 0; i < e; ++i) {
      double s = 0;
      for (int64_t j = 0; j < c; ++j) s += x[t * c + j] * w[i * c + j];
      logit[i] = s;
    }
    double mx = *std::max_element(logit.begin(), logit.end()), sum = 0;
    for (int64_t i = 0; i < e; ++i) sum += std::exp(logit[i] - mx);
    const double lse = mx + std::log(sum);
    out.z += cfg.z_coeff / static_cast<double>(n) * lse * lse;
    // Selection scores: the logits (softmax) or sigmoid(logits); the aux scores: softmax over
    // all E, or the sigmoid scores normalised over all E.
    double sig_sum = 0;
    for (int64_t i = 0; i < e; ++i) {
      score[i] = cfg.sigmoid ? sigmoid(logit[i]) : logit[i];
      sig_sum += sigmoid(logit[i]);
    }
    for (int64_t i = 0; i < e; ++i)
      aux_scores[t * e + i] = cfg.sigmoid ? sigmoid(logit[i]) / sig_sum : std::exp(logit[i] - lse);
    std::vector<int64_t> allowed = all;
    if (cfg.groups > 1) {  // a group scores the sum of its best K / group_topk
      const int64_t per = e / cfg.groups, take = k / cfg.group_topk;
      std::vector<double> group_score(static_cast<size_t>(cfg.groups));
      for (int64_t g = 0; g < cfg.groups; ++g) {
        std::vector<int64_t> members(static_cast<size_t>(per));
        std::iota(members.begin(), members.end(), g * per);
        std::vector<int64_t> best = ranked(score, members);
        for (int64_t i = 0; i < take; ++i) group_score[g] += score[best[i]];
      }
      std::vector<int64_t> gs(static_cast<size_t>(cfg.groups));
      std::iota(gs.begin(), gs.end(), 0);
      std::vector<int64_t> order = ranked(group_score, gs);
      note(r, group_score, order, static_cast<size_t>(cfg.group_topk), at + " group choice");
      allowed.clear();
      for (int64_t gi = 0; gi < cfg.group_topk; ++gi)
        for (int64_t i = 0; i < per; ++i) allowed.push_back(order[gi] * per + i);
      std::sort(allowed.begin(), allowed.end());
    }
    std::vector<int64_t> order = ranked(score, allowed);
    note(r, score, order, static_cast<size_t>(k), at + " top-k");
    std::vector<double> aux_row(aux_scores.begin() + t * e, aux_scores.begin() + (t + 1) * e);
    std::vector<int64_t> plain = ranked(aux_row, all);
    if (cfg.aux_coeff > 0) note(r, aux_row, plain, static_cast<size_t>(k), at + " aux top-k");
    const double scale = cfg.scaling > 0 ? cfg.scaling : 1.0;
    double norm = 0;
    for (int64_t j = 0; j < k; ++j)
      norm += cfg.sigmoid ? score[order[j]] : std::exp(logit[order[j]] - logit[order[0]]);
    for (int64_t j = 0; j < k; ++j) {
      r.experts[t * k + j] = static_cast<int32_t>(order[j]);
      r.aux_topk[t * k + j] = static_cast<int32_t>(plain[j]);
      const double v = cfg.sigmoid ? score[order[j]] : std::exp(logit[order[j]] - logit[order[0]]);
      r.probs[t * k + j] = (cfg.sigmoid && k == 1 ? v : v / norm) * scale;
    }
  }
  if (cfg.capacity_factor > 0) {
    // Megatron's capacity of this rank's tokens; over it, keep the highest probs (ties: the
    // earlier slot) or the earliest tokens.
    const int64_t capacity = static_cast<int64_t>(
        std::ceil(static_cast<double>(n * k) / static_cast<double>(e) * cfg.capacity_factor));
    for (int64_t ex = 0; ex < e; ++ex) {
      std::vector<int64_t> slots;
      for (int64_t s = 0; s < n * k; ++s)
        if (r.experts[s] == ex) slots.push_back(s);
      if (static_cast<int64_t>(slots.size()) <= capacity) continue;
      if (cfg.drop_by_probs) {
        slots = ranked(r.probs, slots);
        note(r, r.probs, slots, static_cast<size_t>(capacity),
             "capacity of expert " + std::to_string(ex));
      }
      for (size_t i = static_cast<size_t>(capacity); i < slots.size(); ++i) {
        r.experts[slots[i]] = -1;
        r.probs[slots[i]] = 0.0;
      }
    }
  }
  r.per_expert.assign(static_cast<size_t>(e), 0);
  for (int32_t ex : r.experts)
    if (ex >= 0) ++r.per_expert[ex];
  // Load balancing (Megatron's switch_load_balancing_loss_func): coeff E / (K T^2)
  // sum_e c_e sum_t s_te per counted domain (the micro-batch, or each sequence averaged over
  // the batch), the counts c_e from the plain top-K, constants of the gradient.
  if (cfg.aux_coeff > 0 && cfg.balance != "none") {
    const bool per_seq = cfg.balance == "seq_aux_loss";
    const int64_t domains = per_seq ? cfg.batch : 1, len = n / domains;
    for (int64_t d = 0; d < domains; ++d) {
      std::vector<double> counts(static_cast<size_t>(e), 0.0), sums(counts);
      for (int64_t t = d * len; t < (d + 1) * len; ++t) {
        for (int64_t j = 0; j < k; ++j) counts[r.aux_topk[t * k + j]] += 1;
        for (int64_t i = 0; i < e; ++i) sums[i] += aux_scores[t * e + i];
      }
      const double per = cfg.aux_coeff * static_cast<double>(e) /
                         (static_cast<double>(k) * static_cast<double>(len * len * domains));
      for (int64_t i = 0; i < e; ++i) out.aux += per * counts[i] * sums[i];
    }
  }
  // The routed experts and the shared experts.
  out.y.assign(static_cast<size_t>(n * c), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const double* xt = &x[t * c];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t ex = r.experts[t * k + j];
      if (ex < 0) continue;
      std::vector<double> ye =
          mlp(cfg.activation, params.at("experts.linear_fc1.weight" + std::to_string(ex)),
              params.at("experts.linear_fc2.weight" + std::to_string(ex)), xt, c, cfg.ffn);
      for (int64_t o = 0; o < c; ++o) out.y[t * c + o] += r.probs[t * k + j] * ye[o];
    }
    if (cfg.shared_ffn > 0) {
      std::vector<double> ys =
          mlp(cfg.activation, params.at("shared_experts.linear_fc1.weight"),
              params.at("shared_experts.linear_fc2.weight"), xt, c, cfg.shared_ffn);
      double gate = 1.0;
      if (cfg.shared_gate) {
        const std::vector<double>& g = params.at("shared_experts.gate_weight");
        double s = 0;
        for (int64_t j = 0; j < c; ++j) s += g[j] * xt[j];
        gate = sigmoid(s);
      }
      for (int64_t o = 0; o < c; ++o) out.y[t * c + o] += gate * ys[o];
    }
  }
  return out;
}

}  // namespace loom::testing
