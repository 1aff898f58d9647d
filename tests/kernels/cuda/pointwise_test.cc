// The pointwise CUDA kernels (kernels/cuda/pointwise).
//
// Everywhere: the registration (every op and dtype), `supports` on shapes alone, and that a
// bad call fails with the very words of the CPU kernels (the checks are shared; a bad call
// never reaches the GPU). With a GPU: every op against cpu.ref on the shapes that stress the
// kernels' paths (odd widths, unaligned addresses, rows past the register capacity, Y
// aliasing X, more than 2^31 elements; the residual-add norms fused and unfused, Z over X
// or R), the dropout mask bit for bit, deterministic weight gradients with the workspace,
// and out-of-range embedding ids reported without a crash.
#include "kernels/cuda/pointwise/pointwise.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <loom/cpp/tensor.h>

#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

using cuda::add_pointwise_kernels;

const std::vector<KernelDesc>& cuda_kernels() {
  static const std::vector<KernelDesc> list = [] {
    std::vector<KernelDesc> out;
    add_pointwise_kernels(out);
    return out;
  }();
  return list;
}

const KernelDesc& cuda_kernel(const char* op, DType t) {
  for (const KernelDesc& k : cuda_kernels())
    if (std::string(k.op) == op && k.dtype == t) return k;
  ADD_FAILURE() << "no cuda kernel for " << op << " " << dtype_name(t);
  static const KernelDesc none{};
  return none;
}

const char* const kOps[] = {
    ops::kGeluFwd,         ops::kGeluBwd,          ops::kSwigluFwd,        ops::kSwigluBwd,
    ops::kDropoutFwd,      ops::kDropoutBwd,       ops::kEmbeddingFwd,     ops::kEmbeddingBwd,
    ops::kLayerNormFwd,    ops::kLayerNormBwd,     ops::kRmsNormFwd,       ops::kRmsNormBwd,
    ops::kRopeFwd,         ops::kRopeBwd,          ops::kSplitQkv,         ops::kMergeQkv,
    ops::kSwapAxes12,      ops::kMaskedSoftmaxFwd, ops::kMaskedSoftmaxBwd, ops::kFp8Quantize,
    ops::kAddLayerNormFwd, ops::kAddLayerNormBwd,  ops::kAddRmsNormFwd,    ops::kAddRmsNormBwd,
    ops::kSwigluFp8Fwd,    ops::kSwigluFp8Bwd,     ops::kRopeFp8Bwd};

// The call of `k` on views of the host tensors, every view marked as in `device` memory.
template <class A>
Status call_as(const KernelDesc& k, DeviceType device, const std::vector<Tensor*>& in,
               const std::vector<Tensor*>& out, const A* attrs) {
  CallHolder h(in, out, attrs);
  for (TensorView& v : h.in) v.device.type = device;
  for (TensorView& v : h.out) v.device.type = device;
  return k.fn(&h.call);
}

TEST(PointwiseRegistry, EveryOpForEveryFloatDtype) {
  for (const char* op : kOps)
    for (DType t : float_dtypes()) {
      int found = 0;
      for (const KernelDesc& k : cuda_kernels())
        if (std::string(k.op) == op && k.dtype == t) {
          ++found;
          EXPECT_EQ(k.device, DeviceType::kCuda) << op;
          EXPECT_STREQ(k.name, "cuda") << op;
          EXPECT_EQ(k.priority, 20) << op;
          EXPECT_EQ(k.op_version, ops::kVersion) << op;
          EXPECT_NE(k.fn, nullptr) << op;
          EXPECT_NE(k.supports, nullptr) << op;
          EXPECT_NE(k.cost, nullptr) << op;
          bool norm_bwd =
              std::string(op) == ops::kLayerNormBwd || std::string(op) == ops::kRmsNormBwd ||
              std::string(op) == ops::kAddLayerNormBwd || std::string(op) == ops::kAddRmsNormBwd;
          EXPECT_EQ(k.workspace != nullptr, norm_bwd) << op;
        }
      EXPECT_EQ(found, 1) << op << " " << dtype_name(t);
    }
  for (DType t : {DType::kI32, DType::kI16, DType::kU16})
    EXPECT_NE(cuda_kernel(ops::kSwapAxes12, t).fn, nullptr) << dtype_name(t);
}

// A bad call fails on the CPU and on CUDA with the same code and message.
template <class A>
void expect_same_refusal(const char* op, DType key, const std::vector<Tensor*>& in,
                         const std::vector<Tensor*>& out, const A* attrs, const std::string& want) {
  Status cpu = call_as(kernel(op, key, "cpu.ref"), DeviceType::kCpu, in, out, attrs);
  Status gpu = call_as(cuda_kernel(op, key), DeviceType::kCuda, in, out, attrs);
  EXPECT_EQ(cpu.code, Code::kInvalidArgument) << op;
  EXPECT_EQ(gpu.code, Code::kInvalidArgument) << op;
  std::string cpu_message = take_message(&cpu), gpu_message = take_message(&gpu);
  EXPECT_EQ(gpu_message, cpu_message) << op;
  EXPECT_NE(cpu_message.find(want), std::string::npos) << cpu_message;
}

TEST(PointwiseChecks, BadCallsFailWithTheCpuKernelsWords) {
  ops::NormAttrs norm{1e-5f, 0};
  Tensor x(DType::kBF16, {3, 8}), w7(DType::kBF16, {7}), y(DType::kBF16, {3, 8});
  Tensor rstd(DType::kF32, {3});
  expect_same_refusal(ops::kRmsNormFwd, DType::kBF16, {&x, &w7}, {&y, &rstd}, &norm,
                      "rmsnorm_fwd: input 1 (weight) has shape (7), expected (C) = (8)");
  Tensor w(DType::kBF16, {8}), none, dw(DType::kF32, {8});
  expect_same_refusal(ops::kLayerNormBwd, DType::kBF16, {&y, &x, &w, &none, &rstd},
                      {&x, &dw, &none}, &norm, "input 3 (mean) is required but empty");
  ops::DropoutAttrs wrong{0.5f, 1, 2};
  expect_same_refusal(ops::kGeluFwd, DType::kBF16, {&x}, {&y}, &wrong,
                      "gelu_fwd: attrs must point to the op's attributes struct");
  ops::DropoutAttrs drop{1.0f, 1, 2};
  expect_same_refusal(ops::kDropoutFwd, DType::kBF16, {&x}, {&y}, &drop,
                      "drop probability p = 1.000000 must be in [0, 1)");
  Tensor odd(DType::kF32, {2, 5}), half(DType::kF32, {2, 2});
  expect_same_refusal(ops::kSwigluFwd, DType::kF32, {&odd}, {&half},
                      static_cast<const NoAttrs*>(nullptr), "must be even");
  Tensor table(DType::kF32, {2, 2}), ids = Tensor::i32({1}, {0}), row(DType::kF32, {1, 2});
  ops::EmbeddingAttrs shard{-4, 5};
  expect_same_refusal(ops::kEmbeddingFwd, DType::kF32, {&table, &ids}, {&row}, &shard,
                      "attrs vocab_start = -4, vocab_size = 5: both must be >= 0");
  Tensor q(DType::kF32, {1, 2, 4, 8}), inv(DType::kF32, {2}), qy(DType::kF32, {1, 2, 4, 8});
  ops::RopeAttrs rope{3};
  expect_same_refusal(ops::kRopeFwd, DType::kF32, {&q, &none, &inv}, {&qy}, &rope,
                      "rotary_dim = 3 must be even");
  Tensor k3(DType::kF32, {1, 2, 3, 8}), v3(DType::kF32, {1, 2, 3, 8}),
      xq(DType::kF32, {1, 2, 3, 8});
  expect_same_refusal(ops::kSplitQkv, DType::kF32, {&xq}, {&q, &k3, &v3},
                      static_cast<const NoAttrs*>(nullptr), "key/value heads must divide");
  Tensor s(DType::kF32, {1, 2, 3, 4}), seg = Tensor::i32({1, 3}, {0, 0, 1}),
                                       p(DType::kF32, {1, 2, 3, 4});
  ops::SoftmaxAttrs sm{1.0f, 1};
  expect_same_refusal(ops::kMaskedSoftmaxFwd, DType::kF32, {&s, &seg}, {&p}, &sm,
                      "segment ids need as many keys as queries");
  // The residual-add norms: R of another dtype, a misshapen dZ, dX over dZ.
  Tensor r16(DType::kF16, {3, 8}), z(DType::kBF16, {3, 8}), mean(DType::kF32, {3});
  expect_same_refusal(ops::kAddLayerNormFwd, DType::kBF16, {&x, &r16, &w, &none},
                      {&y, &z, &mean, &rstd}, &norm,
                      "add_layernorm_fwd: input 1 (R) has dtype f16, expected X's bf16");
  Tensor dz7(DType::kBF16, {3, 7});
  expect_same_refusal(ops::kAddRmsNormBwd, DType::kBF16, {&y, &z, &w, &rstd, &dz7}, {&x, &dw},
                      &norm, "add_rmsnorm_bwd: input 4 (dZ) has shape (3, 7)");
  expect_same_refusal(ops::kAddLayerNormBwd, DType::kBF16, {&y, &z, &w, &mean, &rstd, &x},
                      {&x, &dw, &none}, &norm,
                      "dX aliases input 5 (dZ): give dX a buffer of its own");
  // rope_fp8_bwd: a head dimension that does not split dX's last dimension into heads.
  Tensor dqkv(DType::kBF16, {1, 2, 1, 24}), codes(DType::kF8E5M2, {2, 24}),
      fp8_scale(DType::kF32, {1}), freq4(DType::kF32, {4});
  ops::RopeFp8Attrs rope_fp8{8, 5};
  expect_same_refusal(ops::kRopeFp8Bwd, DType::kBF16, {&dqkv, &none, &freq4, &fp8_scale},
                      {&codes, &none, &none}, &rope_fp8,
                      "rope_fp8_bwd: attrs.head_dim = 5 does not split input 0 (dX)");
  // A transpose cannot run in place: the same tensor as X and Y.
  Tensor square(DType::kF32, {1, 3, 3, 4});
  expect_same_refusal(ops::kSwapAxes12, DType::kF32, {&square}, {&square},
                      static_cast<const NoAttrs*>(nullptr), "Y must not alias X");
}

TEST(PointwiseChecks, HostTensorsAreRefused) {
  Tensor x(DType::kF32, {4}), y(DType::kF32, {4});
  ops::GeluAttrs at{0};
  const KernelDesc& k = cuda_kernel(ops::kGeluFwd, DType::kF32);
  CallHolder h({&x}, {&y}, &at);
  EXPECT_FALSE(k.supports(&h.call));
  Status s = k.fn(&h.call);
  EXPECT_EQ(s.code, Code::kInvalidArgument);
  EXPECT_EQ(take_message(&s),
            "gelu_fwd: input 0 (X) is in cpu memory: the cuda kernels take cuda tensors only");
  Tensor a(DType::kI32, {1, 2, 3, 4}), b(DType::kI32, {1, 3, 2, 4});
  Status t = call_as(cuda_kernel(ops::kSwapAxes12, DType::kI32), DeviceType::kCpu, {&a}, {&b},
                     static_cast<const NoAttrs*>(nullptr));
  EXPECT_EQ(t.code, Code::kInvalidArgument);
  EXPECT_NE(take_message(&t).find("is in cpu memory"), std::string::npos);
}

TEST(PointwiseChecks, SupportsLooksAtShapesOnly) {
  Tensor x(DType::kBF16, {5, 768}), w(DType::kBF16, {768}), b(DType::kBF16, {768}),
      y(DType::kBF16, {5, 768}), mean(DType::kF32, {5}), rstd(DType::kF32, {5});
  ops::NormAttrs at{1e-5f, 1};
  CallHolder h({&x, &w, &b}, {&y, &mean, &rstd}, &at);
  for (TensorView& v : h.in) v.data = nullptr, v.device.type = DeviceType::kCuda;
  for (TensorView& v : h.out) v.data = nullptr, v.device.type = DeviceType::kCuda;
  const KernelDesc& k = cuda_kernel(ops::kLayerNormFwd, DType::kBF16);
  EXPECT_TRUE(k.supports(&h.call));
  OpCost cost{};
  Status s = k.cost(&h.call, &cost);
  EXPECT_EQ(s.code, Code::kOk);
  status_release(&s);
  EXPECT_EQ(cost.bytes_read, (5 * 768 + 2 * 768) * 2.0);
  EXPECT_EQ(cost.bytes_written, 5 * 768 * 2.0 + 2 * 5 * 4.0);
  EXPECT_GT(cost.flops, 0.0);
}

TEST(PointwiseWorkspace, NormBackwardAsksForOnePartialRowPerBlockAndGradient) {
  auto bytes = [](const char* op, int64_t n, int64_t c, bool dbias) {
    Tensor dy(DType::kBF16, {n, c}), x(DType::kBF16, {n, c}), w(DType::kBF16, {c}),
        stat(DType::kF32, {n}), dx(DType::kBF16, {n, c}), dw(DType::kF32, {c}),
        db = dbias ? Tensor(DType::kF32, {c}) : Tensor();
    bool ln = std::string(op) == ops::kLayerNormBwd;
    std::vector<Tensor*> in = ln ? std::vector<Tensor*>{&dy, &x, &w, &stat, &stat}
                                 : std::vector<Tensor*>{&dy, &x, &w, &stat};
    std::vector<Tensor*> out =
        ln ? std::vector<Tensor*>{&dx, &dw, &db} : std::vector<Tensor*>{&dx, &dw};
    ops::NormAttrs at{1e-5f, 0};
    CallHolder h(in, out, &at);
    for (TensorView& v : h.in) v.data = nullptr, v.device.type = DeviceType::kCuda;
    for (TensorView& v : h.out) v.data = nullptr, v.device.type = DeviceType::kCuda;
    return cuda_kernel(op, DType::kBF16).workspace(&h.call);
  };
  uint64_t ln = bytes(ops::kLayerNormBwd, 4096, 1024, true);
  EXPECT_GT(ln, 0u);
  EXPECT_EQ(ln % (2 * 1024 * sizeof(float)), 0u);
  EXPECT_EQ(bytes(ops::kLayerNormBwd, 4096, 1024, false), ln / 2);
  EXPECT_EQ(bytes(ops::kRmsNormBwd, 4096, 1024, false), ln / 2);
  EXPECT_LE(ln, uint64_t{32} << 20);  // at most about 16 MiB per gradient
  EXPECT_EQ(bytes(ops::kRmsNormBwd, 0, 1024, false), 0u);
  EXPECT_EQ(bytes(ops::kRmsNormBwd, 3, 8, false), 8 * sizeof(float));  // 3 rows: one block
  // Rows narrower than 8 (the general kernel's case; a division by zero on the GPU machine,
  // 2026-11-27): a partial row per block of the general kernel, as for any width.
  for (int64_t c : {1, 3, 7}) {
    const uint64_t one = bytes(ops::kLayerNormBwd, 1, c, true);
    EXPECT_GT(one, 0u) << c;
    EXPECT_EQ(one % (2 * c * sizeof(float)), 0u) << c;
    EXPECT_EQ(bytes(ops::kRmsNormBwd, 4096, c, false) % (c * sizeof(float)), 0u) << c;
  }
}

// The residual-add norms: `supports` and costs on shapes alone (the CPU kernels' costs), and
// the backward asks for the plain backward's workspace.
TEST(PointwiseAddNorms, SupportsCostsAndWorkspaceOnShapes) {
  const int64_t n = 5, c = 768;
  const DType bf = DType::kBF16, f = DType::kF32;
  Tensor x(bf, {n, c}), r(bf, {n, c}), w(bf, {c}), b(bf, {c}), y(bf, {n, c}), z(bf, {n, c}),
      stat(f, {n}), dz(bf, {n, c}), dx(bf, {n, c}), dw(f, {c}), db(f, {c});
  ops::NormAttrs at{1e-5f, 0};
  struct Call {
    const char* op;
    const char* plain;  // the plain backward with the same workspace, or null
    std::vector<Tensor*> in, out;
  };
  const std::vector<Call> calls = {
      {ops::kAddLayerNormFwd, nullptr, {&x, &r, &w, &b}, {&y, &z, &stat, &stat}},
      {ops::kAddRmsNormFwd, nullptr, {&x, &r, &w}, {&y, &z, &stat}},
      {ops::kAddLayerNormBwd, ops::kLayerNormBwd, {&y, &z, &w, &stat, &stat, &dz}, {&dx, &dw, &db}},
      {ops::kAddRmsNormBwd, ops::kRmsNormBwd, {&y, &z, &w, &stat, &dz}, {&dx, &dw}}};
  for (const Call& cl : calls) {
    CallHolder h(cl.in, cl.out, &at);
    for (TensorView& v : h.in) v.data = nullptr, v.device.type = DeviceType::kCuda;
    for (TensorView& v : h.out) v.data = nullptr, v.device.type = DeviceType::kCuda;
    const KernelDesc& k = cuda_kernel(cl.op, bf);
    EXPECT_TRUE(k.supports(&h.call)) << cl.op;
    OpCost got{}, want{};
    Status s = k.cost(&h.call, &got);
    ASSERT_EQ(s.code, Code::kOk) << cl.op << ": " << take_message(&s);
    CallHolder cpu(cl.in, cl.out, &at);
    s = kernel(cl.op, bf, "cpu.ref").cost(&cpu.call, &want);
    ASSERT_EQ(s.code, Code::kOk) << cl.op << ": " << take_message(&s);
    EXPECT_EQ(got.flops, want.flops) << cl.op;
    EXPECT_EQ(got.bytes_read, want.bytes_read) << cl.op;
    EXPECT_EQ(got.bytes_written, want.bytes_written) << cl.op;
    EXPECT_FALSE(k.supports(&cpu.call)) << cl.op << " accepted CPU tensors";
    if (cl.plain == nullptr) continue;
    // The plain backward's call: the same views less dZ.
    h.call.num_inputs -= 1;
    const uint64_t plain = cuda_kernel(cl.plain, bf).workspace(&h.call);
    h.call.num_inputs += 1;
    EXPECT_GT(plain, 0u) << cl.op;
    EXPECT_EQ(k.workspace(&h.call), plain) << cl.op;
  }
}

// ---- On the GPU ------------------------------------------------------------------------

bool has_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

#define REQUIRE_GPU() \
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device: the kernels are only compiled here"

void cuda_ok(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

// Device copies of host tensors, for one call; `shift` elements of padding before each
// tensor's data make every address unaligned for vector accesses.
class GpuCall {
 public:
  GpuCall(const std::vector<Tensor*>& in, const std::vector<Tensor*>& out, int shift)
      : host_in_(in), host_out_(out) {
    for (Tensor* t : in) views_in_.push_back(upload(t, shift));
    for (Tensor* t : out) views_out_.push_back(upload(t, shift));
  }
  ~GpuCall() {
    for (void* p : owned_) cudaFree(p);
  }
  // Y aliases X: output `o` gets input `i`'s memory.
  void alias(int o, int i) { views_out_[o].data = views_in_[i].data; }

  template <class A>
  Status run(const KernelDesc& k, const A* attrs, bool workspace) {
    OpCall call{};
    call.struct_size = sizeof(OpCall);
    call.inputs = views_in_.data();
    call.num_inputs = static_cast<int32_t>(views_in_.size());
    call.outputs = views_out_.data();
    call.num_outputs = static_cast<int32_t>(views_out_.size());
    call.attrs = std::is_same_v<A, NoAttrs> ? nullptr : attrs;
    call.attrs_size = std::is_same_v<A, NoAttrs> ? 0 : sizeof(A);
    if (workspace && k.workspace != nullptr) {
      call.workspace_bytes = k.workspace(&call);
      if (call.workspace_bytes > 0) {
        cudaMalloc(&call.workspace, call.workspace_bytes);
        owned_.push_back(call.workspace);
      }
    }
    Status s = k.fn(&call);
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT_EQ(e, cudaSuccess) << k.op << ": " << cudaGetErrorString(e);
    return s;
  }
  // Copies output `o` (or the aliased input) back into its host tensor.
  void download(int o) {
    Tensor* t = host_out_[o];
    cuda_ok(cudaMemcpy(t->raw(), views_out_[o].data, t->numel() * dtype_size(t->dtype()),
                       cudaMemcpyDeviceToHost),
            "cudaMemcpy D2H");
  }
  void download_all() {
    for (size_t o = 0; o < host_out_.size(); ++o)
      if (!host_out_[o]->empty()) download(static_cast<int>(o));
  }

 private:
  TensorView upload(Tensor* t, int shift) {
    TensorView v = t->view();
    v.device.type = DeviceType::kCuda;
    if (t->empty()) return v;
    size_t bytes = t->numel() * dtype_size(t->dtype()), pad = shift * dtype_size(t->dtype());
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, bytes + pad + 16), "cudaMalloc");
    owned_.push_back(p);
    v.data = static_cast<char*>(p) + pad;
    cuda_ok(cudaMemcpy(v.data, t->raw(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    return v;
  }

  std::vector<Tensor*> host_in_, host_out_;
  std::vector<TensorView> views_in_, views_out_;
  std::vector<void*> owned_;
};

struct GpuOptions {
  int shift = 0;          // unaligned addresses
  bool workspace = true;  // give the kernel the workspace it asks for
  int alias_out = -1;     // output that aliases input `alias_in`
  bool exact = false;     // outputs must equal the reference's bit for bit
  int alias_in = 0;       // the input that output `alias_out` aliases
};

// Runs cpu.ref and the cuda kernel of `op` on the same inputs and copies of the same
// initial outputs, and compares every output at the tolerance of `key`.
template <class A = NoAttrs>
void expect_cuda_matches_ref(const char* op, DType key, std::vector<Tensor> inputs,
                             const std::vector<Tensor>& outputs, const A* attrs,
                             const std::string& what, GpuOptions opt = {}) {
  std::vector<Tensor> ref_out = outputs, gpu_out = outputs;
  std::vector<Tensor*> in, ro, go;
  for (Tensor& t : inputs) in.push_back(&t);
  for (Tensor& t : ref_out) ro.push_back(&t);
  for (Tensor& t : gpu_out) go.push_back(&t);
  run(op, "cpu.ref", key, in, ro, attrs);
  GpuCall g(in, go, opt.shift);
  if (opt.alias_out >= 0) g.alias(opt.alias_out, opt.alias_in);
  Status s = g.run(cuda_kernel(op, key), attrs, opt.workspace);
  ASSERT_EQ(s.code, Code::kOk) << op << " " << what << ": " << take_message(&s);
  g.download_all();
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].empty()) continue;
    std::string label =
        std::string(op) + " " + dtype_name(key) + " output " + std::to_string(i) + " " + what;
    if (opt.exact) {
      ASSERT_EQ(std::memcmp(gpu_out[i].raw(), ref_out[i].raw(),
                            gpu_out[i].numel() * dtype_size(gpu_out[i].dtype())),
                0)
          << label << " differs from the CPU's bits";
    } else {
      expect_close(gpu_out[i], ref_out[i].values(), key, label);
    }
  }
}

class PointwiseGpu : public ::testing::TestWithParam<DType> {};

TEST_P(PointwiseGpu, ActivationsOnOddSizesAndUnalignedAddresses) {
  REQUIRE_GPU();
  std::mt19937 rng(1);
  DType dt = GetParam();
  for (int64_t n : {1, 7, 1000, 4099})
    for (int shift : {0, 1})
      for (int32_t approx : {0, 1}) {
        std::string what = "n " + std::to_string(n) + " shift " + std::to_string(shift) +
                           " approx " + std::to_string(approx);
        ops::GeluAttrs at{approx};
        Tensor x = Tensor::random(dt, {n}, rng, -6.0, 6.0), dy = Tensor::random(dt, {n}, rng);
        expect_cuda_matches_ref(ops::kGeluFwd, dt, {x}, {Tensor(dt, {n})}, &at, what, {shift});
        expect_cuda_matches_ref(ops::kGeluBwd, dt, {dy, x}, {Tensor(dt, {n})}, &at, what, {shift});
      }
  for (int64_t f : {1, 3, 8, 33, 1024})
    for (int shift : {0, 1}) {
      std::string what = "F " + std::to_string(f) + " shift " + std::to_string(shift);
      Tensor x = Tensor::random(dt, {5, 2 * f}, rng, -4.0, 4.0),
             dy = Tensor::random(dt, {5, f}, rng);
      expect_cuda_matches_ref(ops::kSwigluFwd, dt, {x}, {Tensor(dt, {5, f})},
                              static_cast<const NoAttrs*>(nullptr), what, {shift});
      expect_cuda_matches_ref(ops::kSwigluBwd, dt, {dy, x}, {Tensor(dt, {5, 2 * f})},
                              static_cast<const NoAttrs*>(nullptr), what, {shift});
    }
}

TEST_P(PointwiseGpu, DropoutMaskIsTheCpusBitForBit) {
  REQUIRE_GPU();
  std::mt19937 rng(2);
  DType dt = GetParam();
  for (int64_t n : {1, 5, 4099})
    for (float p : {0.0f, 0.1f, 0.5f})
      for (int shift : {0, 1}) {
        ops::DropoutAttrs at{p, 0x1234567890abcdefull, 0xfffffffffffffffdull};  // wraps
        std::string what = "n " + std::to_string(n) + " p " + std::to_string(p);
        Tensor x = Tensor::random(dt, {n}, rng);
        GpuOptions exact{shift, true, -1, true};
        expect_cuda_matches_ref(ops::kDropoutFwd, dt, {x}, {Tensor(dt, {n})}, &at, what, exact);
        expect_cuda_matches_ref(ops::kDropoutBwd, dt, {x}, {Tensor(dt, {n})}, &at, what, exact);
        GpuOptions in_place{shift, true, 0, true};
        expect_cuda_matches_ref(ops::kDropoutFwd, dt, {x}, {Tensor(dt, {n})}, &at,
                                what + " in place", in_place);
      }
}

TEST(PointwiseGpuLarge, DropoutPast2To31Elements) {
  REQUIRE_GPU();
  // 2^31 + 13 f16 elements (8 GiB in and out): zeros except a random head and tail, whose
  // outputs must equal the CPU's on the same elements (the tail as a call with the counter
  // advanced by start / 4).
  const int64_t n = (int64_t{1} << 31) + 13, head = 4099;
  const int64_t start = (n - 4099) / 4 * 4, tail = n - start;  // a Philox block boundary
  std::mt19937 rng(3);
  Tensor head_x = Tensor::random(DType::kF16, {head}, rng),
         tail_x = Tensor::random(DType::kF16, {tail}, rng);
  void *x = nullptr, *y = nullptr;
  size_t bytes = static_cast<size_t>(n) * 2;
  if (cudaMalloc(&x, bytes) != cudaSuccess || cudaMalloc(&y, bytes) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(x);
    GTEST_SKIP() << "not enough GPU memory for 2 x 4 GiB";
  }
  cuda_ok(cudaMemset(x, 0, bytes), "cudaMemset");
  cuda_ok(cudaMemcpy(x, head_x.raw(), head * 2, cudaMemcpyHostToDevice), "head");
  cuda_ok(
      cudaMemcpy(static_cast<char*>(x) + start * 2, tail_x.raw(), tail * 2, cudaMemcpyHostToDevice),
      "tail");
  ops::DropoutAttrs at{0.3f, 77, 1000};
  TensorView vx{}, vy{};
  vx.data = x, vy.data = y;
  vx.dtype = vy.dtype = DType::kF16;
  vx.device.type = vy.device.type = DeviceType::kCuda;
  vx.ndim = vy.ndim = 1;
  vx.shape[0] = vy.shape[0] = n;
  vx.strides[0] = vy.strides[0] = 1;
  OpCall call{sizeof(OpCall), &vx, 1, &vy, 1, &at, sizeof at, nullptr, nullptr, 0};
  Status s = cuda_kernel(ops::kDropoutFwd, DType::kF16).fn(&call);
  ASSERT_EQ(s.code, Code::kOk) << take_message(&s);
  cuda_ok(cudaDeviceSynchronize(), "dropout");
  Tensor head_y(DType::kF16, {head}), tail_y(DType::kF16, {tail});
  cuda_ok(cudaMemcpy(head_y.raw(), y, head * 2, cudaMemcpyDeviceToHost), "head back");
  cuda_ok(
      cudaMemcpy(tail_y.raw(), static_cast<char*>(y) + start * 2, tail * 2, cudaMemcpyDeviceToHost),
      "tail back");
  cudaFree(x);
  cudaFree(y);
  Tensor want_head(DType::kF16, {head}), want_tail(DType::kF16, {tail});
  run_ref(ops::kDropoutFwd, DType::kF16, {&head_x}, {&want_head}, &at);
  ops::DropoutAttrs tail_at{at.p, at.key, at.counter + static_cast<uint64_t>(start / 4)};
  run_ref(ops::kDropoutFwd, DType::kF16, {&tail_x}, {&want_tail}, &tail_at);
  EXPECT_EQ(std::memcmp(head_y.raw(), want_head.raw(), head * 2), 0);
  EXPECT_EQ(std::memcmp(tail_y.raw(), want_tail.raw(), tail * 2), 0);
}

TEST_P(PointwiseGpu, EmbeddingWholeAndSharded) {
  REQUIRE_GPU();
  std::mt19937 rng(4);
  DType dt = GetParam();
  for (auto [v, c, n] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 3}, {7, 33, 20}, {65, 300, 127}, {50, 768, 300}, {3, 4, 1000}})
    for (int shift : {0, 1}) {
      std::vector<int32_t> idv(n);
      for (auto& id : idv) id = static_cast<int32_t>(rng() % v);
      Tensor table = Tensor::random(dt, {v, c}, rng), ids = Tensor::i32({n}, idv);
      Tensor dy = Tensor::random(dt, {n, c}, rng),
             dtable = Tensor::random(DType::kF32, {v, c}, rng);
      std::string what = "V " + std::to_string(v) + " C " + std::to_string(c);
      expect_cuda_matches_ref(ops::kEmbeddingFwd, dt, {table, ids}, {Tensor(dt, {n, c})},
                              static_cast<const NoAttrs*>(nullptr), what, {shift});
      expect_cuda_matches_ref(ops::kEmbeddingBwd, dt, {dy, ids}, {dtable},
                              static_cast<const NoAttrs*>(nullptr), what, {shift});
      // This table as rows [v / 2, v) of a vocabulary of v + 3 rows: ids below v / 2 and in
      // [v, v + 3) are another shard's.
      ops::EmbeddingAttrs at{v / 2, v + 3};
      Tensor part = Tensor::random(dt, {v - v / 2, c}, rng), part_grad(DType::kF32, {v - v / 2, c});
      std::vector<int32_t> wide(n);
      for (auto& id : wide) id = static_cast<int32_t>(rng() % (v + 3));
      Tensor wide_ids = Tensor::i32({n}, wide);
      expect_cuda_matches_ref(ops::kEmbeddingFwd, dt, {part, wide_ids}, {Tensor(dt, {n, c})}, &at,
                              what + " sharded", {shift});
      expect_cuda_matches_ref(ops::kEmbeddingBwd, dt, {dy, wide_ids}, {part_grad}, &at,
                              what + " sharded", {shift});
    }
}

TEST(PointwiseGpuEmbedding, OutOfRangeIdsAreReportedOneCallLateOrByTheStatus) {
  REQUIRE_GPU();
  Status clean = cuda::embedding_id_status();  // nothing from earlier tests
  ASSERT_EQ(clean.code, Code::kOk) << take_message(&clean);
  Tensor table = Tensor::filled(DType::kF32, {5, 2}, 1.0), y(DType::kF32, {3, 2});
  Tensor bad = Tensor::i32({3}, {0, 5, -7}), good = Tensor::i32({3}, {0, 1, 4});
  const KernelDesc& fwd = cuda_kernel(ops::kEmbeddingFwd, DType::kF32);
  {
    GpuCall g({&table, &bad}, {&y}, 0);
    Status s = g.run(fwd, static_cast<const NoAttrs*>(nullptr), false);
    EXPECT_EQ(s.code, Code::kOk);  // found on the device: not known yet
    status_release(&s);
    g.download(0);
    EXPECT_EQ(y.values(), (std::vector<double>{1, 1, 0, 0, 0, 0}));  // bad rows are zeros
  }
  Status s = cuda::embedding_id_status();
  EXPECT_EQ(s.code, Code::kOutOfRange);
  EXPECT_EQ(
      take_message(&s).rfind("embedding_fwd: ids[1] = 5 is outside [0, 5) (the table's rows)", 0),
      0u);
  s = cuda::embedding_id_status();
  EXPECT_EQ(s.code, Code::kOk);  // reported once
  status_release(&s);
  // Without asking: the next call (synchronised here so that the flag is up) fails.
  ops::EmbeddingAttrs shard{3, 5};
  Tensor part = Tensor::filled(DType::kF32, {2, 2}, 1.0),
         dy = Tensor::filled(DType::kF32, {3, 2}, 1.0), dpart(DType::kF32, {2, 2});
  const KernelDesc& bwd = cuda_kernel(ops::kEmbeddingBwd, DType::kF32);
  {
    GpuCall g({&dy, &bad}, {&dpart}, 0);
    Status b = g.run(bwd, &shard, false);
    EXPECT_EQ(b.code, Code::kOk);
    status_release(&b);
  }
  GpuCall next({&table, &good}, {&y}, 0);
  Status n = next.run(fwd, static_cast<const NoAttrs*>(nullptr), false);
  EXPECT_EQ(n.code, Code::kOutOfRange);
  EXPECT_EQ(take_message(&n).rfind("embedding_bwd: ids[1] = 5 is outside [0, 5) (the vocabulary; "
                                   "this table holds its rows [3, 5))",
                                   0),
            0u);
  Status again = next.run(fwd, static_cast<const NoAttrs*>(nullptr), false);
  EXPECT_EQ(again.code, Code::kOk) << take_message(&again);
}

// Widths around every path: one warp, several teams per block, a full team, rows past the
// register capacity (8192 in the backward, 16384 in the forward), odd widths.
const std::vector<std::pair<int64_t, int64_t>> kNormShapes = {
    {1, 1}, {7, 33}, {33, 7}, {5, 127}, {3, 1000}, {67, 768}, {9, 4096}, {4, 8192}, {3, 20000}};

TEST_P(PointwiseGpu, NormsForwardAndBackward) {
  REQUIRE_GPU();
  std::mt19937 rng(5);
  DType dt = GetParam();
  for (auto [n, c] : kNormShapes)
    for (int32_t zc : {0, 1})
      for (int shift : {0, 1}) {
        std::string what = "N " + std::to_string(n) + " C " + std::to_string(c) + " zc " +
                           std::to_string(zc) + " shift " + std::to_string(shift);
        ops::NormAttrs at{1e-5f, zc};
        Tensor x = Tensor::random(dt, {n, c}, rng, -2.0, 3.0), w = Tensor::random(dt, {c}, rng);
        Tensor b = Tensor::random(dt, {c}, rng), dy = Tensor::random(dt, {n, c}, rng);
        Tensor mean(DType::kF32, {n}), rstd(DType::kF32, {n}), y(dt, {n, c}), none;
        run_ref(ops::kLayerNormFwd, dt, {&x, &w, &b}, {&y, &mean, &rstd}, &at);
        for (bool bias : {false, true}) {
          Tensor bb = bias ? b : Tensor();
          expect_cuda_matches_ref(ops::kLayerNormFwd, dt, {x, w, bb},
                                  {Tensor(dt, {n, c}), mean, rstd}, &at, what, {shift});
          for (bool ws : {false, true}) {
            Tensor dw = Tensor::random(DType::kF32, {c}, rng),
                   db = bias ? Tensor::random(DType::kF32, {c}, rng) : Tensor();
            expect_cuda_matches_ref(ops::kLayerNormBwd, dt, {dy, x, w, mean, rstd},
                                    {Tensor(dt, {n, c}), dw, db}, &at,
                                    what + (ws ? " workspace" : " atomics"), {shift, ws});
          }
        }
        Tensor rrstd(DType::kF32, {n});
        run_ref(ops::kRmsNormFwd, dt, {&x, &w}, {&y, &rrstd}, &at);
        expect_cuda_matches_ref(ops::kRmsNormFwd, dt, {x, w}, {Tensor(dt, {n, c}), rrstd}, &at,
                                what, {shift});
        for (bool ws : {false, true})
          expect_cuda_matches_ref(ops::kRmsNormBwd, dt, {dy, x, w, rrstd},
                                  {Tensor(dt, {n, c}), Tensor::random(DType::kF32, {c}, rng)}, &at,
                                  what + (ws ? " workspace" : " atomics"), {shift, ws});
      }
}

// The residual-add norms on the same shapes: the fused warp-per-row kernels (one dtype,
// C % 8 == 0 up to 2048, aligned, with the workspace) and the unfused
// sequence everywhere else (odd or wide rows, shift 1, no workspace); Z in its own
// buffer, over X and over R. cpu.ref runs the unfused ops (dX rounded before dZ is added),
// the fused kernel rounds once: both within the dtype's tolerance of each other.
TEST_P(PointwiseGpu, AddNormsForwardAndBackward) {
  REQUIRE_GPU();
  std::mt19937 rng(9);
  DType dt = GetParam();
  for (auto [n, c] : kNormShapes)
    for (int32_t zc : {0, 1})
      for (int shift : {0, 1}) {
        std::string what = "N " + std::to_string(n) + " C " + std::to_string(c) + " zc " +
                           std::to_string(zc) + " shift " + std::to_string(shift);
        ops::NormAttrs at{1e-5f, zc};
        Tensor x = Tensor::random(dt, {n, c}, rng, -2.0, 3.0), r = Tensor::random(dt, {n, c}, rng);
        Tensor w = Tensor::random(dt, {c}, rng), b = Tensor::random(dt, {c}, rng);
        Tensor dy = Tensor::random(dt, {n, c}, rng), dz = Tensor::random(dt, {n, c}, rng);
        Tensor mean(DType::kF32, {n}), rstd(DType::kF32, {n}), y(dt, {n, c}), z(dt, {n, c});
        run_ref(ops::kAddLayerNormFwd, dt, {&x, &r, &w, &b}, {&y, &z, &mean, &rstd}, &at);
        for (int z_at : {-1, 0, 1}) {  // Z's own buffer, over X (input 0), over R (input 1)
          GpuOptions opt{shift};
          opt.alias_out = z_at < 0 ? -1 : 1;
          opt.alias_in = z_at < 0 ? 0 : z_at;
          const std::string zw = z_at < 0 ? "" : z_at == 0 ? " Z=X" : " Z=R";
          for (bool bias : {false, true})
            expect_cuda_matches_ref(ops::kAddLayerNormFwd, dt, {x, r, w, bias ? b : Tensor()},
                                    {Tensor(dt, {n, c}), Tensor(dt, {n, c}), mean, rstd}, &at,
                                    what + zw, opt);
          expect_cuda_matches_ref(ops::kAddRmsNormFwd, dt, {x, r, w},
                                  {Tensor(dt, {n, c}), Tensor(dt, {n, c}), rstd}, &at, what + zw,
                                  opt);
        }
        for (bool ws : {false, true}) {
          const std::string how = what + (ws ? " workspace" : " atomics");
          for (bool bias : {false, true})
            expect_cuda_matches_ref(ops::kAddLayerNormBwd, dt, {dy, z, w, mean, rstd, dz},
                                    {Tensor(dt, {n, c}), Tensor::random(DType::kF32, {c}, rng),
                                     bias ? Tensor::random(DType::kF32, {c}, rng) : Tensor()},
                                    &at, how, {shift, ws});
          Tensor rrstd(DType::kF32, {n}), ry(dt, {n, c}), rz(dt, {n, c});
          run_ref(ops::kAddRmsNormFwd, dt, {&x, &r, &w}, {&ry, &rz, &rrstd}, &at);
          expect_cuda_matches_ref(ops::kAddRmsNormBwd, dt, {dy, rz, w, rrstd, dz},
                                  {Tensor(dt, {n, c}), Tensor::random(DType::kF32, {c}, rng)}, &at,
                                  how, {shift, ws});
        }
      }
}

TEST(PointwiseGpuNorms, WeightGradientsWithTheWorkspaceAreDeterministic) {
  REQUIRE_GPU();
  std::mt19937 rng(6);
  const int64_t n = 4096, c = 1024;
  DType dt = DType::kBF16;
  Tensor x = Tensor::random(dt, {n, c}, rng), w = Tensor::random(dt, {c}, rng),
         dy = Tensor::random(dt, {n, c}, rng), mean(DType::kF32, {n}), rstd(DType::kF32, {n}),
         y(dt, {n, c}), none;
  ops::NormAttrs at{1e-5f, 0};
  run_ref(ops::kLayerNormFwd, dt, {&x, &w, &none}, {&y, &mean, &rstd}, &at);
  std::vector<std::vector<uint8_t>> runs;
  for (int r = 0; r < 3; ++r) {
    Tensor dx(dt, {n, c}), dw(DType::kF32, {c}), db(DType::kF32, {c});
    GpuCall g({&dy, &x, &w, &mean, &rstd}, {&dx, &dw, &db}, 0);
    Status s = g.run(cuda_kernel(ops::kLayerNormBwd, dt), &at, true);
    ASSERT_EQ(s.code, Code::kOk) << take_message(&s);
    g.download(1);
    g.download(2);
    std::vector<uint8_t> bits(2 * c * sizeof(float));
    std::memcpy(bits.data(), dw.raw(), c * sizeof(float));
    std::memcpy(bits.data() + c * sizeof(float), db.raw(), c * sizeof(float));
    runs.push_back(bits);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(PointwiseGpuLarge, LayerNormPast2To31Elements) {
  REQUIRE_GPU();
  // (2^31 / 4096 + 3, 4096) bf16 rows, zeros but the last 3, which must match the CPU's.
  const int64_t c = 4096, n = (int64_t{1} << 31) / c + 3, last = 3;
  std::mt19937 rng(7);
  Tensor x = Tensor::random(DType::kBF16, {last, c}, rng, -2.0, 3.0),
         w = Tensor::random(DType::kBF16, {c}, rng);
  size_t bytes = static_cast<size_t>(n * c) * 2;
  void *dx = nullptr, *dyv = nullptr, *dw = nullptr, *dstat = nullptr;
  if (cudaMalloc(&dx, bytes) != cudaSuccess || cudaMalloc(&dyv, bytes) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(dx);
    GTEST_SKIP() << "not enough GPU memory for 2 x 4 GiB";
  }
  cuda_ok(cudaMalloc(&dw, c * 2), "w");
  cuda_ok(cudaMalloc(&dstat, 2 * n * sizeof(float)), "stats");
  cuda_ok(cudaMemset(dx, 0, bytes), "memset");
  cuda_ok(cudaMemcpy(static_cast<char*>(dx) + (n - last) * c * 2, x.raw(), last * c * 2,
                     cudaMemcpyHostToDevice),
          "x");
  cuda_ok(cudaMemcpy(dw, w.raw(), c * 2, cudaMemcpyHostToDevice), "w");
  auto view = [](void* p, DType t, std::vector<int64_t> shape) {
    return make_view(p, t, shape.data(), static_cast<int32_t>(shape.size()),
                     Device{DeviceType::kCuda, 0});
  };
  TensorView in[3] = {view(dx, DType::kBF16, {n, c}), view(dw, DType::kBF16, {c}), TensorView{}};
  TensorView out[3] = {view(dyv, DType::kBF16, {n, c}), view(dstat, DType::kF32, {n}),
                       view(static_cast<float*>(dstat) + n, DType::kF32, {n})};
  ops::NormAttrs at{1e-5f, 0};
  OpCall call{sizeof(OpCall), in, 3, out, 3, &at, sizeof at, nullptr, nullptr, 0};
  Status s = cuda_kernel(ops::kLayerNormFwd, DType::kBF16).fn(&call);
  ASSERT_EQ(s.code, Code::kOk) << take_message(&s);
  cuda_ok(cudaDeviceSynchronize(), "layernorm");
  Tensor got(DType::kBF16, {last, c});
  cuda_ok(cudaMemcpy(got.raw(), static_cast<char*>(dyv) + (n - last) * c * 2, last * c * 2,
                     cudaMemcpyDeviceToHost),
          "y");
  for (void* p : {dx, dyv, dw, dstat}) cudaFree(p);
  Tensor want(DType::kBF16, {last, c}), mean(DType::kF32, {last}), rstd(DType::kF32, {last}), none;
  run_ref(ops::kLayerNormFwd, DType::kBF16, {&x, &w, &none}, {&want, &mean, &rstd}, &at);
  expect_close(got, want.values(), DType::kBF16, "the last rows past 2^31 elements");
}

TEST_P(PointwiseGpu, RopeWithAndWithoutPositionsAndInPlace) {
  REQUIRE_GPU();
  std::mt19937 rng(8);
  DType dt = GetParam();
  for (auto [b, t, h, d, rot] : std::vector<std::array<int64_t, 5>>{{1, 1, 1, 2, 2},
                                                                    {2, 5, 3, 8, 8},
                                                                    {2, 7, 4, 16, 10},
                                                                    {1, 33, 8, 128, 128},
                                                                    {2, 3, 2, 64, 0}}) {
    std::vector<float> f(rot / 2);
    for (size_t i = 0; i < f.size(); ++i) f[i] = std::pow(10000.0f, -2.0f * i / rot);
    Tensor inv(DType::kF32, {rot / 2});
    for (int64_t i = 0; i < rot / 2; ++i) inv.set(i, f[i]);
    std::vector<int32_t> pv(b * t);
    for (auto& p : pv) p = static_cast<int32_t>(rng() % 8192);
    Tensor x = Tensor::random(dt, {b, t, h, d}, rng), pos = Tensor::i32({b, t}, pv), none;
    ops::RopeAttrs at{static_cast<int32_t>(rot)};
    std::string what = "D " + std::to_string(d) + " rotary " + std::to_string(rot);
    for (Tensor* p : {&none, &pos})
      for (const char* op : {ops::kRopeFwd, ops::kRopeBwd}) {
        expect_cuda_matches_ref(op, dt, {x, *p, inv}, {Tensor(dt, {b, t, h, d})}, &at, what);
        GpuOptions in_place;
        in_place.alias_out = 0;
        expect_cuda_matches_ref(op, dt, {x, *p, inv}, {Tensor(dt, {b, t, h, d})}, &at,
                                what + " in place", in_place);
      }
  }
}

TEST_P(PointwiseGpu, HeadLayouts) {
  REQUIRE_GPU();
  std::mt19937 rng(9);
  DType dt = GetParam();
  for (auto [b, t, h, g, d] : std::vector<std::array<int64_t, 5>>{
           {1, 1, 1, 1, 1}, {2, 3, 4, 2, 8}, {1, 5, 6, 3, 7}, {2, 4, 8, 8, 64}, {1, 2, 12, 4, 128}})
    for (int shift : {0, 1}) {
      std::string what = "H " + std::to_string(h) + " G " + std::to_string(g) + " D " +
                         std::to_string(d) + " shift " + std::to_string(shift);
      int64_t w = (h / g + 2) * d;
      Tensor x = Tensor::random(dt, {b, t, g, w}, rng);
      expect_cuda_matches_ref(
          ops::kSplitQkv, dt, {x},
          {Tensor(dt, {b, t, h, d}), Tensor(dt, {b, t, g, d}), Tensor(dt, {b, t, g, d})},
          static_cast<const NoAttrs*>(nullptr), what, {shift});
      // Mixed dtypes: Q in f32 (converted element by element).
      expect_cuda_matches_ref(
          ops::kSplitQkv, dt, {x},
          {Tensor(DType::kF32, {b, t, h, d}), Tensor(dt, {b, t, g, d}), Tensor(dt, {b, t, g, d})},
          static_cast<const NoAttrs*>(nullptr), what + " mixed", {shift});
      Tensor dq = Tensor::random(dt, {b, t, h, d}, rng), dk = Tensor::random(dt, {b, t, g, d}, rng),
             dv = Tensor::random(DType::kF32, {b, t, g, d}, rng);
      expect_cuda_matches_ref(ops::kMergeQkv, dt, {dq, dk, dv}, {Tensor(dt, {b, t, g, w})},
                              static_cast<const NoAttrs*>(nullptr), what + " mixed", {shift});
      Tensor s = Tensor::random(dt, {b, t, h, d}, rng);
      expect_cuda_matches_ref(ops::kSwapAxes12, dt, {s}, {Tensor(dt, {b, h, t, d})},
                              static_cast<const NoAttrs*>(nullptr), what, {shift, true, -1, true});
    }
  std::vector<int32_t> iv(2 * 3 * 5 * 3);
  for (auto& v : iv) v = static_cast<int32_t>(rng());
  Tensor xi = Tensor::i32({2, 3, 5, 3}, iv);
  expect_cuda_matches_ref(ops::kSwapAxes12, DType::kI32, {xi}, {Tensor(DType::kI32, {2, 5, 3, 3})},
                          static_cast<const NoAttrs*>(nullptr), "i32", {0, true, -1, true});
}

TEST_P(PointwiseGpu, MaskedSoftmax) {
  REQUIRE_GPU();
  std::mt19937 rng(10);
  DType dt = GetParam();
  for (auto [b, h, t, sk] : std::vector<std::array<int64_t, 4>>{{1, 1, 1, 1},
                                                                {2, 3, 7, 7},
                                                                {1, 2, 5, 9},
                                                                {2, 2, 9, 5},
                                                                {1, 4, 64, 64},
                                                                {1, 1, 3, 1000},
                                                                {1, 1, 2, 5000},
                                                                {1, 1, 3, 20000}})
    for (int32_t causal : {0, 1})
      for (int shift : {0, 1}) {
        std::string what = "T " + std::to_string(t) + " Sk " + std::to_string(sk) + " causal " +
                           std::to_string(causal);
        ops::SoftmaxAttrs at{0.3f, causal};
        Tensor s = Tensor::random(dt, {b, h, t, sk}, rng, -4.0, 4.0), none;
        expect_cuda_matches_ref(ops::kMaskedSoftmaxFwd, dt, {s, none}, {Tensor(dt, {b, h, t, sk})},
                                &at, what, {shift});
        if (t == sk) {
          std::vector<int32_t> seg(b * t);
          for (int64_t i = 0; i < b * t; ++i) seg[i] = static_cast<int32_t>(i % t * 3 / t);
          Tensor ids = Tensor::i32({b, t}, seg);
          expect_cuda_matches_ref(ops::kMaskedSoftmaxFwd, dt, {s, ids}, {Tensor(dt, {b, h, t, sk})},
                                  &at, what + " segments", {shift});
        }
        Tensor p(dt, {b, h, t, sk});
        run_ref(ops::kMaskedSoftmaxFwd, dt, {&s, &none}, {&p}, &at);
        Tensor dp = Tensor::random(dt, {b, h, t, sk}, rng);
        expect_cuda_matches_ref(ops::kMaskedSoftmaxBwd, dt, {dp, p}, {Tensor(dt, {b, h, t, sk})},
                                &at, what, {shift});
      }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PointwiseGpu, ::testing::ValuesIn(float_dtypes()),
                         dtype_param_name);

}  // namespace
}  // namespace loom::kernels::cpu::testing
