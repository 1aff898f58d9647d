// Shapes, checks and cost of attention_fwd / attention_bwd, shared by the reference
// (attention.cc) and the fused kernel (flash_attention.cc). The argument checks and shape
// helpers live in the SDK (loom/cpp/op_checks/attention.h) so that every device refuses a
// bad call with the same words.
#pragma once

#include <loom/cpp/op_checks/attention.h>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {

using op_checks::attention_dropout_index;
using op_checks::attention_key_limit;
using op_checks::AttentionShape;

bool attention_fwd_supports(const OpCall* call);
bool attention_bwd_supports(const OpCall* call);
Status attention_fwd_cost(const OpCall* call, OpCost* out);
Status attention_bwd_cost(const OpCall* call, OpCost* out);

}  // namespace loom::kernels::cpu
