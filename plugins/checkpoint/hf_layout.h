// Where each loom weight lives in a Hugging Face checkpoint, and how it is laid out there.
//
// A loom tensor (row-major, rows on dimension 0; a 1-D tensor has rows of one element) is a
// stack of row blocks, each taken from a Hugging Face tensor: rows [src_row, src_row + rows)
// of it, or, for a transposed block, its columns (GPT-2's Conv1D weights are stored (in,
// out), loom's (out, in) like nn.Linear). The same blocks serve both directions, so an
// export followed by an import is the identity.
//
//   GPT-2   linear_qkv (3C, C) in Megatron's grouped layout (per head h: q_h, k_h, v_h rows)
//           <- c_attn.weight (C, 3C) columns [q | k | v], each in head order
//   LLaMA   linear_qkv (G*(H/G+2)*D, C), per group g: H/G query heads, k_g, v_g
//           <- q_proj (H*D, C), k_proj (G*D, C), v_proj (G*D, C)
//           linear_fc1 (2, F, C) = [gate; up] <- gate_proj (F, C), up_proj (F, C)
//   Mixtral LLaMA's, with per layer block_sparse_moe.gate (E, C) -> mlp.router.weight and
//           expert g's w1 (gate), w3 (up) -> experts.linear_fc1.weight{g} (2, F, C), w2 ->
//           experts.linear_fc2.weight{g} (C, F)
//   Qwen2-MoE  LLaMA's plus q/k/v_proj.bias -> linear_qkv.bias (grouped as the weight); a
//           sparse layer's mlp.gate -> mlp.router.weight, mlp.experts.{g}.gate/up/down_proj ->
//           experts.linear_fc1/fc2.weight{g}, mlp.shared_expert.* -> shared_experts.linear_fc1
//           / fc2, mlp.shared_expert_gate.weight (1, C) -> shared_experts.gate_weight; a dense
//           layer's mlp.gate/up/down_proj as LLaMA's. What loom lacks of it (q/k/v biases, a
//           shared expert) is exported as zeros (HfLayout::zeros): the same function.
//   Qwen3-MoE  Qwen2-MoE's without biases and shared expert, plus self_attn.q_norm.weight /
//           k_norm.weight (D) -> self_attention.q_layernorm.weight / k_layernorm.weight
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plugins/checkpoint/hf_model.h"

namespace loom::checkpoint {

/// Rows [row, row + rows) of a loom tensor are rows (or columns when `transposed`)
/// [src_row, src_row + rows) of the Hugging Face tensor `hf`.
struct RowBlock {
  std::string hf;
  int64_t row = 0, src_row = 0, rows = 0;
  bool transposed = false;
};

/// One loom model weight ("decoder.layers.0.mlp.linear_fc1.weight", without "model.").
struct TensorLayout {
  std::string loom;
  std::vector<int64_t> shape;
  std::vector<RowBlock> blocks;
};

/// Every weight of a model and every Hugging Face tensor they make up.
struct HfLayout {
  std::vector<TensorLayout> tensors;
  std::map<std::string, std::vector<int64_t>> hf_shapes;  ///< HF name -> shape
  /// The prefix transformers may leave out of names in a file ("transformer." for GPT-2
  /// checkpoints saved from GPT2Model, "model." for LLaMA).
  std::string base_prefix;
  /// Hugging Face tensors (in hf_shapes) with no loom counterpart, written as zeros by the
  /// export and not read by the import: Qwen2-MoE's q/k/v biases and its shared expert
  /// (width 0) when loom's model has none.
  std::vector<std::string> zeros;
  const TensorLayout* find(const std::string& loom_name) const;
};

/// The layout of `model` (names with the canonical LMHead prefixes).
HfLayout hf_layout(const HfModel& model);

/// Copies block `b` between a loom tensor `loom` of `loom_shape` and the Hugging Face tensor
/// `hf` of `hf_shape`, both row-major with elements of `elem` bytes: into `loom` when
/// `to_loom`, else into `hf`.
void copy_block(const RowBlock& b, const std::vector<int64_t>& loom_shape,
                const std::vector<int64_t>& hf_shape, size_t elem, unsigned char* loom,
                unsigned char* hf, bool to_loom);

}  // namespace loom::checkpoint
