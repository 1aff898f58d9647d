// attention_fwd / attention_bwd through cuDNN's SDPA graphs (cudnn_attention.h says when
// cuDNN runs a call and when loom's own kernel does). Host code only: cuDNN launches the
// kernels on the call's stream; nothing here synchronises the device.
//
// Layouts as cuDNN sees loom's tensors (dims in cuDNN's (B, H, S, D) order, strides of
// loom's (B, S, H, D) storage):
//   O, dO         (B, H, T, D)  strides (T*H*D, D, H*D, 1)
//   Q, dQ         (B, H, T, D)  strides (sb, sh, st, 1) of the view's rows
//   K, V, dK, dV  (B, G, S, D)  strides (sb, sh, st, 1) of the view's rows
//   lse / Stats   (B, H, T, 1)  strides (H*T, T, 1, 1), f32
// Q, K, V, dQ, dK and dV may be strided views (op_checks::RowStrides: e.g. of one fused QKV
// projection); packed ones have strides (T*H*D, H*D, D), (S*G*D, G*D, D).
#include "kernels/cuda/attention/cudnn_attention.h"

#include <cudnn.h>
#include <nvrtc.h>

// cudnn-frontend's experimental SM100 engines call NVRTC, which attention never reaches:
// weak references keep libnvrtc out of the plugin's load-time dependencies (the symbols
// resolve to null unless something else loads NVRTC).
#pragma weak nvrtcCreateProgram
#pragma weak nvrtcDestroyProgram
#pragma weak nvrtcCompileProgram
#pragma weak nvrtcGetProgramLogSize
#pragma weak nvrtcGetProgramLog
#pragma weak nvrtcGetCUBINSize
#pragma weak nvrtcGetCUBIN

#include <cudnn_frontend.h>
#include <loom/cpp/error.h>
#include <loom/cpp/op_args.h>
#include <loom/cpp/op_checks/attention.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/env_choice.h"
#include "kernels/cuda/common/registration.h"
#include "kernels/cuda/common/resources.cuh"

namespace loom::kernels::cuda {
namespace {

namespace fe = cudnn_frontend;
using op_checks::AttentionShape;
using op_checks::RowStrides;

enum class Pass { kFwd, kBwd };

// Tensor uids of the graphs' variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

inline constexpr int64_t kMinCudnnVersion = 90000;  // 9.0.0
inline constexpr int kHopper = 90;

// ---- loom's own kernels, which serve every call cuDNN does not ---------------------------

const KernelDesc& own_kernel(const char* op, DType dt) {
  static const std::vector<KernelDesc> descs = [] {
    std::vector<KernelDesc> v;
    add_attention_kernels(v);
    return v;
  }();
  for (const KernelDesc& k : descs)
    if (std::strcmp(k.op, op) == 0 && k.dtype == dt) return k;
  throw Error(Code::kInternal, std::string(op) + ": loom's own CUDA kernel for " + dtype_name(dt) +
                                   " is missing (cuda.cudnn falls back to it)");
}

// ---- counters ------------------------------------------------------------------------------

std::atomic<int64_t> g_cudnn_calls{0}, g_fallback_calls{0};
std::mutex g_decline_mutex;
std::string g_last_decline;

void note_fallback(const std::string& why) {
  g_fallback_calls.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_decline_mutex);
  g_last_decline = why;
}

// ---- eligibility from shapes and attributes ----------------------------------------------

bool contiguous(const TensorView& v) {
  int64_t expect = 1;
  for (int32_t i = v.ndim - 1; i >= 0; --i) {
    if (v.shape[i] != 1 && v.strides[i] != expect) return false;
    expect *= v.shape[i];
  }
  return true;
}

// Every stride of 2-byte elements along a dimension of more than one element is a multiple of
// 16 bytes (or the element stride 1).
bool strides_aligned16(const TensorView& v) {
  for (int32_t i = 0; i < v.ndim; ++i)
    if (v.shape[i] > 1 && v.strides[i] != 1 && v.strides[i] % 8 != 0) return false;
  return true;
}

// Why cuDNN cannot serve `call` ("" when it can, then *out holds the checked shape), from
// shapes, dtypes, attributes and the device alone (pointers may be null).
std::string ineligible(const OpCall* call, Pass pass, DType dt, AttentionShape* out) {
  AttentionShape s{};
  try {
    s = pass == Pass::kFwd ? op_checks::check_attention_fwd(call, true, DeviceType::kCuda)
                           : op_checks::check_attention_bwd(call, true, DeviceType::kCuda);
  } catch (...) {
    return "the call fails loom's checks (loom's kernel reports why)";
  }
  if (call->attrs_size != sizeof(ops::AttentionAttrs))
    return "AttentionBlockAttrs (a context-parallel block)";
  if (s.attrs.dropout_p != 0.0f) return "dropout_p > 0 (cuDNN's random numbers are not loom's)";
  // Segment ids (the queries', then optionally the keys'): an absent one is a view with null
  // data and no dimensions (op_args.h).
  const int seg = pass == Pass::kFwd ? 3 : 6;
  for (int i = seg; i < call->num_inputs && i <= seg + 1; ++i)
    if (call->inputs[i].data != nullptr || call->inputs[i].ndim > 0) return "segment ids";
  if (s.d % 8 != 0 || s.d > 128) return "head dim " + std::to_string(s.d) + " (needs 8 | D <= 128)";
  if (s.b < 1 || s.t < 1 || s.s < 1 || s.h < 1 || s.g < 1) return "an empty dimension";
  if (s.attrs.causal != 0 && s.t > s.s) return "causal with T > S (fully masked rows)";
  // The float tensors: the forward's Q, K, V and O, the backward's dO, Q, K, V, O and dQ,
  // dK, dV; every one of dtype dt. O and dO contiguous, lse f32 and contiguous. Q, K, V, dQ,
  // dK, dV may be views with strided rows (the checks saw their last dimension packed), but
  // cuDNN moves 16 bytes at a time (vector loads, TMA) and needs every stride a multiple of
  // 16 bytes: cudnn-frontend's validate refuses others, declined here with loom's reason.
  const int float_in = pass == Pass::kFwd ? 3 : 5, float_out = pass == Pass::kFwd ? 1 : 3;
  const TensorView& lse = pass == Pass::kFwd ? call->outputs[1] : call->inputs[5];
  auto rows_view = [&](bool input, int i) {
    return pass == Pass::kFwd ? input && i < 3 : (input ? i >= 1 && i <= 3 : true);
  };
  for (int side = 0; side < 2; ++side) {
    const bool input = side == 0;
    for (int i = 0; i < (input ? float_in : float_out); ++i) {
      const TensorView& v = input ? call->inputs[i] : call->outputs[i];
      const std::string what = std::string(input ? "input " : "output ") + std::to_string(i);
      if (v.dtype != dt) return what + " is not " + dtype_name(dt);
      if (!rows_view(input, i) && !contiguous(v)) return what + " is not contiguous";
      if (rows_view(input, i) && !strides_aligned16(v))
        return what + " has a row stride that is not a multiple of 8 elements";
    }
  }
  if (lse.dtype != DType::kF32 || !contiguous(lse)) return "lse is not contiguous f32";
  const int device = call->inputs[0].device.index;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) {
    cudaGetLastError();
    return "the tensors are not on the current device";
  }
  const int cc = compute_capability(device);
  if (cc != kHopper) return "compute capability " + std::to_string(cc) + " (cuDNN path: 90 only)";
  if (cudnn_runtime_version() < kMinCudnnVersion)
    return "cuDNN " + std::to_string(cudnn_runtime_version()) + " < 9.0";
  *out = s;
  return "";
}

// ---- handles and graphs ------------------------------------------------------------------

// One handle per device, created on first use and never destroyed (a CUDA object destroyed
// after the runtime has shut down, at exit, crashes; resources.cuh), and bound to the call's
// stream for each execution. Neither the handle nor the graphs depend on the stream, so a
// CUDA graph capture (on a stream of its own) executes the graphs built on the compute
// stream in the warm-up, and creates or builds nothing inside the capture.
struct GraphEntry {
  std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN rejected the key
  int64_t workspace = 0;
  std::string unsupported;  // cuDNN's reason when it rejected the key
  bool tuned = false;       // measured_plans(): the plans have been timed (or tried to be)
};
// (pass, device, B, T, S, H, G, D, dtype, causal, scale bits, the row strides of Q, K, V,
// dQ, dK, dV): no stream, see handle_for. The strides are the graph's: a graph built for
// packed tensors must not run strided ones.
using GraphKey = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                            int, uint32_t, std::array<int64_t, 18>>;

std::mutex g_mutex;
std::map<int, cudnnHandle_t> g_handles;
std::map<GraphKey, std::shared_ptr<GraphEntry>> g_graphs;

// The handle of `device`, bound to `stream`; caller holds g_mutex (and keeps it until the
// execution the binding is for has been issued).
cudnnHandle_t handle_for(int device, cudaStream_t stream, std::string* why) {
  auto it = g_handles.find(device);
  cudnnHandle_t h = it != g_handles.end() ? it->second : nullptr;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if (h == nullptr) {
    st = cudnnCreate(&h);
    if (st == CUDNN_STATUS_SUCCESS) g_handles.emplace(device, h);
  }
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(h, stream);
  if (st != CUDNN_STATUS_SUCCESS) {
    *why = std::string("cudnnCreate / cudnnSetStream: ") + cudnnGetErrorString(st);
    return nullptr;
  }
  return h;
}

fe::DataType_t fe_dtype(DType dt) {
  return dt == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// cuDNN's (B, heads, T, D) strides of a (B, T, heads, D) tensor with row strides r.
std::vector<int64_t> bhsd_stride(const RowStrides& r) { return {r.b_, r.h_, r.t_, 1}; }

// A (B, T, heads, D) tensor with row strides r as cuDNN's (B, heads, T, D) dims with strides.
std::shared_ptr<fe::graph::Tensor_attributes> bshd(fe::graph::Graph& g, const char* name, Uid uid,
                                                   int64_t b, int64_t heads, int64_t t, int64_t d,
                                                   const RowStrides& r) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({b, heads, t, d})
                      .set_stride(bhsd_stride(r)));
}
// Q-shaped (B, T, H, D) and K-shaped (B, S, G, D) tensors of the call with row strides r.
std::shared_ptr<fe::graph::Tensor_attributes> q_like(fe::graph::Graph& g, const char* name, Uid uid,
                                                     const AttentionShape& s, const RowStrides& r) {
  return bshd(g, name, uid, s.b, s.h, s.t, s.d, r);
}
std::shared_ptr<fe::graph::Tensor_attributes> k_like(fe::graph::Graph& g, const char* name, Uid uid,
                                                     const AttentionShape& s, const RowStrides& r) {
  return bshd(g, name, uid, s.b, s.g, s.s, s.d, r);
}

// loom's causal mask hides key s from query t when s > t + (S - T): cuDNN's bottom-right
// alignment. With T == S that is the top-left mask too, the one PyTorch's and
// TransformerEngine's "causal" ask for (set_causal_mask), and the graph then says
// top-left: the same mask, in the form cuDNN's most used engines are built and tuned for.
// LOOM_CUDNN_CAUSAL=bottom_right keeps the bottom-right form for T == S as well, to measure
// one against the other (tools/gpu_bundle_run.sh's attention_bench rows).
bool causal_top_left(const AttentionShape& s) {
  static const bool always_bottom_right =
      env_choice("attention", "LOOM_CUDNN_CAUSAL", {"auto", "bottom_right"}) == 1;
  return s.t == s.s && !always_bottom_right;
}

template <class Attributes>
void set_causal(Attributes& opts, const AttentionShape& s) {
  if (causal_top_left(s))
    opts.set_causal_mask(true);
  else
    opts.set_causal_mask_bottom_right(true);
}

// LOOM_CUDNN_PLANS=measured: each graph builds every execution plan of cuDNN's heuristic
// (BuildPlanPolicy_t::ALL, not only its first), and its first call outside a CUDA graph capture
// times them all on the call's own tensors (cudnn-frontend's autotune, which synchronises the
// device and writes the call's outputs, which the call then writes again) and keeps the
// fastest; the workspace is then the largest plan's. Unset ("heuristic"): the heuristic's first
// plan, as before. Like LOOM_GEMM_ALGO (gemm/cublaslt.cuh), a choice by timing that two runs
// may make differently.
bool measured_plans() {
  static const bool measured =
      env_choice("attention", "LOOM_CUDNN_PLANS", {"heuristic", "measured"}) == 1;
  return measured;
}

// Builds the graph of one pass; "" on success, else cuDNN's reason.
std::string build_graph(Pass pass, DType dt, const AttentionShape& s, cudnnHandle_t handle,
                        GraphEntry* e) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_dtype(dt))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const RowStrides packed_q = RowStrides::packed(s.t, s.h, s.d);  // O and dO
  auto q = q_like(*g, "Q", kQ, s, s.q);
  auto k = k_like(*g, "K", kK, s, s.k);
  auto v = k_like(*g, "V", kV, s, s.v);
  const bool causal = s.attrs.causal != 0;
  if (pass == Pass::kFwd) {
    auto opts = fe::graph::SDPA_attributes().set_name("loom_sdpa_fwd").set_generate_stats(true);
    opts.set_attn_scale(s.attrs.scale);
    if (causal) set_causal(opts, s);
    auto [o, stats] = g->sdpa(q, k, v, opts);
    o->set_output(true).set_uid(kO).set_dim({s.b, s.h, s.t, s.d}).set_stride(bhsd_stride(packed_q));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.b, s.h, s.t, 1})
        .set_stride({s.h * s.t, s.t, 1, 1});
  } else {
    auto o = q_like(*g, "O", kO, s, packed_q);
    auto dout = q_like(*g, "dO", kDO, s, packed_q);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim({s.b, s.h, s.t, 1})
                               .set_stride({s.h * s.t, s.t, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes().set_name("loom_sdpa_bwd");
    opts.set_attn_scale(s.attrs.scale);
    if (causal) set_causal(opts, s);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
    dq->set_output(true).set_uid(kDQ).set_dim({s.b, s.h, s.t, s.d}).set_stride(bhsd_stride(s.dq));
    dk->set_output(true).set_uid(kDK).set_dim({s.b, s.g, s.s, s.d}).set_stride(bhsd_stride(s.dk));
    dv->set_output(true).set_uid(kDV).set_dim({s.b, s.g, s.s, s.d}).set_stride(bhsd_stride(s.dv));
  }
  auto failed = [](const char* step, fe::error_t err) {
    return std::string(step) + ": " + err.get_message();
  };
  if (auto err = g->validate(); err.is_bad()) return failed("validate", err);
  if (auto err = g->build_operation_graph(handle); err.is_bad())
    return failed("build_operation_graph", err);
  if (auto err = g->create_execution_plans({fe::HeurMode_t::A}); err.is_bad())
    return failed("create_execution_plans", err);
  if (auto err = g->check_support(handle); err.is_bad()) return failed("check_support", err);
  const bool all = measured_plans();
  if (auto err = g->build_plans(
          handle, all ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
      err.is_bad())
    return failed("build_plans", err);
  int64_t ws = 0;
  if (all) {
    ws = g->get_autotune_workspace_size();  // the largest plan's, which autotune needs
  } else if (auto err = g->get_workspace_size(ws); err.is_bad() || ws < 0) {
    return failed("get_workspace_size", err);
  }
  if (ws < 0) return "get_workspace_size: negative";
  e->graph = std::move(g);
  e->workspace = ws;
  return "";
}

// The cached graph of a checked call on the current device, and the device's handle bound
// to the call's stream (built on first use; a key cuDNN rejects is cached as unsupported).
// Null with *why set when cuDNN cannot serve it. Caller holds g_mutex.
std::shared_ptr<GraphEntry> graph_for(const OpCall* call, Pass pass, DType dt,
                                      const AttentionShape& s, cudnnHandle_t* handle,
                                      std::string* why) {
  const int device = call->inputs[0].device.index;
  cudaStream_t stream = stream_of(call);
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &s.attrs.scale, sizeof(scale_bits));
  std::array<int64_t, 18> strides{};
  int i = 0;
  for (const RowStrides* r : {&s.q, &s.k, &s.v, &s.dq, &s.dk, &s.dv})
    for (int64_t x : {r->b_, r->t_, r->h_}) strides[i++] = x;
  GraphKey key{
      static_cast<int>(pass), device,     s.b,    s.t, s.s, s.h, s.g, s.d, static_cast<int>(dt),
      s.attrs.causal != 0,    scale_bits, strides};
  *handle = handle_for(device, stream, why);
  if (*handle == nullptr) return nullptr;
  auto it = g_graphs.find(key);
  if (it == g_graphs.end()) {
    auto e = std::make_shared<GraphEntry>();
    try {
      e->unsupported = build_graph(pass, dt, s, *handle, e.get());
    } catch (const std::exception& ex) {
      e->unsupported = std::string("cudnn-frontend threw: ") + ex.what();
    } catch (...) {
      e->unsupported = "cudnn-frontend threw";
    }
    if (!e->unsupported.empty()) e->graph.reset();
    it = g_graphs.emplace(key, std::move(e)).first;
  }
  if (it->second->graph == nullptr) {
    *why = "cuDNN rejects the graph: " + it->second->unsupported;
    return nullptr;
  }
  return it->second;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// measured_plans(): times the graph's plans once, on the call's tensors, unless the call's
// stream is capturing a CUDA graph (then a later direct call does it). A failed timing keeps
// the heuristic's plan. One line to stderr says what was timed.
void tune_plans(Pass pass, DType dt, const AttentionShape& s, cudnnHandle_t handle,
                std::unordered_map<int64_t, void*>& pack, void* workspace, const OpCall* call,
                GraphEntry* e) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_of(call), &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone)
    return;
  e->tuned = true;
  const int64_t plans = e->graph->get_execution_plan_count();
  std::string result;
  try {
    fe::error_t err = e->graph->autotune(handle, pack, workspace);
    result = err.is_bad() ? "timing failed, the heuristic's plan kept: " + err.get_message()
                          : "the fastest kept";
  } catch (const std::exception& ex) {
    result = std::string("timing threw, the heuristic's plan kept: ") + ex.what();
  }
  std::fprintf(stderr,
               "%s %s: LOOM_CUDNN_PLANS=measured: %lld plan(s) of cuDNN's heuristic timed for "
               "(B %lld, T %lld, S %lld, H %lld, G %lld, D %lld): %s\n",
               pass == Pass::kFwd ? ops::kAttentionFwd : ops::kAttentionBwd, dtype_name(dt),
               static_cast<long long>(plans), static_cast<long long>(s.b),
               static_cast<long long>(s.t), static_cast<long long>(s.s),
               static_cast<long long>(s.h), static_cast<long long>(s.g),
               static_cast<long long>(s.d), result.c_str());
}

// Runs `call` on cuDNN; "" when it did, else why not (then nothing was written).
std::string try_cudnn(const OpCall* call, Pass pass, DType dt) {
  AttentionShape s{};
  std::string why = ineligible(call, pass, dt, &s);
  if (!why.empty()) return why;
  cudnnHandle_t handle = nullptr;
  // Held until the execution is issued: the handle is bound to this call's stream.
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<GraphEntry> e = graph_for(call, pass, dt, s, &handle, &why);
  if (e == nullptr) return why;
  const TensorView *in = call->inputs, *out = call->outputs;
  std::unordered_map<int64_t, void*> pack;
  if (pass == Pass::kFwd) {
    pack = {{kQ, in[0].data},
            {kK, in[1].data},
            {kV, in[2].data},
            {kO, out[0].data},
            {kStats, out[1].data}};
  } else {
    pack = {{kDO, in[0].data},  {kQ, in[1].data},   {kK, in[2].data},
            {kV, in[3].data},   {kO, in[4].data},   {kStats, in[5].data},
            {kDQ, out[0].data}, {kDK, out[1].data}, {kDV, out[2].data}};
  }
  for (const auto& [uid, ptr] : pack)
    if (ptr == nullptr || !aligned16(ptr)) return "a tensor is null or not 16-byte aligned";
  if (e->workspace > 0 &&
      (call->workspace == nullptr || call->workspace_bytes < static_cast<uint64_t>(e->workspace) ||
       !aligned16(call->workspace)))
    return "the call's workspace (" + std::to_string(call->workspace_bytes) +
           " bytes) is smaller than cuDNN's " + std::to_string(e->workspace);
  void* workspace = e->workspace > 0 ? call->workspace : nullptr;
  if (measured_plans() && !e->tuned)
    tune_plans(pass, dt, s, handle, pack, workspace, call, e.get());
  fe::error_t err;
  try {
    err = e->graph->execute(handle, pack, workspace);
  } catch (const std::exception& ex) {
    return std::string("cudnn-frontend execute threw: ") + ex.what();
  }
  if (err.is_bad()) return std::string("cuDNN execute failed: ") + err.get_message();
  g_cudnn_calls.fetch_add(1, std::memory_order_relaxed);
  return "";
}

// ---- KernelDesc functions --------------------------------------------------------------------

const char* op_name(Pass pass) {
  return pass == Pass::kFwd ? ops::kAttentionFwd : ops::kAttentionBwd;
}

template <Pass P, DType Dt>
Status cudnn_attention(const OpCall* call) {
  const KernelDesc* own = nullptr;
  std::string why;
  Status st = guard([&] {
    own = &own_kernel(op_name(P), Dt);
    why = try_cudnn(call, P, Dt);
  });
  if (st.code != Code::kOk) return st;
  if (why.empty()) return st;
  note_fallback(std::string(op_name(P)) + " " + dtype_name(Dt) + ": " + why);
  return own->fn(call);
}

template <Pass P, DType Dt>
bool cudnn_attention_supports(const OpCall* call) {
  try {
    const KernelDesc& own = own_kernel(op_name(P), Dt);
    return own.supports == nullptr || own.supports(call);
  } catch (...) {
    return false;
  }
}

template <Pass P, DType Dt>
Status cudnn_attention_cost(const OpCall* call, OpCost* out) {
  const KernelDesc* own = nullptr;
  Status st = guard([&] { own = &own_kernel(op_name(P), Dt); });
  if (st.code != Code::kOk) return st;
  return own->cost != nullptr ? own->cost(call, out) : st;
}

// The larger of loom's kernel's workspace (for a fallback) and cuDNN's (building the graph
// when the call is eligible; a call that is not gets loom's).
template <Pass P, DType Dt>
uint64_t cudnn_attention_workspace(const OpCall* call) {
  try {
    const KernelDesc& own = own_kernel(op_name(P), Dt);
    uint64_t bytes = own.workspace != nullptr ? own.workspace(call) : 0;
    AttentionShape s{};
    if (!ineligible(call, P, Dt, &s).empty()) return bytes;
    cudnnHandle_t handle = nullptr;
    std::string why;
    std::lock_guard<std::mutex> lock(g_mutex);
    std::shared_ptr<GraphEntry> e = graph_for(call, P, Dt, s, &handle, &why);
    if (e != nullptr) bytes = std::max(bytes, static_cast<uint64_t>(e->workspace));
    return bytes;
  } catch (...) {
    return 0;
  }
}

template <Pass P, DType Dt>
void add_one(std::vector<KernelDesc>& out) {
  append_kernel_descs(out, op_name(P), DeviceType::kCuda, {Dt}, kCudnnAttentionName,
                      kCudnnAttentionPriority, cudnn_attention<P, Dt>,
                      cudnn_attention_supports<P, Dt>, cudnn_attention_cost<P, Dt>,
                      cudnn_attention_workspace<P, Dt>);
}

}  // namespace

int64_t cudnn_runtime_version() { return static_cast<int64_t>(cudnnGetVersion()); }

CudnnAttentionCounters cudnn_attention_counters() {
  std::lock_guard<std::mutex> lock(g_decline_mutex);
  return {g_cudnn_calls.load(), g_fallback_calls.load(), g_last_decline};
}

void add_cudnn_attention_kernels(std::vector<KernelDesc>& out) {
  add_one<Pass::kFwd, DType::kBF16>(out);
  add_one<Pass::kFwd, DType::kF16>(out);
  add_one<Pass::kBwd, DType::kBF16>(out);
  add_one<Pass::kBwd, DType::kF16>(out);
}

}  // namespace loom::kernels::cuda
