// add_pointwise_kernels: the KernelDescs of every op file of this library (pointwise.h).
#include "kernels/cuda/pointwise/common.cuh"
#include "kernels/cuda/pointwise/pointwise.h"

namespace loom::kernels::cuda {

void add_pointwise_kernels(std::vector<KernelDesc>& out) {
  pointwise::add_gelu_kernels(out);
  pointwise::add_swiglu_kernels(out);
  pointwise::add_dropout_kernels(out);
  pointwise::add_embedding_kernels(out);
  pointwise::add_layernorm_kernels(out);
  pointwise::add_rmsnorm_kernels(out);
  pointwise::add_add_norm_kernels(out);
  pointwise::add_rope_kernels(out);
  pointwise::add_qkv_kernels(out);
  pointwise::add_swap_axes_kernels(out);
  pointwise::add_softmax_kernels(out);
  pointwise::add_fp8_quantize_kernels(out);
  pointwise::add_swiglu_fp8_kernels(out);
  pointwise::add_rope_fp8_kernels(out);
}

}  // namespace loom::kernels::cuda
