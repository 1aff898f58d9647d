// Children of a module: building one from a spec slot of the node being built, and calling
// a child's forward and backward with exceptions instead of statuses.
#pragma once

#include <loom/cpp/object.h>
#include <loom/cpp/tensor.h>
#include <loom/registry.h>

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace loom::nn {

/// Runs `module.forward` on `inputs`; returns its `num_outputs` outputs.
/// \param what  names the child in the message ("decoder layer")
inline std::vector<TensorView> call_forward(IModule& module, IForwardContext& ctx,
                                            std::initializer_list<TensorView> inputs,
                                            int32_t num_outputs, const char* what) {
  std::vector<TensorView> outputs(static_cast<size_t>(num_outputs), TensorView{});
  throw_if_error(module.forward(&ctx, inputs.begin(), static_cast<int32_t>(inputs.size()),
                                outputs.data(), num_outputs),
                 std::string(what) + " forward");
  return outputs;
}

/// Runs `module.backward` on `grad_outputs`; returns its `num_grad_inputs` input gradients.
inline std::vector<TensorView> call_backward(IModule& module, IForwardContext& ctx,
                                             std::initializer_list<TensorView> grad_outputs,
                                             int32_t num_grad_inputs, const char* what) {
  std::vector<TensorView> grads(static_cast<size_t>(num_grad_inputs), TensorView{});
  throw_if_error(
      module.backward(&ctx, grad_outputs.begin(), static_cast<int32_t>(grad_outputs.size()),
                      grads.data(), num_grad_inputs),
      std::string(what) + " backward");
  return grads;
}

/// Every module of the tree under `root` (root included, path ""), depth first, with its
/// path ("decoder.layers.0.mlp"), as the core names parameters.
inline std::vector<std::pair<std::string, IModule*>> modules_of(const IModule& root) {
  std::vector<std::pair<std::string, IModule*>> out;
  std::vector<std::pair<std::string, IModule*>> stack{{"", const_cast<IModule*>(&root)}};
  while (!stack.empty()) {
    auto [path, module] = stack.back();
    stack.pop_back();
    out.emplace_back(path, module);
    for (int32_t i = module->child_count(); i-- > 0;) {
      StringView name{};
      IModule* child = nullptr;
      throw_if_error(module->child(i, &name, &child), "child " + std::to_string(i) + " of " + path);
      std::string n(name.data, name.size);
      stack.emplace_back(path.empty() ? n : path + "." + n, child);
    }
  }
  return out;
}

/// Builds the child at `key` of the node being built, of interface `I`, with `inherited`
/// merged into its options (IBuildContext::build_child_with). The caller owns the result
/// (ModuleBase::add_child takes it). A child's spec error keeps naming the child's place.
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

}  // namespace loom::nn
