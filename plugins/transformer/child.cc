#include "plugins/transformer/child.h"

#include <string>

namespace loom::transformer {

std::vector<TensorView> call_forward(IModule& module, IForwardContext& ctx,
                                     std::initializer_list<TensorView> inputs, int32_t num_outputs,
                                     const char* what) {
  std::vector<TensorView> outputs(static_cast<size_t>(num_outputs), TensorView{});
  throw_if_error(module.forward(&ctx, inputs.begin(), static_cast<int32_t>(inputs.size()),
                                outputs.data(), num_outputs),
                 std::string(what) + " forward");
  return outputs;
}

std::vector<TensorView> call_backward(IModule& module, IForwardContext& ctx,
                                      std::initializer_list<TensorView> grad_outputs,
                                      int32_t num_grad_inputs, const char* what) {
  std::vector<TensorView> grads(static_cast<size_t>(num_grad_inputs), TensorView{});
  throw_if_error(
      module.backward(&ctx, grad_outputs.begin(), static_cast<int32_t>(grad_outputs.size()),
                      grads.data(), num_grad_inputs),
      std::string(what) + " backward");
  return grads;
}

}  // namespace loom::transformer
