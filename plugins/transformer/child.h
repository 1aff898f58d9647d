// Calling a child module's forward and backward with exceptions instead of statuses.
#pragma once

#include <loom/sdk.h>

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::transformer {

/// Runs `module.forward` on `inputs`; returns its `num_outputs` outputs.
std::vector<TensorView> call_forward(IModule& module, IForwardContext& ctx,
                                     std::initializer_list<TensorView> inputs, int32_t num_outputs,
                                     const char* what);
/// Runs `module.backward` on `grad_outputs`; returns its `num_grad_inputs` input gradients.
std::vector<TensorView> call_backward(IModule& module, IForwardContext& ctx,
                                      std::initializer_list<TensorView> grad_outputs,
                                      int32_t num_grad_inputs, const char* what);

}  // namespace loom::transformer

namespace loom::transformer {

/// Builds the child at `key` of the node being built, of interface `I`, with `inherited`
/// merged into its options (IBuildContext::build_child_with). The caller owns the result.
template <class I>
I* build_child(IBuildContext& ctx, const char* key, const nlohmann::json& inherited) {
  IObject* object = nullptr;
  std::string text = inherited.dump();
  Status status = ctx.build_child_with(make_string_view(key), KindOf<I>::value,
                                       StringView{text.data(), text.size()}, &object);
  if (status.code != Code::kOk) {
    // A child's spec error already names its place ("spec /model/layer/x: ..."); pass it on
    // as an absolute pointer ("#/model/layer/x: ...") so the core does not prefix ours.
    Code code = status.code;
    std::string message = take_message(&status);
    if (code == Code::kInvalidArgument && message.rfind("spec /", 0) == 0)
      message = "#" + message.substr(5);
    fail(code, message);
  }
  I* typed = interface_cast<I>(object);
  if (typed == nullptr) {
    if (object != nullptr) object->destroy();
    fail(Code::kInternal,
         std::string("the child at ") + key + " is not a " + KindOf<I>::value.kind);
  }
  return typed;
}

}  // namespace loom::transformer
