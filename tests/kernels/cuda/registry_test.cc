// The kernel lists of the gemm, loss, optim and elementwise families and everything about
// them that runs without a GPU: one "cuda" kernel per op and dtype (and "cuda.tf32" for f32
// gemm; fp8_gemm on the FP8 dtypes), `supports` deciding on shapes alone and declining what
// cuBLASLt cannot run, costs equal to the CPU kernels', and bad calls rejected with the CPU
// kernels' words (for the FP8 ops, the shared checks' words). The numerical tests of these
// kernels run in the op tests, against cpu.ref, and in fp8_test, on a machine with a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <loom/cpp/error.h>
#include <loom/cpp/op_checks/fp8.h>
#include <loom/cpp/tensor.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/common/env_choice.h"
#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/gemm/cublaslt.cuh"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/loss/loss.h"
#include "kernels/cuda/optim/optim.h"
#include "kernels/cuda/probe/device_probe.h"

namespace loom::kernels::cuda {
namespace {

const std::vector<KernelDesc>& family_kernels() {
  static const std::vector<KernelDesc> k = [] {
    std::vector<KernelDesc> out;
    add_gemm_kernels(out);
    add_loss_kernels(out);
    add_optim_kernels(out);
    add_elementwise_kernels(out);
    return out;
  }();
  return k;
}

const KernelDesc* find(const char* op, DType dt, const char* name = "cuda") {
  for (const KernelDesc& k : family_kernels())
    if (std::strcmp(k.op, op) == 0 && k.dtype == dt && std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

const std::vector<const char*> kOps = {
    ops::kGemm,
    ops::kAdd,
    ops::kBiasAdd,
    ops::kBiasGrad,
    ops::kCast,
    ops::kScale,
    ops::kSumSq,
    ops::kAmax,
    ops::kCrossEntropyFwd,
    ops::kCrossEntropyBwd,
    ops::kCrossEntropyFwdBwd,
    ops::kCrossEntropyShardStats,
    ops::kCrossEntropyCombine,
    ops::kMaskedSum,
    ops::kAdamWStep,
    ops::kAdamWStepMulti,
    ops::kSgdStep,
    ops::kFp8ScaleUpdate,
};
const DType kFloats[] = {DType::kF32, DType::kBF16, DType::kF16};
const DType kFp8s[] = {DType::kF8E4M3, DType::kF8E5M2};

TEST(FamilyRegistry, OneCudaKernelPerOpAndDtype) {
  for (const char* op : kOps)
    for (DType dt : kFloats) {
      const KernelDesc* k = find(op, dt);
      bool f32_only = std::string(op) == ops::kCrossEntropyCombine ||
                      std::string(op) == ops::kFp8ScaleUpdate || std::string(op) == ops::kMaskedSum;
      if (f32_only && dt != DType::kF32) {
        EXPECT_EQ(k, nullptr) << op << " " << dtype_name(dt);
        continue;
      }
      ASSERT_NE(k, nullptr) << op << " " << dtype_name(dt);
      EXPECT_EQ(k->struct_size, sizeof(KernelDesc));
      EXPECT_EQ(k->op_version, ops::kVersion);
      EXPECT_EQ(k->device, DeviceType::kCuda);
      EXPECT_EQ(k->priority, 20);
      EXPECT_NE(k->fn, nullptr);
      EXPECT_NE(k->supports, nullptr) << op;
      EXPECT_NE(k->cost, nullptr) << op;
    }
  const KernelDesc* tf32 = find(ops::kGemm, DType::kF32, "cuda.tf32");
  ASSERT_NE(tf32, nullptr);
  EXPECT_LT(tf32->priority, 20);  // only a spec that pins it gets TF32
  EXPECT_EQ(find(ops::kGemm, DType::kBF16, "cuda.tf32"), nullptr);
  // 3xTF32, gemm and gemm_epilogue: f32 only, pinned only, each with a workspace.
  for (const char* op : {ops::kGemm, ops::kGemmEpilogue}) {
    const KernelDesc* x3 = find(op, DType::kF32, "cuda.tf32x3");
    ASSERT_NE(x3, nullptr) << op;
    EXPECT_LT(x3->priority, 20) << op;
    EXPECT_NE(x3->workspace, nullptr) << op;
    EXPECT_EQ(find(op, DType::kBF16, "cuda.tf32x3"), nullptr) << op;
  }
  // fp8_gemm is keyed on A's dtype: the FP8 ones only.
  for (DType dt : kFp8s) {
    const KernelDesc* k = find(ops::kFp8Gemm, dt);
    ASSERT_NE(k, nullptr) << dtype_name(dt);
    EXPECT_EQ(k->priority, 20);
    EXPECT_NE(k->supports, nullptr);
    EXPECT_NE(k->cost, nullptr);
  }
  for (DType dt : kFloats) EXPECT_EQ(find(ops::kFp8Gemm, dt), nullptr) << dtype_name(dt);
  // grad_norm_clip works on the f64 step scalars: keyed on f64 alone.
  ASSERT_NE(find(ops::kGradNormClip, DType::kF64), nullptr);
  for (DType dt : kFloats) EXPECT_EQ(find(ops::kGradNormClip, dt), nullptr) << dtype_name(dt);
  for (const KernelDesc& k : family_kernels()) {
    bool known = std::string(k.op) == ops::kFp8Gemm || std::string(k.op) == ops::kGemmEpilogue ||
                 std::string(k.op) == ops::kSumSqMulti || std::string(k.op) == ops::kGradNormClip;
    for (const char* op : kOps) known = known || std::string(op) == k.op;
    EXPECT_TRUE(known) << k.op;
  }
}

// ---- Calls on shapes (data is never read here) ------------------------------------------

TensorView view(DType dt, std::vector<int64_t> shape, DeviceType device, void* data = nullptr) {
  return make_view(data, dt, shape.data(), static_cast<int32_t>(shape.size()), Device{device, 0});
}

TensorView none() {
  TensorView v{};
  v.device = Device{DeviceType::kCuda, 0};
  return v;
}

struct Call {
  std::vector<TensorView> in, out;
  OpCall call{};
  template <class A>
  Call(std::vector<TensorView> i, std::vector<TensorView> o, const A* attrs)
      : in(std::move(i)), out(std::move(o)) {
    call.struct_size = sizeof(OpCall);
    call.inputs = in.data();
    call.num_inputs = static_cast<int32_t>(in.size());
    call.outputs = out.data();
    call.num_outputs = static_cast<int32_t>(out.size());
    call.attrs = attrs;
    call.attrs_size = attrs != nullptr ? sizeof(A) : 0;
  }
  // The same call on other devices' views (the CPU kernels take CPU tensors).
  Call on(DeviceType device) const {
    Call c = *this;
    for (TensorView& v : c.in) v.device.type = device;
    for (TensorView& v : c.out) v.device.type = device;
    c.call.inputs = c.in.data();
    c.call.outputs = c.out.data();
    return c;
  }
  Call(const Call& o) : in(o.in), out(o.out), call(o.call) {
    call.inputs = in.data();
    call.outputs = out.data();
  }
};

const ops::GemmAttrs kGemmNT{0, 1, 1.0f, 0.0f};
const ops::GemmEpilogueAttrs kGelu{0, 1, ops::kEpilogueGelu, 1, 0.0f};
const ops::SumSqMultiAttrs kSumSqMulti3{3};
const ops::GemmEpilogueAttrs kBiasGradA{1, 0, ops::kEpilogueBiasGradA, 0, 1.0f};
const ops::CrossEntropyShardAttrs kShard{8, 40};
const ops::AdamWAttrs kAdam{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 3};
const float kDecay[3] = {0.1f, 0.0f, 0.1f};
const ops::AdamWMultiAttrs kAdamMulti{1e-3f, 0.9f, 0.95f, 1e-8f, 1.0f, 3, 3, kDecay};
const ops::SgdAttrs kSgd{0.1f, 0.9f, 0.0f, 1.0f, 1, 2};
const ops::ScaleAttrs kScale{0.5f};

// A good call of each op (CUDA views, null data), keyed dtype bf16 where the op has one.
struct Case {
  const char* op;
  Call call;
};

std::vector<Case> good_calls() {
  const DeviceType cu = DeviceType::kCuda;
  const DType bf = DType::kBF16, f = DType::kF32;
  std::vector<Case> c;
  c.push_back({ops::kGemm, Call({view(bf, {2, 3, 5}, cu), view(bf, {7, 5}, cu)},
                                {view(f, {2, 3, 7}, cu)}, &kGemmNT)});
  c.push_back({ops::kAdd, Call({view(bf, {33}, cu), view(f, {33}, cu)}, {view(bf, {33}, cu)},
                               static_cast<const int*>(nullptr))});
  c.push_back({ops::kBiasAdd,
               Call({view(f, {6}, cu)}, {view(bf, {5, 6}, cu)}, static_cast<const int*>(nullptr))});
  c.push_back({ops::kBiasGrad,
               Call({view(bf, {5, 6}, cu)}, {view(f, {6}, cu)}, static_cast<const int*>(nullptr))});
  c.push_back({ops::kCast, Call({view(bf, {9}, cu)}, {view(DType::kF16, {9}, cu)},
                                static_cast<const int*>(nullptr))});
  c.push_back({ops::kScale, Call({view(bf, {9}, cu)}, {view(bf, {9}, cu)}, &kScale)});
  c.push_back({ops::kSumSq, Call({view(bf, {4, 9}, cu)}, {view(DType::kF64, {1}, cu)},
                                 static_cast<const int*>(nullptr))});
  c.push_back({ops::kAmax,
               Call({view(bf, {4, 9}, cu)}, {view(f, {1}, cu)}, static_cast<const int*>(nullptr))});
  c.push_back({ops::kCrossEntropyFwd,
               Call({view(bf, {4, 40}, cu), view(DType::kI32, {4}, cu), view(f, {4}, cu)},
                    {view(f, {4}, cu), view(f, {4}, cu), view(f, {1}, cu)},
                    static_cast<const int*>(nullptr))});
  c.push_back({ops::kCrossEntropyBwd, Call({view(bf, {4, 16}, cu), view(DType::kI32, {4}, cu),
                                            none(), view(f, {4}, cu), view(f, {1}, cu)},
                                           {view(bf, {4, 16}, cu)}, &kShard)});
  c.push_back(
      {ops::kCrossEntropyFwdBwd,
       Call({view(bf, {4, 40}, cu), view(DType::kI32, {4}, cu), view(f, {4}, cu), view(f, {1}, cu)},
            {view(f, {4}, cu), view(f, {4}, cu), view(f, {1}, cu), view(bf, {4, 40}, cu)},
            static_cast<const int*>(nullptr))});
  c.push_back({ops::kCrossEntropyShardStats,
               Call({view(bf, {4, 16}, cu), view(DType::kI32, {4}, cu), view(f, {4}, cu)},
                    {view(f, {4, 3}, cu)}, &kShard)});
  c.push_back({ops::kCrossEntropyCombine,
               Call({view(f, {3, 4, 3}, cu), view(DType::kI32, {4}, cu), none()},
                    {view(f, {4}, cu), view(f, {4}, cu), view(f, {1}, cu)}, &kShard)});
  const void* no_attrs = nullptr;
  c.push_back({ops::kMaskedSum,
               Call({view(f, {12}, cu), view(f, {12}, cu)}, {view(f, {2}, cu)}, &no_attrs)});
  c.push_back({ops::kMaskedSum, Call({view(f, {12}, cu), none()}, {view(f, {2}, cu)}, &no_attrs)});
  c.push_back({ops::kAdamWStep, Call({view(bf, {1000}, cu)},
                                     {view(f, {1000}, cu), view(f, {1000}, cu), view(f, {1000}, cu),
                                      view(bf, {1000}, cu)},
                                     &kAdam)});
  // Three shards: one with a bf16 param, one with an f32 param, one without.
  c.push_back(
      {ops::kAdamWStepMulti,
       Call({view(bf, {1000}, cu), view(bf, {7}, cu), view(bf, {1}, cu)},
            {view(f, {1000}, cu), view(f, {1000}, cu), view(f, {1000}, cu), view(bf, {1000}, cu),
             view(f, {7}, cu), view(f, {7}, cu), view(f, {7}, cu), view(f, {7}, cu),
             view(f, {1}, cu), view(f, {1}, cu), view(f, {1}, cu), none()},
            &kAdamMulti)});
  c.push_back({ops::kSgdStep, Call({view(bf, {1000}, cu)},
                                   {view(f, {1000}, cu), view(f, {1000}, cu), none()}, &kSgd)});
  c.push_back({ops::kGemmEpilogue,
               Call({view(bf, {6, 5}, cu), view(bf, {8, 5}, cu), view(bf, {8}, cu), none()},
                    {view(bf, {6, 8}, cu), view(bf, {6, 8}, cu), none()}, &kGelu)});
  c.push_back(
      {ops::kGemmEpilogue, Call({view(bf, {6, 4}, cu), view(bf, {6, 5}, cu), none(), none()},
                                {view(f, {4, 5}, cu), none(), view(f, {4}, cu)}, &kBiasGradA)});
  c.push_back({ops::kSumSqMulti, Call({view(bf, {6, 5}, cu), view(bf, {0}, cu), view(bf, {7}, cu)},
                                      {view(DType::kF64, {1}, cu)}, &kSumSqMulti3)});
  return c;
}

DType key_of(const Case& c) {
  if (std::string(c.op) == ops::kCrossEntropyCombine) return DType::kF32;
  if (std::string(c.op) == ops::kBiasAdd) return c.call.out[0].dtype;  // keyed on Y
  return c.call.in[0].dtype;
}

TEST(FamilyRegistry, SupportsAcceptsGoodShapesWithNullDataAndDeclinesCpuTensors) {
  for (const Case& c : good_calls()) {
    const KernelDesc* k = find(c.op, key_of(c));
    ASSERT_NE(k, nullptr) << c.op;
    EXPECT_TRUE(k->supports(&c.call.call)) << c.op;
    Call cpu = c.call.on(DeviceType::kCpu);
    EXPECT_FALSE(k->supports(&cpu.call)) << c.op << " accepted CPU tensors";
  }
}

TEST(FamilyRegistry, CostsEqualTheCpuKernels) {
  for (const Case& c : good_calls()) {
    const KernelDesc* k = find(c.op, key_of(c));
    const KernelDesc* ref = cpu::find_kernel(c.op, key_of(c), "cpu.ref");
    ASSERT_NE(k, nullptr) << c.op;
    ASSERT_NE(ref, nullptr) << c.op;
    OpCost got{}, want{};
    Status s = k->cost(&c.call.call, &got);
    ASSERT_EQ(s.code, Code::kOk) << c.op << ": " << take_message(&s);
    Call cpu = c.call.on(DeviceType::kCpu);
    s = ref->cost(&cpu.call, &want);
    ASSERT_EQ(s.code, Code::kOk) << c.op << ": " << take_message(&s);
    EXPECT_EQ(got.flops, want.flops) << c.op;
    EXPECT_EQ(got.bytes_read, want.bytes_read) << c.op;
    EXPECT_EQ(got.bytes_written, want.bytes_written) << c.op;
  }
}

TEST(FamilyRegistry, GemmDeclinesWhatCublasLtCannotRun) {
  const DeviceType cu = DeviceType::kCuda;
  const KernelDesc* k = find(ops::kGemm, DType::kBF16);
  const KernelDesc* tf32 = find(ops::kGemm, DType::kF32, "cuda.tf32");
  ASSERT_NE(k, nullptr);
  ASSERT_NE(tf32, nullptr);
  Call mixed({view(DType::kBF16, {3, 5}, cu), view(DType::kF32, {5, 7}, cu)},
             {view(DType::kF32, {3, 7}, cu)}, &kGemmNT);
  mixed.in[1] = view(DType::kF32, {7, 5}, cu);
  EXPECT_FALSE(k->supports(&mixed.call)) << "A bf16 with B f32";
  Call y16({view(DType::kBF16, {3, 5}, cu), view(DType::kBF16, {7, 5}, cu)},
           {view(DType::kF16, {3, 7}, cu)}, &kGemmNT);
  EXPECT_FALSE(k->supports(&y16.call)) << "bf16 operands into an f16 Y";
  Call bf16({view(DType::kBF16, {3, 5}, cu), view(DType::kBF16, {7, 5}, cu)},
            {view(DType::kBF16, {3, 7}, cu)}, &kGemmNT);
  EXPECT_TRUE(k->supports(&bf16.call));
  EXPECT_FALSE(tf32->supports(&bf16.call)) << "tf32 is for f32 operands";
  Call f32({view(DType::kF32, {2, 3, 5}, cu), view(DType::kF32, {2, 7, 5}, cu)},
           {view(DType::kF32, {2, 3, 7}, cu)}, &kGemmNT);
  EXPECT_TRUE(tf32->supports(&f32.call));
  EXPECT_TRUE(find(ops::kGemm, DType::kF32)->supports(&f32.call));
  const KernelDesc* x3 = find(ops::kGemm, DType::kF32, "cuda.tf32x3");
  ASSERT_NE(x3, nullptr);
  EXPECT_FALSE(x3->supports(&bf16.call)) << "3xTF32 is for f32 operands";
  EXPECT_FALSE(x3->supports(&mixed.call)) << "3xTF32 is for f32 operands";
  EXPECT_TRUE(x3->supports(&f32.call));
}

// The 3xTF32 workspace. In registers (the default form) none, and the cost is the 'cuda'
// kernel's with three products instead of one. In the split form (LOOM_TF32X3=split:
// tf32x3_split_test runs this case so) the split operands of the whole K, rows of A2 for
// batch * M and of B2 for each B matrix, segments * kp floats each (kp = K rounded up to 4;
// three segments where the output is larger than the split, tf32x3_segments), B2 at a
// 256-byte boundary; capped at 256 MiB by splitting K, never below 4 columns. Under
// LOOM_TF32X3_WORKSPACE=scratch as well (tf32x3_scratch_test) none: the split goes to the
// stream scratch.
TEST(FamilyRegistry, Tf32x3WorkspaceIsTheSplitOperands) {
  const DeviceType cu = DeviceType::kCuda;
  const KernelDesc* g = find(ops::kGemm, DType::kF32, "cuda.tf32x3");
  const KernelDesc* e = find(ops::kGemmEpilogue, DType::kF32, "cuda.tf32x3");
  ASSERT_NE(g, nullptr);
  ASSERT_NE(e, nullptr);
  const char* form_env = std::getenv("LOOM_TF32X3");
  const char* ws_env = std::getenv("LOOM_TF32X3_WORKSPACE");
  const std::string form = form_env != nullptr ? form_env : "";
  const bool split = form == "split";
  ASSERT_TRUE(form.empty() || split) << "this case knows the default form and 'split' only";
  const bool scratch = ws_env != nullptr && std::string(ws_env) == "scratch";
  std::printf("LOOM_TF32X3=%s LOOM_TF32X3_WORKSPACE=%s\n", form.empty() ? "(unset)" : form.c_str(),
              ws_env != nullptr ? ws_env : "(unset)");
  const bool no_split = !split || scratch;  // no split workspace
  // batch 2 of (3, 5) @ (7, 5)^T, B batched: three segments of kp 8, A2 6 rows, B2 14 rows.
  Call f32({view(DType::kF32, {2, 3, 5}, cu), view(DType::kF32, {2, 7, 5}, cu)},
           {view(DType::kF32, {2, 3, 7}, cu)}, &kGemmNT);
  const uint64_t a2 = 6 * 24 * 4, b2 = 14 * 24 * 4;
  EXPECT_EQ(g->workspace(&f32.call), no_split ? 0 : (a2 + 255) / 256 * 256 + b2);
  // The LM head's gradient of a vocabulary of 50304 over 32768 tokens: two segments (the
  // split is far larger than the output), in chunks of K.
  const ops::GemmAttrs wgrad{1, 0, 1.0f, 1.0f};  // dW (V, C) += dY^T (tokens, V) X (tokens, C)
  Call big({view(DType::kF32, {32768, 50304}, cu), view(DType::kF32, {32768, 768}, cu)},
           {view(DType::kF32, {50304, 768}, cu)}, &wgrad);
  const uint64_t w = g->workspace(&big.call);
  if (no_split) {
    EXPECT_EQ(w, 0u);
  } else {
    EXPECT_LE(w, uint64_t{256} << 20);
    EXPECT_GE(w, uint64_t{128} << 20);
  }
  // The cost: the 'cuda' kernel's and three products instead of one; in the split form also
  // the split written once per segment and read three times (the small case: 3 segments,
  // 6 * 5 + 14 * 5 floats), and in its two-matmul form Y read and written once more.
  const KernelDesc* plain = find(ops::kGemm, DType::kF32);
  ASSERT_NE(plain, nullptr);
  OpCost want{}, got{};
  ASSERT_EQ(plain->cost(&f32.call, &want).code, Code::kOk);
  ASSERT_EQ(g->cost(&f32.call, &got).code, Code::kOk);
  EXPECT_EQ(got.flops, 3 * want.flops);
  const double small_split = split ? 3 * (6 + 14) * 5 * 4.0 : 0.0;
  EXPECT_EQ(got.bytes_written, want.bytes_written + small_split);
  EXPECT_EQ(got.bytes_read, want.bytes_read + small_split);
  ASSERT_EQ(plain->cost(&big.call, &want).code, Code::kOk);
  ASSERT_EQ(g->cost(&big.call, &got).code, Code::kOk);
  const double big_split = split ? (50304.0 + 768.0) * 32768 * 4 : 0.0;
  const double y = split ? 50304.0 * 768 * 4 : 0.0;
  EXPECT_EQ(got.bytes_written, want.bytes_written + 2 * big_split + y);
  EXPECT_EQ(got.bytes_read, want.bytes_read + 3 * big_split + y);
  // gemm_epilogue: in registers GELU runs in the GEMM's epilogue (nothing to keep); in the
  // split form a GELU without aux keeps P (M, N) first, the split after it.
  ops::GemmEpilogueAttrs gelu{0, 1, ops::kEpilogueGelu, 1, 0.0f};
  Call ep({view(DType::kF32, {3, 5}, cu), view(DType::kF32, {7, 5}, cu), view(DType::kF32, {7}, cu),
           none()},
          {view(DType::kF32, {3, 7}, cu), none(), none()}, &gelu);
  const uint64_t ep_a2 = 3 * 24 * 4, ep_b2 = 7 * 24 * 4;
  EXPECT_EQ(e->workspace(&ep.call), !split    ? 0
                                    : scratch ? 3 * 7 * 4
                                              : 256 + (ep_a2 + 255) / 256 * 256 + ep_b2);
}

// The CPU reference's message for the same bad call (on CPU views of the same shapes).
std::string cpu_message(const char* op, DType key, const Call& cuda_call) {
  Call cpu = cuda_call.on(DeviceType::kCpu);
  Status s = cpu::find_kernel(op, key, "cpu.ref")->fn(&cpu.call);
  EXPECT_NE(s.code, Code::kOk);
  return take_message(&s);
}

// gemm_epilogue's workspace holds GELU's input when the caller keeps none (no aux output),
// and its CUDA kernel declines the one call its fallback has no kernel for: a bias gradient
// of an A stored (M, K).
TEST(FamilyRegistry, GemmEpilogueWorkspaceAndDeclines) {
  const DeviceType cu = DeviceType::kCuda;
  const DType bf = DType::kBF16, f = DType::kF32;
  const KernelDesc* k = find(ops::kGemmEpilogue, bf);
  ASSERT_NE(k, nullptr);
  ASSERT_NE(k->workspace, nullptr);
  Call with_aux({view(bf, {6, 5}, cu), view(bf, {8, 5}, cu), view(bf, {8}, cu), none()},
                {view(bf, {6, 8}, cu), view(bf, {6, 8}, cu), none()}, &kGelu);
  Call without_aux({view(bf, {6, 5}, cu), view(bf, {8, 5}, cu), view(bf, {8}, cu), none()},
                   {view(bf, {6, 8}, cu), none(), none()}, &kGelu);
  EXPECT_EQ(k->workspace(&with_aux.call), 0u);
  EXPECT_EQ(k->workspace(&without_aux.call), 6u * 8u * 2u);  // P (M, N) in bf16
  EXPECT_TRUE(k->supports(&without_aux.call));
  const ops::GemmEpilogueAttrs untransposed{0, 0, ops::kEpilogueBiasGradA, 0, 0.0f};
  Call rows({view(bf, {4, 6}, cu), view(bf, {6, 5}, cu), none(), none()},
            {view(f, {4, 5}, cu), none(), view(f, {4}, cu)}, &untransposed);
  EXPECT_FALSE(k->supports(&rows.call));
  Call rows_without_dbias({view(bf, {4, 6}, cu), view(bf, {6, 5}, cu), none(), none()},
                          {view(f, {4, 5}, cu), none(), none()}, &untransposed);
  EXPECT_TRUE(k->supports(&rows_without_dbias.call));
}

TEST(FamilyRegistry, BadCallsFailWithTheCpuKernelsWords) {
  const DeviceType cu = DeviceType::kCuda;
  static float fake[64];  // never read: every call below fails its checks first
  void* p = fake;
  struct Bad {
    const char* op;
    DType key;
    Call call;
    const char* expect;
  };
  std::vector<Bad> bad;
  bad.push_back({ops::kGemm, DType::kF32,
                 Call({view(DType::kF32, {3, 4}, cu, p), view(DType::kF32, {5, 2}, cu, p)},
                      {view(DType::kF32, {3, 2}, cu, p)}, &kGemmNT),
                 "gemm: input 1 (B) has shape (5, 2)"});
  bad.push_back({ops::kAdd, DType::kF32,
                 Call({view(DType::kF32, {4}, cu, p), view(DType::kF32, {5}, cu, p)},
                      {view(DType::kF32, {4}, cu, p)}, static_cast<const int*>(nullptr)),
                 "add: input 1 (B) has shape (5)"});
  bad.push_back({ops::kAmax, DType::kF32,
                 Call({view(DType::kF32, {4}, cu, p)}, {view(DType::kF32, {2}, cu, p)},
                      static_cast<const int*>(nullptr)),
                 "amax: output 0 (out) has shape (2)"});
  bad.push_back({ops::kCrossEntropyBwd, DType::kF32,
                 Call({view(DType::kF32, {4, 16}, cu, p), view(DType::kI32, {4}, cu, p), none(),
                       view(DType::kF32, {4}, cu, p), view(DType::kF32, {1}, cu, p)},
                      {view(DType::kF32, {4, 16}, cu, p)}, &kShard),
                 nullptr});
  bad.back().call.in[0].shape[1] = 16;  // fine; the shard's place below is not
  static const ops::CrossEntropyShardAttrs kNegative{-2, 40};
  bad.back().call.call.attrs = &kNegative;
  bad.back().expect = "cross_entropy_bwd: attrs vocab_start = -2";
  bad.push_back({ops::kAdamWStep, DType::kF32,
                 Call({view(DType::kF32, {8}, cu, p)},
                      {view(DType::kF32, {8}, cu, p), view(DType::kF32, {8}, cu, p),
                       view(DType::kF32, {7}, cu, p), none()},
                      &kAdam),
                 "adamw_step: output 2 (exp_avg_sq) has shape (7)"});
  bad.push_back({ops::kAdamWStepMulti, DType::kF32,
                 Call({view(DType::kF32, {8}, cu, p), view(DType::kF32, {5}, cu, p),
                       view(DType::kF32, {3}, cu, p)},
                      {view(DType::kF32, {8}, cu, p), view(DType::kF32, {8}, cu, p),
                       view(DType::kF32, {8}, cu, p), none(), view(DType::kF32, {5}, cu, p),
                       view(DType::kF32, {5}, cu, p), view(DType::kF32, {5}, cu, p), none(),
                       view(DType::kF32, {3}, cu, p), view(DType::kF32, {3}, cu, p),
                       view(DType::kF32, {4}, cu, p), none()},
                      &kAdamMulti),
                 "adamw_step_multi: output 10 (exp_avg_sq[2]) has shape (4) (4 elements), "
                 "expected grad[2]'s shape with 3 elements"});
  for (const Bad& b : bad) {
    const KernelDesc* k = find(b.op, b.key);
    ASSERT_NE(k, nullptr) << b.op;
    EXPECT_FALSE(k->supports(&b.call.call)) << b.op;
    Status s = k->fn(&b.call.call);
    EXPECT_EQ(s.code, Code::kInvalidArgument) << b.op;
    std::string msg = take_message(&s);
    EXPECT_NE(msg.find(b.expect), std::string::npos) << msg;
    EXPECT_EQ(msg, cpu_message(b.op, b.key, b.call)) << b.op;
  }
  // CUDA kernels refuse host tensors, naming the device.
  Call host = good_calls()[1].call.on(DeviceType::kCpu);
  for (TensorView& v : host.in) v.data = p;
  for (TensorView& v : host.out) v.data = p;
  Status s = find(ops::kAdd, DType::kBF16)->fn(&host.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  std::string msg = take_message(&s);
  EXPECT_NE(msg.find("add: input 0 (A) is in cpu memory: the cuda kernels take cuda tensors only"),
            std::string::npos)
      << msg;
}

// ---- FP8 ------------------------------------------------------------------------------

const ops::Fp8GemmAttrs kFp8Gemm{1.0f, 0.0f, 1};

// True unless this machine has a CUDA device older than sm_89 (fp8_gemm declines it).
bool fp8_device_or_none() {
  int count = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return true;
  }
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major * 10 + minor >= 89;
}

// fp8_gemm of A (m, k) in `a`, B (n, k) in `b`, Y (m, n) in `y`, every tensor's data at
// `data` (null: shapes only).
Call fp8_gemm_call(int64_t m, int64_t n, int64_t k, DType a, DType b, DType y,
                   void* data = nullptr) {
  const DeviceType cu = DeviceType::kCuda;
  return Call({view(a, {m, k}, cu, data), view(b, {n, k}, cu, data),
               view(DType::kF32, {1}, cu, data), view(DType::kF32, {1}, cu, data)},
              {view(y, {m, n}, cu, data)}, &kFp8Gemm);
}

TEST(FamilyRegistry, Fp8GemmDeclinesWhatCublasLtsFp8KernelsCannotRun) {
  if (!fp8_device_or_none()) GTEST_SKIP() << "device 0 is older than sm_89: fp8_gemm declines it";
  const KernelDesc* k = find(ops::kFp8Gemm, DType::kF8E4M3);
  ASSERT_NE(k, nullptr);
  const DType e4 = DType::kF8E4M3, e5 = DType::kF8E5M2;
  const Call good = fp8_gemm_call(3, 16, 64, e4, e4, DType::kBF16);
  const Call rows16 = fp8_gemm_call(3, 4, 16, e4, e5, DType::kF32);  // 16-byte rows of Y
  const Call empty_k = fp8_gemm_call(3, 8, 0, e4, e4, DType::kF16);
  EXPECT_TRUE(k->supports(&good.call));
  EXPECT_TRUE(k->supports(&rows16.call));
  EXPECT_TRUE(k->supports(&empty_k.call));
  // An empty Y: nothing runs, so the layout rules do not apply (K = 40, 8-byte rows of Y),
  // as on the CPU; the call returns without a device.
  alignas(16) static unsigned char host_bytes[16];
  for (const Call& empty : {fp8_gemm_call(0, 4, 40, e4, e4, DType::kBF16, host_bytes),
                            fp8_gemm_call(3, 0, 40, e4, e4, DType::kBF16, host_bytes)}) {
    EXPECT_TRUE(k->supports(&empty.call));
    Status s = k->fn(&empty.call);
    EXPECT_EQ(s.code, Code::kOk) << take_message(&s);
    status_release(&s);
  }
  const Call host = good.on(DeviceType::kCpu);
  EXPECT_FALSE(k->supports(&host.call));

  // What cuBLASLt cannot run: declined, and a call says why before it needs a device.
  alignas(16) static unsigned char fake[64];
  struct Case {
    Call call;
    const char* expect;
  };
  const Case cases[] = {
      {fp8_gemm_call(3, 16, 40, e4, e4, DType::kBF16, fake),
       "fp8_gemm: K = 40 is not a multiple of 16"},
      {fp8_gemm_call(3, 4, 64, e4, e4, DType::kBF16, fake),
       "fp8_gemm: a row of Y (N = 4 bf16) is 8 bytes, not a multiple of 16"},
      {fp8_gemm_call(3, 6, 64, e4, e4, DType::kF32, fake),
       "fp8_gemm: a row of Y (N = 6 f32) is 24 bytes, not a multiple of 16"},
      {fp8_gemm_call(3, 16, 64, e4, e4, DType::kBF16, fake + 8),
       "fp8_gemm: A, B or Y does not start at a 16-byte aligned address"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(k->supports(&c.call.call)) << c.expect;
    Status s = k->fn(&c.call.call);
    EXPECT_EQ(s.code, Code::kUnimplemented) << c.expect;
    std::string msg = take_message(&s);
    EXPECT_EQ(msg.find(c.expect), 0u) << msg;
    EXPECT_NE(msg.find("cuBLASLt's FP8 GEMMs need K a multiple of 16"), std::string::npos) << msg;
  }
}

// The message of the shared checks for `call` (the CPU kernels run the same checks).
template <class Shape>
std::string shared_check_message(Shape (*check)(const OpCall*, bool, DeviceType),
                                 const Call& call) {
  try {
    check(&call.call, false, DeviceType::kCuda);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "the shared checks accept the call";
  return "";
}

// A bad call: declined by `supports`, and failing with the shared checks' words.
template <class Shape>
void expect_refused(const KernelDesc* k, Shape (*check)(const OpCall*, bool, DeviceType),
                    const Call& call, const std::string& expect) {
  ASSERT_NE(k, nullptr) << expect;
  EXPECT_FALSE(k->supports(&call.call)) << expect;
  Status s = k->fn(&call.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument) << expect;
  std::string msg = take_message(&s);
  EXPECT_EQ(msg.find(expect), 0u) << msg;
  EXPECT_EQ(msg, shared_check_message(check, call));
}

TEST(FamilyRegistry, Fp8BadCallsFailWithTheSharedChecksWords) {
  const DeviceType cu = DeviceType::kCuda;
  alignas(16) static unsigned char fake[256];
  void* p = fake;
  const DType e4 = DType::kF8E4M3, e5 = DType::kF8E5M2, f = DType::kF32;
  const Call both_e5m2 = fp8_gemm_call(16, 16, 32, e5, e5, f, p);
  expect_refused(find(ops::kFp8Gemm, e5), op_checks::check_fp8_gemm, both_e5m2,
                 "fp8_gemm: A and B are both fp8_e5m2");
  Call k_mismatch = fp8_gemm_call(16, 16, 32, e4, e4, f, p);
  k_mismatch.in[1] = view(e4, {16, 48}, cu, p);
  expect_refused(find(ops::kFp8Gemm, e4), op_checks::check_fp8_gemm, k_mismatch,
                 "fp8_gemm: input 1 (B) has shape (16, 48), expected (N, K) with K = 32");

  // fp8_scale_update: `current` outside the history's 3 rows.
  const ops::Fp8ScaleAttrs far{0, 3, -1, 0.0f};
  Call scale({view(f, {4}, cu, p)},
             {view(f, {3, 4}, cu, p), view(f, {4}, cu, p), view(f, {4}, cu, p)}, &far);
  expect_refused(find(ops::kFp8ScaleUpdate, f), op_checks::check_fp8_scale_update, scale,
                 "fp8_scale_update: attrs.current is 3, outside [0, 3)");
  const ops::Fp8ScaleAttrs good{0, 2, 0, 0.0f};
  scale.call.attrs = &good;
  EXPECT_TRUE(find(ops::kFp8ScaleUpdate, f)->supports(&scale.call));
}

// The kernels' environment switches (common/env_choice.h): unset or empty is the first value; a
// value not listed fails naming the op, the variable, the value and every value it takes.
TEST(FamilyRegistry, EnvironmentSwitches) {
  const char* var = "LOOM_TEST_ENV_CHOICE";
  ::unsetenv(var);
  EXPECT_EQ(env_choice("op", var, {"a", "b", "c"}), 0u);
  ::setenv(var, "", 1);
  EXPECT_EQ(env_choice("op", var, {"a", "b", "c"}), 0u);
  ::setenv(var, "a", 1);
  EXPECT_EQ(env_choice("op", var, {"a", "b", "c"}), 0u);
  ::setenv(var, "c", 1);
  EXPECT_EQ(env_choice("op", var, {"a", "b", "c"}), 2u);
  ::setenv(var, "d", 1);
  try {
    env_choice("op", var, {"a", "b", "c"});
    ADD_FAILURE() << "no error for an unknown value";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_STREQ(e.what(),
                 "op: environment variable LOOM_TEST_ENV_CHOICE is 'd': use a (or leave it "
                 "unset), b or c");
  }
  ::setenv(var, "x", 1);
  try {
    env_choice("op", var, {"a", "b"});
    ADD_FAILURE() << "no error for an unknown value";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "op: environment variable LOOM_TEST_ENV_CHOICE is 'x': use a (or leave it "
                 "unset) or b");
  }
  ::unsetenv(var);
}

// cuBLASLt's split-K reductions (gemm/cublaslt.cuh): partial sums always in f32, so with a
// bf16 or f16 Y only the f32-workspace scheme; with an f32 (or f64) Y, whose own dtype is the
// compute type's, every scheme, as cuBLAS allows them (LOOM_CUBLASLT_REDUCTION unset).
TEST(FamilyRegistry, SplitKReductionsAddInTheComputeType) {
  ASSERT_EQ(std::getenv("LOOM_CUBLASLT_REDUCTION"), nullptr) << "run without the switch set";
  const auto compute_type = static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  const auto any = static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_MASK);
  EXPECT_EQ(gemm::split_k_reductions(CUDA_R_16BF), compute_type);
  EXPECT_EQ(gemm::split_k_reductions(CUDA_R_16F), compute_type);
  EXPECT_EQ(gemm::split_k_reductions(CUDA_R_8F_E4M3), compute_type);
  EXPECT_EQ(gemm::split_k_reductions(CUDA_R_32F), any);
  EXPECT_EQ(gemm::split_k_reductions(CUDA_R_64F), any);
}

TEST(FamilyRegistry, WithoutADeviceAGoodCallFailsCleanly) {
  if (cuda_probe::query_devices().count > 0)
    GTEST_SKIP() << "a CUDA device is present: the op tests run these kernels for real";
  static float fake[64];
  const DeviceType cu = DeviceType::kCuda;
  Call c({view(DType::kF32, {4}, cu, fake), view(DType::kF32, {4}, cu, fake)},
         {view(DType::kF32, {4}, cu, fake)}, static_cast<const int*>(nullptr));
  Status s = find(ops::kAdd, DType::kF32)->fn(&c.call);
  EXPECT_NE(s.code, Code::kOk);
  std::string msg = take_message(&s);
  EXPECT_NE(msg.find("cudaGetDevice"), std::string::npos) << msg;
  EXPECT_EQ(take_label_error(), "");  // no device: nothing recorded
}

}  // namespace
}  // namespace loom::kernels::cuda
