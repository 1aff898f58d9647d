// The machine's measured GEMM peak, for MFU. Model FLOPs come from the model (IModel::cost,
// model 1.1): the transformer plugin counts, per token, the formula of llm.c and of PaLM's
// appendix B with causal attention counted once,
//     6 * N  +  6 * L * T * C
// (N parameters, L layers, T the sequence length, C the attention width), and a model built
// against an older SDK is counted 6 N. MFU = model FLOPs per second / peak, where peak is
// what the device's own GEMM reaches on a transformer-shaped product (measured at start,
// not a datasheet figure).
#pragma once

#include "loom/host.h"

namespace loom::core {

/// Best FLOP/s of the f32 "gemm" kernel that `host` resolves on the CPU, on a
/// (1024 x 768) x (768 x 3072) product (GPT-2 small's MLP at 1024 tokens), best of 5
/// after a warm-up. Measured once per process.
double measure_gemm_peak(IHost& host);

}  // namespace loom::core
