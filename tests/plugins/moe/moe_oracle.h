// An independent f64 reference of the MoE layer (plugins/moe, "moe" of kind mlp) on one rank,
// written from Megatron-Core's definitions rather than from the plugin's code, for the
// module tests: the top-k router (softmax over the chosen logits or normalised sigmoid
// scores, group-limited choice, scaling factor), capacity drops (by probs or by position),
// the experts (gelu, gelu_tanh or swiglu MLPs without biases), the shared experts with their
// optional sigmoid gate, and the router's own terms of the objective (aux_loss /
// seq_aux_loss and the z-loss). It also measures the margin of every discrete decision
// (top-k, groups, the counts of the load-balancing loss, capacity drops), so that a test can
// refuse inputs too close to a tie for finite differences.
//
// Shapes: N = batch * seq tokens, C hidden, E experts, K top-k, F expert width, Fs shared
// width. Parameters by the plugin's names (ParameterSet paths of the built layer):
//   router.weight (E, C); experts.linear_fc1.weight{e} (F, C) or (2, F, C) swiglu [gate; up];
//   experts.linear_fc2.weight{e} (C, F); shared_experts.linear_fc1.weight (Fs, C) or
//   (2, Fs, C); shared_experts.linear_fc2.weight (C, Fs); shared_experts.gate_weight (1, C).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::testing {

/// One MoE layer configuration: what the spec node says, in the oracle's terms.
struct MoeConfig {
  int64_t hidden = 8, experts = 4, topk = 2, ffn = 6, batch = 2, seq = 6;
  std::string activation = "swiglu";   // gelu, gelu_tanh, swiglu
  bool sigmoid = false;                // score_function sigmoid (else softmax)
  double scaling = 0;                  // topk_scaling_factor; 0: none
  int64_t groups = 0, group_topk = 0;  // num_groups / group_topk; 0: none
  double capacity_factor = 0;          // expert_capacity_factor; 0: dropless
  bool drop_by_probs = true;           // token_drop_policy probs (else position)
  std::string balance = "aux_loss";    // load_balancing_type: aux_loss, seq_aux_loss, none
  double aux_coeff = 0, z_coeff = 0;   // aux_loss_coeff, z_loss_coeff (0: off)
  int64_t shared_ffn = 0;              // shared_expert_intermediate_size; 0: none
  bool shared_gate = false;
  bool grouped_gemm = true;
  std::string dispatcher = "alltoall";

  int64_t tokens() const { return batch * seq; }
  /// The spec node {"impl": "moe", ...}.
  nlohmann::json node() const;
  /// What the enclosing transformer layer hands down (hidden_size, ffn_hidden_size, ...).
  nlohmann::json inherited(const std::string& params_dtype = "f32") const;
};

/// The oracle's routing of N tokens.
struct MoeRouting {
  int64_t k = 0;                    // K
  std::vector<int32_t> experts;     // (N, K) chosen experts, best first; -1: dropped
  std::vector<double> probs;        // (N, K) combine weights; 0 where dropped
  std::vector<int32_t> aux_topk;    // (N, K) the plain top-K the load-balancing counts use
  std::vector<int64_t> per_expert;  // (E) (token, choice) pairs each expert runs
  double margin = 1e300;            // smallest gap of any discrete decision
  std::string margin_at;            // which decision that is
  /// The same decisions: each token's set of kept experts and of aux top-K experts (the
  /// order within a token's K is no decision: the output does not depend on it).
  bool same_choices(const MoeRouting& o) const;
};

/// The oracle's forward.
struct MoeOracleOut {
  std::vector<double> y;  // (N, C)
  double aux = 0;         // the load-balancing term, coefficient included
  double z = 0;           // the z-loss term, coefficient included
  MoeRouting routing;
};

/// Parameters by name (f32, bf16 or f16 storage read exactly, held in f64 so that a test can
/// take finite differences of the oracle itself).
using ParamValues = std::map<std::string, std::vector<double>>;

/// The layer's forward on x (N, C), in f64. Throws std::out_of_range for a missing parameter.
MoeOracleOut moe_oracle(const MoeConfig& cfg, const ParamValues& params,
                        const std::vector<double>& x);

}  // namespace loom::testing
