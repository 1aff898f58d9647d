// The library's kernel list, assembled once from every op family.
#include <cstring>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_kernels.h"

namespace loom::kernels::cpu {

const std::vector<KernelDesc>& all_kernels() {
  static const std::vector<KernelDesc> kernels = [] {
    std::vector<KernelDesc> k;
    add_gemm_kernels(k);
    add_gemm_epilogue_kernels(k);
    add_elementwise_kernels(k);
    add_activation_kernels(k);
    add_dropout_kernels(k);
    add_embedding_kernels(k);
    add_layernorm_kernels(k);
    add_rmsnorm_kernels(k);
    add_add_norm_kernels(k);
    add_rope_kernels(k);
    add_qkv_kernels(k);
    add_softmax_kernels(k);
    add_attention_kernels(k);
    add_flash_attention_kernels(k);
    add_cross_entropy_kernels(k);
    add_cross_entropy_shard_kernels(k);
    add_optim_kernels(k);
    add_fp8_kernels(k);
    add_swiglu_fp8_kernels(k);
    add_rope_fp8_kernels(k);
    add_moe_topk_kernels(k);
    add_moe_permute_kernels(k);
    add_grouped_gemm_kernels(k);
    add_causal_conv1d_kernels(k);
    add_ssd_scan_kernels(k);
    add_rmsnorm_gated_kernels(k);
    add_mla_kernels(k);
    return k;
  }();
  return kernels;
}

const KernelDesc* find_kernel(const char* op, DType dtype, const char* name) {
  for (const KernelDesc& k : all_kernels())
    if (std::strcmp(k.op, op) == 0 && k.dtype == dtype && std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

}  // namespace loom::kernels::cpu
