// The CUDA FP8 kernels on a GPU (sm_89 or later) against host references built from
// loom/cpp/fp8.h, independent of the CPU kernel library, and the fused rope_fp8_bwd against
// the CUDA rope_bwd then fp8_quantize it must equal:
//   fp8_quantize      bit for bit (NaN codes: NaN), every float dtype of X, both formats,
//                     each set of outputs, odd and tile-sized shapes, unaligned addresses,
//                     saturation, NaN and the amax it accumulates;
//   fp8_scale_update  bit for bit, both algorithms, a history row zeroed or not, columns
//                     whose amax is 0, infinite, NaN or so small that the scale overflows;
//   fp8_gemm          within the f32 accumulation's error, every operand format pair, f32
//                     and bf16 Y, beta 0 and 1, fast accumulation, K == 0;
//   rope_fp8_bwd      bit for bit against rope_bwd on the query and key heads then
//                     fp8_quantize, every float dtype, MHA and GQA, whole and partial rotary
//                     dimensions up to the table's 128 pairs, vector and element kernels; past
//                     them one clear error.
// Without such a GPU every test skips, saying why (the kernels are only compiled here).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <loom/cpp/error.h>
#include <loom/cpp/fp8.h>
#include <loom/cpp/half.h>
#include <loom/cpp/tensor.h>
#include <loom/kernel.h>
#include <loom/ops.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/optim/optim.h"
#include "kernels/cuda/pointwise/pointwise.h"

namespace loom::kernels::cuda {
namespace {

// Why the FP8 kernels cannot run here, or "" when they can.
std::string why_no_fp8_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return "no CUDA device: the kernels are only compiled here";
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major * 10 + minor < 89) return "device 0 is older than sm_89: no FP8";
  return "";
}

#define REQUIRE_FP8_GPU()                  \
  do {                                     \
    std::string why = why_no_fp8_gpu();    \
    if (!why.empty()) GTEST_SKIP() << why; \
  } while (0)

const KernelDesc& cuda_kernel(const char* op, DType key) {
  static const std::vector<KernelDesc> all = [] {
    std::vector<KernelDesc> out;
    add_gemm_kernels(out);
    add_optim_kernels(out);
    add_pointwise_kernels(out);
    return out;
  }();
  for (const KernelDesc& k : all)
    if (std::string(k.op) == op && k.dtype == key) return k;
  ADD_FAILURE() << "no cuda kernel for " << op << " (" << dtype_name(key) << ")";
  static const KernelDesc none{};
  return none;
}

// Host bytes of a tensor, copied to the device `shift` bytes past a 256-byte boundary.
struct Buffer {
  DType dtype = DType::kInvalid;
  std::vector<int64_t> shape;
  std::vector<unsigned char> host;
  void* base = nullptr;
  void* data = nullptr;

  Buffer() = default;
  Buffer(DType t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
    host.assign(static_cast<size_t>(numel()) * dtype_size(t), 0);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { cudaFree(base); }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  void upload(size_t shift = 0) {
    ASSERT_EQ(cudaMalloc(&base, host.size() + shift + 256), cudaSuccess);
    data = static_cast<unsigned char*>(base) + shift;
    ASSERT_EQ(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  void download() {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), data, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  TensorView view() const {
    const Device cuda{DeviceType::kCuda, 0};
    if (dtype == DType::kInvalid) {  // an absent optional
      TensorView v{};
      v.device = cuda;
      return v;
    }
    return make_view(data, dtype, shape.data(), static_cast<int32_t>(shape.size()), cuda);
  }
  float* f32() { return reinterpret_cast<float*>(host.data()); }
  // Element i of a float tensor, as f32 (exact).
  float get(int64_t i) const {
    uint16_t h;
    switch (dtype) {
      case DType::kBF16:
        std::memcpy(&h, host.data() + 2 * i, 2);
        return bf16_to_f32(h);
      case DType::kF16:
        std::memcpy(&h, host.data() + 2 * i, 2);
        return f16_to_f32(h);
      default: {
        float f;
        std::memcpy(&f, host.data() + 4 * i, 4);
        return f;
      }
    }
  }
  // Stores v rounded to the dtype.
  void set(int64_t i, float v) {
    uint16_t h;
    switch (dtype) {
      case DType::kBF16:
        h = f32_to_bf16(v);
        std::memcpy(host.data() + 2 * i, &h, 2);
        break;
      case DType::kF16:
        h = f32_to_f16(v);
        std::memcpy(host.data() + 2 * i, &h, 2);
        break;
      default:
        std::memcpy(host.data() + 4 * i, &v, 4);
        break;
    }
  }
};

template <class A>
Status call_views(const char* op, DType key, std::vector<TensorView> vin,
                  std::vector<TensorView> vout, const A* attrs) {
  OpCall c{};
  c.struct_size = sizeof(OpCall);
  c.inputs = vin.data();
  c.num_inputs = static_cast<int32_t>(vin.size());
  c.outputs = vout.data();
  c.num_outputs = static_cast<int32_t>(vout.size());
  c.attrs = attrs;
  c.attrs_size = attrs != nullptr ? sizeof(A) : 0;
  const KernelDesc& k = cuda_kernel(op, key);
  if (k.fn == nullptr) return make_status(Code::kNotFound, "no kernel");
  EXPECT_TRUE(k.supports(&c)) << op << " declines the call";
  return k.fn(&c);
}
template <class A>
Status call(const char* op, DType key, const std::vector<Buffer*>& in,
            const std::vector<Buffer*>& out, const A* attrs) {
  std::vector<TensorView> vin, vout;
  for (Buffer* b : in) vin.push_back(b->view());
  for (Buffer* b : out) vout.push_back(b->view());
  return call_views(op, key, vin, vout, attrs);
}

bool is_nan_code(uint8_t code, DType t) { return std::isnan(fp8_to_f32(code, t)); }

// Device codes equal the reference's, NaN for NaN.
void expect_codes(const Buffer& got, const std::vector<uint8_t>& want, const std::string& what) {
  ASSERT_EQ(got.host.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const uint8_t g = got.host[i], w = want[i];
    const bool ok = g == w || (is_nan_code(g, got.dtype) && is_nan_code(w, got.dtype));
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << what << ": byte " << i << " is 0x" << std::hex << int{g} << ", expected 0x"
                    << int{w} << std::dec;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " bytes differ";
}

// ---- fp8_quantize ----------------------------------------------------------------------

struct QuantizeCase {
  int64_t m, k;
  bool y, yt, amax;
  size_t shift;  // bytes before X's, Y's and Yt's data (unaligned when not a multiple of 16)
};

void check_quantize(DType xt, DType ft, const QuantizeCase& c, bool specials, std::mt19937& rng) {
  const std::string what = std::string(dtype_name(xt)) + " -> " + dtype_name(ft) + " (" +
                           std::to_string(c.m) + ", " + std::to_string(c.k) + ")" +
                           (c.y ? " Y" : "") + (c.yt ? " Yt" : "") + (c.amax ? " amax" : "") +
                           " shift " + std::to_string(c.shift) + (specials ? " specials" : "");
  // Scaled values of the format's range (a third saturating) and, every third element, of its
  // smallest normal (subnormal codes and their rounding).
  const Fp8Format format = fp8_format(ft);
  const float fmax = format.max, min_normal = std::ldexp(1.0f, 1 - format.bias);
  Buffer x(xt, {c.m, c.k}), scale(DType::kF32, {1});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = c.m * c.k;
  for (int64_t i = 0; i < n; ++i) x.set(i, normal(rng) * (i % 3 ? fmax : min_normal) / 4.0f);
  if (specials && n >= 8) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    const float s[] = {inf, -inf, 3.0f * fmax, -fmax * 1.01f, 1e-30f, -0.0f, -nan, nan};
    for (int j = 0; j < 8; ++j) x.set((j * 7919) % n, s[j]);
  }
  scale.f32()[0] = 4.0f;

  // Absent outputs have no dtype (empty views).
  Buffer y(c.y ? ft : DType::kInvalid, {c.m, c.k}), yt(c.yt ? ft : DType::kInvalid, {c.k, c.m}),
      amax(c.amax ? DType::kF32 : DType::kInvalid, {1});
  const float amax0 = 0.5f;
  if (c.amax) amax.f32()[0] = amax0;
  x.upload(c.shift * dtype_size(xt));
  scale.upload();
  if (c.y) y.upload(c.shift);
  if (c.yt) yt.upload(c.shift);
  if (c.amax) amax.upload();
  Status st =
      call(ops::kFp8Quantize, xt, {&x, &scale}, {&y, &yt, &amax}, static_cast<const int*>(nullptr));
  ASSERT_EQ(st.code, Code::kOk) << what << ": " << take_message(&st);

  std::vector<uint8_t> want_y(static_cast<size_t>(n)), want_yt(static_cast<size_t>(n));
  float want_amax = amax0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x.get(i);
    const uint8_t code = f32_to_fp8(v * scale.f32()[0], ft);
    want_y[i] = code;
    want_yt[(i % c.k) * c.m + i / c.k] = code;
    if (!std::isnan(want_amax) && (std::isnan(v) || std::fabs(v) > want_amax))
      want_amax = std::fabs(v);  // NaN propagates
  }
  if (c.y) {
    y.download();
    expect_codes(y, want_y, what + " Y");
  }
  if (c.yt) {
    yt.download();
    expect_codes(yt, want_yt, what + " Yt");
  }
  if (c.amax) {
    amax.download();
    const float got = amax.f32()[0];
    if (std::isnan(want_amax))
      EXPECT_TRUE(std::isnan(got)) << what << ": amax " << got << ", expected NaN";
    else
      EXPECT_EQ(got, want_amax) << what;
  }
}

class Fp8QuantizeGpu : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8QuantizeGpu, EveryOutputSetShapeAndAlignmentBitForBit) {
  REQUIRE_FP8_GPU();
  std::mt19937 rng(7);
  const QuantizeCase cases[] = {
      {1, 1, true, true, true, 0},
      {3, 5, true, false, true, 0},
      {3, 5, false, true, true, 1},
      {64, 64, true, true, true, 0},
      {65, 130, true, true, true, 0},
      {65, 130, true, true, false, 3},
      {128, 256, false, true, false, 0},
      {200, 3, true, true, true, 0},
      {17, 64, true, false, false, 1},
      {4096, 48, true, true, true, 0},
      // The typed transpose kernel on partial tiles (M % 16 == 0, K a multiple of 8).
      {80, 136, true, true, true, 0},
      {0, 8, true, true, true, 0},
      // More tiles (1056) and chunks than the launches have blocks: the grid-stride loops.
      {2048, 2112, true, true, true, 0},
      {2048, 2112, true, false, true, 0},
  };
  for (DType ft : {DType::kF8E4M3, DType::kF8E5M2})
    for (const QuantizeCase& c : cases)
      for (bool specials : {false, true}) check_quantize(GetParam(), ft, c, specials, rng);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Fp8QuantizeGpu,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// ---- rope_fp8_bwd ------------------------------------------------------------------------

// rope_fp8_bwd against its contract on the device: rope_bwd (the CUDA library's, its typed
// kernel) on the query and key heads of dX in place, as strided views of the grouped layout,
// then fp8_quantize of the whole (B T, G (H/G + 2) D) matrix: the same codes of Y and Yt, bit
// for bit, and the same amax.
struct RopeFp8Case {
  int64_t b, t, g, per_group, d, rotary;  // per_group: H/G query heads
  bool positions, y;
  DType ft;
};

// A (B, T, heads, D) view of `x` (B, T, G, W) from channel `offset` of each row, heads
// `head_stride` elements apart.
TensorView heads_view(const Buffer& x, int64_t offset, int64_t heads, int64_t head_stride,
                      int64_t d) {
  const int64_t b = x.shape[0], t = x.shape[1], g = x.shape[2], w = x.shape[3];
  const int64_t shape[4] = {b, t, heads, d};
  TensorView v = make_view(static_cast<char*>(x.data) + offset * dtype_size(x.dtype), x.dtype,
                           shape, 4, Device{DeviceType::kCuda, 0});
  v.strides[0] = t * g * w;
  v.strides[1] = g * w;
  v.strides[2] = head_stride;
  v.strides[3] = 1;
  return v;
}

void check_rope_fp8(DType xt, const RopeFp8Case& c, std::mt19937& rng) {
  const int64_t heads = c.per_group + 2, w = heads * c.d, m = c.b * c.t, k = c.g * w,
                half = c.rotary / 2;
  const std::string what = std::string(dtype_name(xt)) + " -> " + dtype_name(c.ft) + " B " +
                           std::to_string(c.b) + " T " + std::to_string(c.t) + " G " +
                           std::to_string(c.g) + " H/G " + std::to_string(c.per_group) + " D " +
                           std::to_string(c.d) + " rotary " + std::to_string(c.rotary) +
                           (c.positions ? " positions" : "") + (c.y ? " Y" : "") + " Yt";
  Buffer x(xt, {c.b, c.t, c.g, w}), turned(xt, {c.b, c.t, c.g, w}),
      pos(c.positions ? DType::kI32 : DType::kInvalid, {c.b, c.t}), freq(DType::kF32, {half}),
      scale(DType::kF32, {1});
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, u(rng));
  x.set(k - 1, 3000.0f);      // a value channel past E4M3's range with the scale
  x.set(m / 2 * k, 2000.0f);  // a query channel, turned into its partner
  turned.host = x.host;
  if (c.positions)
    for (int64_t i = 0; i < m; ++i) {
      const int32_t p = static_cast<int32_t>(rng() % 100000);
      std::memcpy(pos.host.data() + 4 * i, &p, 4);
    }
  for (int64_t i = 0; i < half; ++i)
    freq.f32()[i] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / c.rotary));
  scale.f32()[0] = 0.75f;
  x.upload();
  turned.upload();
  if (c.positions) pos.upload();
  freq.upload();
  scale.upload();

  // The oracle: rope_bwd on each group's query heads and on the key heads, in place.
  const ops::RopeAttrs ra{static_cast<int32_t>(c.rotary)};
  if (half > 0) {
    for (int64_t g = 0; g < c.g; ++g) {
      const TensorView q = heads_view(turned, g * w, c.per_group, c.d, c.d);
      Status st = call_views(ops::kRopeBwd, xt, {q, pos.view(), freq.view()}, {q}, &ra);
      ASSERT_EQ(st.code, Code::kOk) << what << ": rope_bwd on q: " << take_message(&st);
    }
    const TensorView kh = heads_view(turned, c.per_group * c.d, c.g, w, c.d);
    Status st = call_views(ops::kRopeBwd, xt, {kh, pos.view(), freq.view()}, {kh}, &ra);
    ASSERT_EQ(st.code, Code::kOk) << what << ": rope_bwd on k: " << take_message(&st);
  }
  Buffer want_y(c.y ? c.ft : DType::kInvalid, {m, k}), want_yt(c.ft, {k, m}),
      want_amax(DType::kF32, {1}), got_y(c.y ? c.ft : DType::kInvalid, {m, k}),
      got_yt(c.ft, {k, m}), got_amax(DType::kF32, {1});
  want_amax.f32()[0] = got_amax.f32()[0] = 0.25f;
  for (Buffer* b : {&want_y, &want_yt, &want_amax, &got_y, &got_yt, &got_amax})
    if (b->dtype != DType::kInvalid) b->upload();
  TensorView rows = turned.view();  // (B T, K), as fp8_quantize reads it
  rows.ndim = 2;
  rows.shape[0] = m;
  rows.shape[1] = k;
  rows.strides[0] = k;
  rows.strides[1] = 1;
  Status st = call_views(ops::kFp8Quantize, xt, {rows, scale.view()},
                         {want_y.view(), want_yt.view(), want_amax.view()},
                         static_cast<const int*>(nullptr));
  ASSERT_EQ(st.code, Code::kOk) << what << ": fp8_quantize: " << take_message(&st);

  const ops::RopeFp8Attrs fa{static_cast<int32_t>(c.rotary), static_cast<int32_t>(c.d)};
  st = call(ops::kRopeFp8Bwd, xt, {&x, &pos, &freq, &scale}, {&got_y, &got_yt, &got_amax}, &fa);
  ASSERT_EQ(st.code, Code::kOk) << what << ": " << take_message(&st);
  for (Buffer* b : {&want_y, &want_yt, &want_amax, &got_y, &got_yt, &got_amax})
    if (b->dtype != DType::kInvalid) b->download();
  const std::vector<uint8_t> wy(want_y.host.begin(), want_y.host.end()),
      wyt(want_yt.host.begin(), want_yt.host.end());
  if (c.y) expect_codes(got_y, wy, what + " Y");
  expect_codes(got_yt, wyt, what + " Yt");
  EXPECT_EQ(got_amax.f32()[0], want_amax.f32()[0]) << what << " amax";
  turned.download();
  int64_t moved = 0;  // elements the oracle turned
  for (int64_t i = 0; i < x.numel(); ++i) moved += x.get(i) != turned.get(i);
  if (half > 0) {
    EXPECT_GT(moved, m * k / 8) << what << ": the oracle turned too little";
  }
  std::printf("rope_fp8_bwd %s: %lld codes bit-identical to rope_bwd + fp8_quantize\n",
              what.c_str(), static_cast<long long>(m * k));
}

// Shapes: LLaMA's (D = 128, all of it rotated) over more tiles than the grid has blocks, so
// that blocks take runs of tiles across bands of 64 rows; GQA with a partial rotary dimension;
// the table's widest rows (D = 256: 96 pairs, 48 KiB of dynamic shared memory beside the static
// tile, past the 48 KiB a kernel gets without opting in; 128 pairs, 64 KiB); the element-wise
// kernel (half and M not multiples of a chunk, of 16).
TEST(RopeFp8Gpu, TheBitsOfRopeBwdThenFp8Quantize) {
  REQUIRE_FP8_GPU();
  std::mt19937 rng(23);
  const RopeFp8Case cases[] = {
      {4, 512, 4, 1, 128, 128, false, true, DType::kF8E5M2},
      {4, 1024, 2, 3, 128, 64, true, false, DType::kF8E4M3},
      {1, 2048, 2, 1, 256, 192, true, true, DType::kF8E5M2},
      {2, 512, 1, 2, 256, 256, false, true, DType::kF8E4M3},
      {1, 1000, 3, 2, 96, 40, true, true, DType::kF8E5M2},
  };
  for (DType xt : {DType::kBF16, DType::kF16, DType::kF32})
    for (const RopeFp8Case& c : cases) check_rope_fp8(xt, c, rng);
}

// Past the table's 128 pairs the op fails and names the two-kernel path.
TEST(RopeFp8Gpu, RotaryDimensionPastTheTableIsOneClearError) {
  REQUIRE_FP8_GPU();
  const int64_t d = 512, w = 3 * d;
  Buffer x(DType::kBF16, {1, 16, 1, w}), none, freq(DType::kF32, {d / 2}), scale(DType::kF32, {1}),
      yt(DType::kF8E5M2, {w, 16});
  scale.f32()[0] = 1.0f;
  for (Buffer* b : {&x, &freq, &scale, &yt}) b->upload();
  const ops::RopeFp8Attrs fa{static_cast<int32_t>(d), static_cast<int32_t>(d)};
  Buffer no_y, no_amax;
  Status st =
      call(ops::kRopeFp8Bwd, DType::kBF16, {&x, &none, &freq, &scale}, {&no_y, &yt, &no_amax}, &fa);
  ASSERT_EQ(st.code, Code::kUnimplemented);
  const std::string msg = take_message(&st);
  EXPECT_NE(msg.find("rope_fp8_bwd: rotary_dim 512 is past this kernel's 256"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("{\"rope_fp8_bwd\": \"none\"}"), std::string::npos) << msg;
}

// ---- fp8_scale_update ------------------------------------------------------------------

TEST(Fp8ScaleUpdateGpu, BothAlgorithmsBitForBit) {
  REQUIRE_FP8_GPU();
  const int64_t rows = 5, q = 300;  // more quantisers than one block of threads
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.01f, 100.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int32_t algo : {0, 1})
    for (int32_t next : {-1, 3})
      for (float margin : {0.0f, 1.0f, 0.5f}) {
        const std::string what = "algo " + std::to_string(algo) + " next " + std::to_string(next) +
                                 " margin " + std::to_string(margin);
        Buffer fmax(DType::kF32, {q}), history(DType::kF32, {rows, q}), scale(DType::kF32, {q}),
            scale_inv(DType::kF32, {q});
        for (int64_t j = 0; j < q; ++j) {
          fmax.f32()[j] = j % 2 ? 57344.0f : 448.0f;
          scale.f32()[j] = 1.0f + static_cast<float>(j % 7);
          scale_inv.f32()[j] = -1.0f;
          for (int64_t l = 0; l < rows; ++l) history.f32()[l * q + j] = u(rng);
        }
        const int32_t current = 2;
        for (int64_t l = 0; l < rows; ++l) history.f32()[l * q + 10] = 0.0f;  // all zero: keep
        history.f32()[current * q + 11] = inf;                                // keep
        history.f32()[1 * q + 12] = nan;           // algo 0 keeps; algo 1 reads row 2
        history.f32()[current * q + 13] = 1e-38f;  // 448 / 1e-38 overflows: FLT_MAX
        for (int64_t l = 0; l < rows; ++l) history.f32()[l * q + 14] = 1e-38f;
        const std::vector<float> before =
            std::vector<float>(history.f32(), history.f32() + rows * q);
        const std::vector<float> scale0 = std::vector<float>(scale.f32(), scale.f32() + q);
        fmax.upload();
        history.upload();
        scale.upload();
        scale_inv.upload();
        const ops::Fp8ScaleAttrs at{algo, current, next, margin};
        Status st =
            call(ops::kFp8ScaleUpdate, DType::kF32, {&fmax}, {&history, &scale, &scale_inv}, &at);
        ASSERT_EQ(st.code, Code::kOk) << what << ": " << take_message(&st);
        history.download();
        scale.download();
        scale_inv.download();
        const float pow2 = static_cast<float>(std::exp2(static_cast<double>(margin)));
        for (int64_t j = 0; j < q; ++j) {
          float amax = before[current * q + j];
          if (algo == 0) {
            amax = before[j];
            for (int64_t l = 1; l < rows; ++l) {
              const float h = before[l * q + j];
              if (std::isnan(h) || (!std::isnan(amax) && h > amax)) amax = h;
            }
          }
          float s = scale0[j];
          if (std::isfinite(amax) && amax > 0.0f) {
            const float fresh = fmax.f32()[j] / amax / pow2;
            s = std::isinf(fresh) ? FLT_MAX : fresh;
          }
          EXPECT_EQ(scale.f32()[j], s) << what << " quantiser " << j;
          EXPECT_EQ(scale_inv.f32()[j], 1.0f / s) << what << " quantiser " << j;
          for (int64_t l = 0; l < rows; ++l) {
            const float want = l == next ? 0.0f : before[l * q + j];
            const float got = history.f32()[l * q + j];
            EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
                << what << " history[" << l << ", " << j << "] = " << got;
          }
        }
        EXPECT_EQ(scale.f32()[14], FLT_MAX) << what << ": 448 / 1e-38 overflows";
        EXPECT_EQ(scale.f32()[10], scale0[10]) << what << ": an all-zero column keeps its scale";
      }
}

// ---- fp8_gemm --------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  DType a, b, y;
  float alpha, beta;
  int32_t fast_accum;
  size_t shift_a;  // bytes before A's data: 16 tests alignment below 256
};

void check_gemm(const GemmCase& c, std::mt19937& rng) {
  const std::string what = std::string(dtype_name(c.a)) + " x " + dtype_name(c.b) + " -> " +
                           dtype_name(c.y) + " (" + std::to_string(c.m) + ", " +
                           std::to_string(c.n) + ", " + std::to_string(c.k) + ") beta " +
                           std::to_string(c.beta) + " fast " + std::to_string(c.fast_accum);
  Buffer a(c.a, {c.m, c.k}), b(c.b, {c.n, c.k}), sa(DType::kF32, {1}), sb(DType::kF32, {1}),
      y(c.y, {c.m, c.n});
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (auto& byte : a.host) byte = f32_to_fp8(u(rng), c.a);
  for (auto& byte : b.host) byte = f32_to_fp8(u(rng), c.b);
  sa.f32()[0] = 2.0f;
  sb.f32()[0] = 0.25f;
  for (int64_t i = 0; i < c.m * c.n; ++i) y.set(i, u(rng));
  std::vector<float> y0(static_cast<size_t>(c.m * c.n));
  for (int64_t i = 0; i < c.m * c.n; ++i) y0[i] = y.get(i);
  a.upload(c.shift_a);
  b.upload();
  sa.upload();
  sb.upload();
  y.upload();
  const ops::Fp8GemmAttrs at{c.alpha, c.beta, c.fast_accum};
  Status st = call(ops::kFp8Gemm, c.a, {&a, &b, &sa, &sb}, {&y}, &at);
  ASSERT_EQ(st.code, Code::kOk) << what << ": " << take_message(&st);
  y.download();
  // Products are exact. FP8 tensor cores add in reduced precision (about 14 mantissa bits)
  // between promotions to f32, which fast accumulation leaves out: errors of a few 2^-14 of
  // sum |terms| without it, up to about a percent with it. A wrong layout errs by about
  // 1 / sqrt(K) of sum |terms| (over 4% for K <= 512). A bf16 / f16 Y adds one rounding.
  const double rel = c.fast_accum ? 2e-2 : 5e-3;
  const double out_rel = c.y == DType::kBF16 ? 1.0 / 256 : c.y == DType::kF16 ? 1.0 / 2048 : 0.0;
  int64_t bad = 0;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double t = static_cast<double>(fp8_to_f32(a.host[i * c.k + l], c.a)) *
                         fp8_to_f32(b.host[j * c.k + l], c.b);
        sum += t;
        mag += std::fabs(t);
      }
      const double scale = static_cast<double>(c.alpha) * sa.f32()[0] * sb.f32()[0];
      const double want = scale * sum + static_cast<double>(c.beta) * y0[i * c.n + j];
      const double tol = rel * (std::fabs(scale) * mag + std::fabs(c.beta * y0[i * c.n + j])) +
                         out_rel * std::fabs(want) + 1e-6;
      const double got = y.get(i * c.n + j);
      if (!(std::fabs(got - want) <= tol) && ++bad <= 5)
        ADD_FAILURE() << what << ": Y[" << i << ", " << j << "] = " << got << ", expected " << want
                      << " (tolerance " << tol << ")";
    }
  EXPECT_EQ(bad, 0) << what;
}

TEST(Fp8GemmGpu, EveryFormatPairOutputAndBeta) {
  REQUIRE_FP8_GPU();
  std::mt19937 rng(11);
  const DType e4 = DType::kF8E4M3, e5 = DType::kF8E5M2, f32 = DType::kF32, bf = DType::kBF16;
  const GemmCase cases[] = {
      {48, 32, 64, e4, e4, f32, 1.0f, 0.0f, 0, 0},
      {48, 32, 64, e4, e5, bf, 0.5f, 0.0f, 0, 0},
      {33, 16, 128, e5, e4, f32, 1.0f, 1.0f, 0, 16},
      {33, 16, 128, e4, e4, bf, 1.0f, 1.0f, 0, 0},
      {256, 64, 512, e4, e4, f32, 1.0f, 0.0f, 1, 0},
      {5, 8, 16, e4, e4, DType::kF16, 1.0f, 0.0f, 0, 0},
      {7, 4, 0, e4, e4, f32, 1.0f, 0.5f, 0, 0},  // K == 0: Y = beta * Y
  };
  for (const GemmCase& c : cases) check_gemm(c, rng);
}

}  // namespace
}  // namespace loom::kernels::cuda
