// Model FLOPs and the machine's measured GEMM peak, for MFU.
//
// Model FLOPs per token (the formula of llm.c and of PaLM's appendix B, with causal
// attention counted once):
//     6 * N  +  6 * L * T * C
// where N is the number of parameters (tied embeddings counted once), L the number of
// layers, T the sequence length and C the attention width (heads * head dim). The first
// term is the forward (2N) and backward (4N) of every weight matrix; the second is
// Q K^T and P V over the causal half of the (T, T) scores, forward and backward.
// MFU = model FLOPs per second / peak, where peak is what the device's own GEMM reaches
// on a transformer-shaped product (measured at start, not a datasheet figure).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "loom/host.h"

namespace loom::core {

/// Model FLOPs per token from the formula above. `model` is the spec's model node; L and C
/// come from its num_layers, and kv_channels * num_attention_heads (default hidden_size);
/// a model node without them counts only 6N.
double model_flops_per_token(int64_t num_params, const nlohmann::json& model, int64_t seq_length);

/// Best FLOP/s of the f32 "gemm" kernel that `host` resolves on the CPU, on a
/// (1024 x 768) x (768 x 3072) product (GPT-2 small's MLP at 1024 tokens), best of 5
/// after a warm-up. Measured once per process.
double measure_gemm_peak(IHost& host);

}  // namespace loom::core
