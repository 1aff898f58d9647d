// add_layernorm_fwd / add_layernorm_bwd and add_rmsnorm_fwd / add_rmsnorm_bwd: the residual
// add fused into the norm after it (loom/ops.h).
//   fwd: Z = X + R (rounded to the dtype); Y, mean, rstd = norm(Z)
//   bwd: dX = norm_bwd(dY, Z) (rounded to the dtype) + dZ
//
// On the CPU fusing saves nothing worth its code (the rows stream through cache either way),
// so both kernels run the unfused sequence, which the contract allows and which keeps every
// CPU result bit for bit what the unfused ops give: "cpu.ref" runs the reference kernel of
// each step, "cpu.fast" the fast one (as a module resolving the unfused ops gets them).
#include <loom/cpp/op_checks/norms.h>

#include <vector>

#include "kernels/cpu/common.h"

namespace loom::kernels::cpu {
namespace {

using op_checks::NormShape;

template <bool kRms>
NormShape check_fwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_add_norm_fwd<kRms>(call, shapes_only, DeviceType::kCpu);
}
template <bool kRms>
NormShape check_bwd(const OpCall* call, bool shapes_only) {
  return op_checks::check_add_norm_bwd<kRms>(call, shapes_only, DeviceType::kCpu);
}

// add then norm: Z may alias X or R (add allows it; the norm reads only Z).
template <bool kRms>
void run_fwd(const OpCall* call, bool fast) {
  NormShape s = check_fwd<kRms>(call, false);
  const TensorView* in = call->inputs;
  const TensorView* out = call->outputs;
  const DType dt = in[0].dtype;
  run_library_op<int>(ops::kAdd, dt, fast, {in[0], in[1]}, {out[1]}, nullptr);
  if constexpr (kRms)
    run_library_op(ops::kRmsNormFwd, dt, fast, {out[1], in[2]}, {out[0], out[2]}, &s.attrs);
  else
    run_library_op(ops::kLayerNormFwd, dt, fast, {out[1], in[2], in[3]}, {out[0], out[2], out[3]},
                   &s.attrs);
}

// norm backward into dX, then dX += dZ (dX aliases no input: the checks refuse dX == dZ).
template <bool kRms>
void run_bwd(const OpCall* call, bool fast) {
  NormShape s = check_bwd<kRms>(call, false);
  const TensorView* in = call->inputs;
  const TensorView* out = call->outputs;
  const DType dt = in[1].dtype;
  if constexpr (kRms)
    run_library_op(ops::kRmsNormBwd, dt, fast, {in[0], in[1], in[2], in[3]}, {out[0], out[1]},
                   &s.attrs);
  else
    run_library_op(ops::kLayerNormBwd, dt, fast, {in[0], in[1], in[2], in[3], in[4]},
                   {out[0], out[1], out[2]}, &s.attrs);
  run_library_op<int>(ops::kAdd, dt, fast, {out[0], in[kRms ? 4 : 5]}, {out[0]}, nullptr);
}

Status add_layernorm_fwd_ref(const OpCall* c) {
  return guard([&] { run_fwd<false>(c, false); });
}
Status add_layernorm_fwd_fast(const OpCall* c) {
  return guard([&] { run_fwd<false>(c, true); });
}
Status add_layernorm_bwd_ref(const OpCall* c) {
  return guard([&] { run_bwd<false>(c, false); });
}
Status add_layernorm_bwd_fast(const OpCall* c) {
  return guard([&] { run_bwd<false>(c, true); });
}
Status add_rmsnorm_fwd_ref(const OpCall* c) {
  return guard([&] { run_fwd<true>(c, false); });
}
Status add_rmsnorm_fwd_fast(const OpCall* c) {
  return guard([&] { run_fwd<true>(c, true); });
}
Status add_rmsnorm_bwd_ref(const OpCall* c) {
  return guard([&] { run_bwd<true>(c, false); });
}
Status add_rmsnorm_bwd_fast(const OpCall* c) {
  return guard([&] { run_bwd<true>(c, true); });
}

// The norms' counts plus one flop per element for the add.
LOOM_CPU_HOOKS(add_layernorm_fwd, check_fwd<false>, 9)
LOOM_CPU_HOOKS(add_layernorm_bwd, check_bwd<false>, 15)
LOOM_CPU_HOOKS(add_rmsnorm_fwd, check_fwd<true>, 5)
LOOM_CPU_HOOKS(add_rmsnorm_bwd, check_bwd<true>, 9)

}  // namespace

void add_add_norm_kernels(std::vector<KernelDesc>& out) {
  LOOM_CPU_REGISTER(out, ops::kAddLayerNormFwd, add_layernorm_fwd);
  LOOM_CPU_REGISTER(out, ops::kAddLayerNormBwd, add_layernorm_bwd);
  LOOM_CPU_REGISTER(out, ops::kAddRmsNormFwd, add_rmsnorm_fwd);
  LOOM_CPU_REGISTER(out, ops::kAddRmsNormBwd, add_rmsnorm_bwd);
}

}  // namespace loom::kernels::cpu
