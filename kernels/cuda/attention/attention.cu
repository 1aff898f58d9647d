// attention_fwd / attention_bwd on CUDA (loom/ops.h): the host side. Checks the call with
// the CPU kernels' checks (loom/cpp/op_checks/attention.h), then picks a path per call:
//   - tensor cores (attention_fwd.cu, attention_bwd.cu): bf16 or f16 with every tensor of
//     Q's dtype, D in {64, 128}, every pointer (and the workspace) 16-byte aligned and the
//     row strides of the views Q, K, V (dQ, dK, dV) multiples of 8 elements, so that every
//     row is 16-byte aligned too (cp.async and vector stores of 16 bytes);
//   - generic (attention_generic.cu): everything else the checks admit, D <= 4096, any
//     pointers and strides (element accesses).
// `supports` therefore accepts every valid call with D <= kAttentionGenericMaxD; alignment
// is a property of the pointers, which `supports` does not see, so it only picks the path.
// Nothing here synchronises the device: the kernels are queued on the call's stream.
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/attention.h>
#include <loom/cpp/philox.h>

#include <string>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/attention_params.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"

namespace loom::kernels::cuda {

namespace {

using op_checks::AttentionShape;

// Throws unless the generic kernels take this head dim (the only call they cannot serve).
void check_head_dim(const AttentionShape& s, const char* op) {
  if (s.d > kAttentionGenericMaxD)
    throw Error(Code::kInvalidArgument, std::string(op) + ": head dim D = " + std::to_string(s.d) +
                                            " exceeds the CUDA kernels' limit of " +
                                            std::to_string(kAttentionGenericMaxD) +
                                            "; use the CPU kernels");
}

RowStrides rows_of(const op_checks::RowStrides& r) { return {r.b_, r.t_, r.h_}; }

AttentionParams make_params(const AttentionShape& s) {
  AttentionParams p{};
  // Zero in the forward for dQ, dK, dV (the shape has none).
  p.q_rows = rows_of(s.q), p.k_rows = rows_of(s.k), p.v_rows = rows_of(s.v);
  p.dq_rows = rows_of(s.dq), p.dk_rows = rows_of(s.dk), p.dv_rows = rows_of(s.dv);
  p.b = s.b, p.t = s.t, p.s = s.s, p.h = s.h, p.g = s.g, p.d = s.d;
  p.group = s.h / s.g;  // the checks guarantee G > 0 and G | H
  p.scale = s.attrs.scale;
  p.causal = s.attrs.causal != 0;
  p.dropout = s.attrs.dropout_p > 0.0f;
  p.threshold = keep_threshold(s.attrs.dropout_p);
  p.keep_scale = 1.0f / (1.0f - s.attrs.dropout_p);
  p.key = s.attrs.key;
  p.counter = s.attrs.counter;
  p.q_offset = s.q_offset, p.k_offset = s.k_offset, p.q_total = s.q_total, p.k_total = s.k_total;
  return p;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Every row of a view with these row strides and `ptr` 16-byte aligned starts 16-byte aligned
// (16-bit elements): each stride along a dimension of more than one row is a multiple of 8
// (the stride of a dimension of extent 1 is never used).
bool rows_aligned16(const void* ptr, const RowStrides& r, int64_t b, int64_t t, int64_t h) {
  return aligned16(ptr) && (b <= 1 || r.b_ % 8 == 0) && (t <= 1 || r.t_ % 8 == 0) &&
         (h <= 1 || r.h_ % 8 == 0);
}

// Shapes and dtypes the tensor-core kernels take (pointers aside): D in {64, 128}, Q's dtype
// bf16 or f16, and the same dtype for every float tensor: the forward's inputs 0-2 and
// output 0 (lse is f32), the backward's inputs 0-4 and outputs 0-2.
bool tc_shapes(const OpCall* call, const AttentionShape& s, bool fwd) {
  const DType dt = call->inputs[fwd ? 0 : 1].dtype;
  if ((dt != DType::kBF16 && dt != DType::kF16) || !attention_tc_head_dim(s.d)) return false;
  const int float_inputs = fwd ? 3 : 5, float_outputs = fwd ? 1 : 3;
  for (int i = 0; i < float_inputs; ++i)
    if (call->inputs[i].dtype != dt) return false;
  for (int i = 0; i < float_outputs; ++i)
    if (call->outputs[i].dtype != dt) return false;
  return true;
}

// ---- attention_fwd -----------------------------------------------------------------------

Status attention_fwd_cuda(const OpCall* call) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_fwd(call, false, DeviceType::kCuda);
    check_head_dim(s, ops::kAttentionFwd);
    const TensorView *in = call->inputs, *out = call->outputs;
    AttentionParams p = make_params(s);
    p.q = in[0].data, p.k = in[1].data, p.v = in[2].data;
    p.seg = static_cast<const int32_t*>(in[3].data);
    p.kseg = s.key_segments >= 0 ? static_cast<const int32_t*>(in[s.key_segments].data) : p.seg;
    p.o = out[0].data, p.lse = static_cast<float*>(out[1].data);
    p.dt_q = in[0].dtype, p.dt_k = in[1].dtype, p.dt_v = in[2].dtype, p.dt_o = out[0].dtype;
    if (s.b * s.t * s.h == 0) return;  // no rows (O and lse are empty)
    const bool tc = tc_shapes(call, s, true) && rows_aligned16(p.q, p.q_rows, s.b, s.t, s.h) &&
                    rows_aligned16(p.k, p.k_rows, s.b, s.s, s.g) &&
                    rows_aligned16(p.v, p.v_rows, s.b, s.s, s.g) && aligned16(p.o);
    if (tc)
      launch_attention_fwd_tc(p, p.dt_q, stream_of(call));
    else
      launch_attention_fwd_generic(p, stream_of(call));
  });
}

bool attention_fwd_supports(const OpCall* call) {
  return check_passes([&] {
    check_head_dim(op_checks::check_attention_fwd(call, true, DeviceType::kCuda),
                   ops::kAttentionFwd);
  });
}

// Forward: Q K^T and P V, 2 flops per multiply-add (as the CPU kernels count).
Status attention_fwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_fwd(call, true, DeviceType::kCuda);
    *out = io_cost(call, 4.0 * op_checks::attention_pairs(s) * static_cast<double>(s.d));
  });
}

// ---- attention_bwd -----------------------------------------------------------------------

// The backward's parameters from the shapes alone, head splits included (the workspace
// depends on them; the call's device decides them).
AttentionParams bwd_params(const OpCall* call, const AttentionShape& s) {
  AttentionParams p = make_params(s);
  p.head_splits = attention_bwd_head_splits(p, multiprocessor_count(call->inputs[1].device.index));
  return p;
}

// The workspace of a checked call: dq_acc and dkv_acc when the shapes suit the tensor
// cores, then delta.
uint64_t bwd_workspace_bytes(const OpCall* call, const AttentionShape& s) {
  const AttentionParams p = bwd_params(call, s);
  const bool tc = tc_shapes(call, s, false);
  return attention_bwd_dq_acc_bytes(p, tc) + attention_bwd_dkv_acc_bytes(p, tc) +
         attention_bwd_delta_bytes(p);
}

uint64_t attention_bwd_workspace(const OpCall* call) {
  uint64_t bytes = 0;
  check_passes([&] {
    bytes =
        bwd_workspace_bytes(call, op_checks::check_attention_bwd(call, true, DeviceType::kCuda));
  });
  return bytes;
}

Status attention_bwd_cuda(const OpCall* call) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_bwd(call, false, DeviceType::kCuda);
    check_head_dim(s, ops::kAttentionBwd);
    const TensorView *in = call->inputs, *out = call->outputs;
    AttentionParams p = bwd_params(call, s);
    p.dout = in[0].data, p.q = in[1].data, p.k = in[2].data, p.v = in[3].data;
    p.out = in[4].data, p.lse_in = static_cast<const float*>(in[5].data);
    p.seg = static_cast<const int32_t*>(in[6].data);
    p.kseg = s.key_segments >= 0 ? static_cast<const int32_t*>(in[s.key_segments].data) : p.seg;
    p.dq = out[0].data, p.dk = out[1].data, p.dv = out[2].data;
    p.dt_do = in[0].dtype, p.dt_q = in[1].dtype, p.dt_k = in[2].dtype, p.dt_v = in[3].dtype;
    p.dt_o = in[4].dtype;
    p.dt_dq = out[0].dtype, p.dt_dk = out[1].dtype, p.dt_dv = out[2].dtype;

    const bool tc_ok = tc_shapes(call, s, false);
    const uint64_t need = bwd_workspace_bytes(call, s);
    if (need > 0 && (call->workspace == nullptr || call->workspace_bytes < need))
      throw Error(Code::kInvalidArgument,
                  std::string(ops::kAttentionBwd) + ": needs " + std::to_string(need) +
                      " bytes of workspace (its KernelDesc's workspace function), got " +
                      std::to_string(call->workspace == nullptr ? 0 : call->workspace_bytes));
    if (need > 0 && reinterpret_cast<uintptr_t>(call->workspace) % 4 != 0)
      throw Error(Code::kInvalidArgument,
                  std::string(ops::kAttentionBwd) + ": the workspace must be 4-byte aligned");
    char* ws = static_cast<char*>(call->workspace);
    p.delta = reinterpret_cast<float*>(ws + attention_bwd_dq_acc_bytes(p, tc_ok) +
                                       attention_bwd_dkv_acc_bytes(p, tc_ok));
    if (s.b * s.s * s.g == 0 && s.b * s.t * s.h == 0) return;  // every output is empty
    const bool tc = tc_ok && aligned16(ws) && aligned16(p.dout) &&
                    rows_aligned16(p.q, p.q_rows, s.b, s.t, s.h) &&
                    rows_aligned16(p.k, p.k_rows, s.b, s.s, s.g) &&
                    rows_aligned16(p.v, p.v_rows, s.b, s.s, s.g) &&
                    rows_aligned16(p.dq, p.dq_rows, s.b, s.t, s.h) &&
                    rows_aligned16(p.dk, p.dk_rows, s.b, s.s, s.g) &&
                    rows_aligned16(p.dv, p.dv_rows, s.b, s.s, s.g);
    if (tc) {
      p.dq_acc = reinterpret_cast<float*>(ws);
      p.dkv_acc = p.head_splits > 1
                      ? reinterpret_cast<float*>(ws + attention_bwd_dq_acc_bytes(p, true))
                      : nullptr;
      launch_attention_bwd_tc(p, p.dt_q, stream_of(call));
    } else {
      p.dq_acc = nullptr;
      launch_attention_bwd_generic(p, stream_of(call));
    }
  });
}

bool attention_bwd_supports(const OpCall* call) {
  return check_passes([&] {
    check_head_dim(op_checks::check_attention_bwd(call, true, DeviceType::kCuda),
                   ops::kAttentionBwd);
  });
}

// Backward: dV, dP, dQ, dK (the recomputation of Q K^T is not model work).
Status attention_bwd_cost(const OpCall* call, OpCost* out) {
  return guard([&] {
    AttentionShape s = op_checks::check_attention_bwd(call, true, DeviceType::kCuda);
    *out = io_cost(call, 8.0 * op_checks::attention_pairs(s) * static_cast<double>(s.d));
  });
}

}  // namespace

void add_attention_kernels(std::vector<KernelDesc>& out) {
  add_cuda_kernels(out, ops::kAttentionFwd, attention_fwd_cuda, attention_fwd_supports,
                   attention_fwd_cost);
  add_cuda_kernels(out, ops::kAttentionBwd, attention_bwd_cuda, attention_bwd_supports,
                   attention_bwd_cost, {DType::kF32, DType::kBF16, DType::kF16}, kCudaName,
                   kCudaPriority, attention_bwd_workspace);
}

}  // namespace loom::kernels::cuda
