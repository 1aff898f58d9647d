// The kernel list: every op of loom/ops.h has a reference and a fast kernel for f32, bf16
// and f16 (f32 alone for an op keyed on an always-f32 input, FP8 for fp8_gemm; f64 too for
// the fp64 router's ops: gemm, add, cast, moe_topk, moe_topk_bwd), descriptors are
// well formed and unambiguous, the plugin manifest lists exactly these kernels, and the ops that
// MFU counts have a cost model.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "tests/kernels/cpu/op_test_util.h"

namespace loom::kernels::cpu::testing {
namespace {

const std::vector<const char*> kAllOps = {
    ops::kGemm,
    ops::kGemmEpilogue,
    ops::kAdd,
    ops::kBiasAdd,
    ops::kBiasGrad,
    ops::kCast,
    ops::kScale,
    ops::kSumSq,
    ops::kSumSqMulti,
    ops::kAmax,
    ops::kGeluFwd,
    ops::kGeluBwd,
    ops::kSwigluFwd,
    ops::kSwigluBwd,
    ops::kDropoutFwd,
    ops::kDropoutBwd,
    ops::kEmbeddingFwd,
    ops::kEmbeddingBwd,
    ops::kLayerNormFwd,
    ops::kLayerNormBwd,
    ops::kRmsNormFwd,
    ops::kRmsNormBwd,
    ops::kAddLayerNormFwd,
    ops::kAddLayerNormBwd,
    ops::kAddRmsNormFwd,
    ops::kAddRmsNormBwd,
    ops::kRopeFwd,
    ops::kRopeBwd,
    ops::kSwapAxes12,
    ops::kSplitQkv,
    ops::kMergeQkv,
    ops::kMaskedSoftmaxFwd,
    ops::kMaskedSoftmaxBwd,
    ops::kAttentionFwd,
    ops::kAttentionBwd,
    ops::kAttentionMerge,
    ops::kCrossEntropyFwd,
    ops::kCrossEntropyBwd,
    ops::kCrossEntropyFwdBwd,
    ops::kCrossEntropyShardStats,
    ops::kCrossEntropyCombine,
    ops::kMaskedSum,
    ops::kAdamWStep,
    ops::kAdamWStepMulti,
    ops::kSgdStep,
    ops::kGradNormClip,
    ops::kFp8Quantize,
    ops::kSwigluFp8Fwd,
    ops::kSwigluFp8Bwd,
    ops::kRopeFp8Bwd,
    ops::kFp8Gemm,
    ops::kFp8ScaleUpdate,
    ops::kMoeTopk,
    ops::kMoeTopkBwd,
    ops::kMoePermute,
    ops::kMoeUnpermute,
    ops::kMoeUnpermuteBwd,
    ops::kGroupedGemm,
    ops::kGroupedGemmWgrad,
    ops::kCausalConv1d,
    ops::kCausalConv1dBwd,
    ops::kSsdScan,
    ops::kSsdScanBwd,
    ops::kRmsNormGated,
    ops::kRmsNormGatedBwd,
    ops::kMlaQkv,
    ops::kMlaQkvBwd,
    ops::kMlaOut,
    ops::kMlaOutBwd,
};

// The dtypes an op is keyed on: every float dtype, f32 alone for an op keyed on an
// always-f32 input whatever the model's dtype, the two FP8 formats for fp8_gemm, and f64 for
// the ops of the fp64 router (f32 and f64 for its top-k) and for grad_norm_clip (the f64
// step scalars).
std::vector<DType> key_dtypes(const char* op) {
  std::string name = op;
  if (name == ops::kMoeTopk || name == ops::kMoeTopkBwd) return {DType::kF32, DType::kF64};
  if (name == ops::kGemm || name == ops::kAdd || name == ops::kCast)
    return {DType::kF32, DType::kBF16, DType::kF16, DType::kF64};
  if (name == ops::kCrossEntropyCombine || name == ops::kFp8ScaleUpdate || name == ops::kMaskedSum)
    return {DType::kF32};
  if (name == ops::kFp8Gemm) return {DType::kF8E4M3, DType::kF8E5M2};
  if (name == ops::kGradNormClip) return {DType::kF64};
  return float_dtypes();
}

TEST(Registry, EveryOpHasReferenceAndFastForEachKeyDtype) {
  const std::vector<DType> all = {DType::kF32, DType::kBF16,   DType::kF16,
                                  DType::kF64, DType::kF8E4M3, DType::kF8E5M2};
  for (const char* op : kAllOps)
    for (DType dt : all) {
      std::vector<DType> keys = key_dtypes(op);
      if (std::find(keys.begin(), keys.end(), dt) == keys.end()) {
        EXPECT_EQ(find_kernel(op, dt, "cpu.ref"), nullptr) << op << " " << dtype_name(dt);
        EXPECT_EQ(find_kernel(op, dt, "cpu.fast"), nullptr) << op << " " << dtype_name(dt);
        continue;
      }
      const KernelDesc* ref = find_kernel(op, dt, "cpu.ref");
      const KernelDesc* fast = find_kernel(op, dt, "cpu.fast");
      ASSERT_NE(ref, nullptr) << op << " " << dtype_name(dt);
      ASSERT_NE(fast, nullptr) << op << " " << dtype_name(dt);
      EXPECT_EQ(ref->priority, 0);
      EXPECT_EQ(fast->priority, 10);
      EXPECT_NE(ref->supports, nullptr) << op;  // lets find_kernel fall back on bad shapes
      EXPECT_NE(fast->supports, nullptr) << op;
      EXPECT_NE(ref->cost, nullptr) << op;
    }
}

TEST(Registry, DescriptorsAreWellFormedAndUnambiguous) {
  std::set<std::tuple<std::string, DType, std::string>> names;
  std::set<std::tuple<std::string, DType, int32_t>> priorities;
  for (const KernelDesc& k : all_kernels()) {
    EXPECT_EQ(k.struct_size, sizeof(KernelDesc));
    EXPECT_EQ(k.op_version, ops::kVersion);
    EXPECT_EQ(k.device, DeviceType::kCpu);
    EXPECT_NE(k.fn, nullptr);
    EXPECT_TRUE(names.insert({k.op, k.dtype, k.name}).second)
        << "duplicate " << k.op << " " << k.name;
    EXPECT_TRUE(priorities.insert({k.op, k.dtype, k.priority}).second) << "tied priority " << k.op;
    bool known = false;
    for (const char* op : kAllOps) known = known || std::string(op) == k.op;
    EXPECT_TRUE(known) << k.op << " is not an op of loom/ops.h";
  }
}

TEST(Registry, ManifestListsExactlyTheRegisteredKernels) {
  std::ifstream file("kernels/cpu/manifest.json");
  ASSERT_TRUE(file.good()) << "manifest.json not in the test's runfiles";
  nlohmann::json manifest = nlohmann::json::parse(file);
  EXPECT_EQ(manifest["name"], "kernels_cpu");
  std::multiset<std::string> listed, registered;
  for (const auto& k : manifest["kernels"])
    listed.insert(k["op"].get<std::string>() + "/" + k["device"].get<std::string>() + "/" +
                  k["dtype"].get<std::string>() + "/" + k["name"].get<std::string>());
  for (const KernelDesc& k : all_kernels())
    registered.insert(std::string(k.op) + "/cpu/" + dtype_name(k.dtype) + "/" + k.name);
  EXPECT_EQ(listed, registered);
}

TEST(Registry, SupportsLooksAtShapesOnly) {
  // Null data pointers (shapes only): supports must still decide, and accept a good call.
  Tensor x(DType::kBF16, {4, 8}), w(DType::kBF16, {8}), y(DType::kBF16, {4, 8}),
      r(DType::kF32, {4});
  ops::NormAttrs at{1e-5f, 0};
  CallHolder h({&x, &w}, {&y, &r}, &at);
  for (TensorView& v : h.in) v.data = nullptr;
  for (TensorView& v : h.out) v.data = nullptr;
  for (const char* name : {"cpu.ref", "cpu.fast"})
    EXPECT_TRUE(kernel(ops::kRmsNormFwd, DType::kBF16, name).supports(&h.call)) << name;
}

}  // namespace
}  // namespace loom::kernels::cpu::testing
