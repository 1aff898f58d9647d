#include "kernels/cuda/kernel_families.h"

#include <loom/cpp/error.h>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/cudnn_attention.h"
#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/loss/loss.h"
#include "kernels/cuda/mamba/mamba.h"
#include "kernels/cuda/mla/mla.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/optim/optim.h"
#include "kernels/cuda/pointwise/pointwise.h"

namespace loom::kernels::cuda {

void add_all_kernels(std::vector<KernelDesc>& out) {
  add_gemm_kernels(out);
  add_loss_kernels(out);
  add_optim_kernels(out);
  add_elementwise_kernels(out);
  add_pointwise_kernels(out);
  add_attention_kernels(out);
  // Above loom's own attention kernels; each call falls back to them (cudnn_attention.h).
  add_cudnn_attention_kernels(out);
  add_attention_merge_kernels(out);
  add_moe_kernels(out);
  add_mamba_kernels(out);
  add_mla_kernels(out);
}

std::string take_recorded_error() {
  std::string message = take_label_error();
  if (!message.empty()) return message;
  message = take_moe_index_error();
  if (!message.empty()) return message;
  Status ids = embedding_id_status();
  if (ids.code == Code::kOk) return "";
  return take_message(&ids);
}

}  // namespace loom::kernels::cuda
