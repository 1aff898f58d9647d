// MoeLayer (kinds::kMlp "moe"): Megatron-Core's MoELayer, taken by a transformer layer in
// place of the dense MLP. Per token: a router (slot "router", kind router) picks K of
// num_experts experts with weights (probs); a dispatcher (slot "dispatcher", kind
// moe_dispatcher: allgather or alltoall over the expert-parallel group) brings each token to
// the ranks owning its experts; the experts (GroupedMlp, child "experts") run; the
// dispatcher brings the rows back, weighted by the probs; shared experts (child
// "shared_experts", when shared_expert_intermediate_size is set) add a dense MLP of the
// token. With expert_capacity_factor each expert keeps at most
// ceil(N K / E * factor) of this rank's (token, choice) pairs (token_drop_policy probs or
// position); dropless by default; pad_to_capacity then fills every expert up to exactly
// its capacity with tokens of prob 0 (fixed row counts, as Megatron-Core's
// moe_pad_expert_input_to_capacity; the result is the unpadded one). The router's load-balancing terms enter the objective
// through the router's backward (their weight is the context's aux_loss_weight).
//   forward:  [0] x (B, T, C) -> [0] y (B, T, C) (sequence shards with sequence parallelism)
//   backward: dy -> dx; parameter gradients accumulated
#pragma once

#include <nlohmann/json.hpp>

#include "plugins/moe/grouped_mlp.h"
#include "plugins/moe/shared_experts.h"
#include "plugins/moe/toolkit.h"

namespace loom::moe {

class MoeLayer final : public ModuleBase<IMlp> {
 public:
  MoeLayer(const nlohmann::json& options, IBuildContext& ctx);
  ~MoeLayer() override;

 private:
  void run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                   TensorView* outputs, int32_t num_outputs) override;
  void run_backward(IForwardContext& ctx, const TensorView* grad_outputs, int32_t num_grad_outputs,
                    TensorView* grad_inputs, int32_t num_grad_inputs) override;

  IHost& host_;
  int64_t hidden_, experts_;
  double capacity_factor_ = 0;  // 0: dropless
  bool drop_by_probs_ = true;
  bool pad_ = false;  // pad_to_capacity
  DType dtype_;
  Device device_;
  IRouter* router_ = nullptr;           // children (owned through add_child)
  GroupedMlp* experts_module_ = nullptr;
  SharedExperts* shared_ = nullptr;
  IMoeDispatcher* dispatcher_ = nullptr;  // owned here
  Kernel add_;
  std::string layer_;                     // "layer_3", for metric names
};

}  // namespace loom::moe
