// Building components from resolved spec nodes through the registry (Megatron's
// ModuleSpec, by name): a node `{"impl": NAME, ...options}` in a slot of kind K is built by
// the factory (K, NAME), which builds its own child nodes through IBuildContext.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/plugin/plugin_manager.h"
#include "loom/cpp/object.h"
#include "loom/kinds/fp8_recipe.h"

namespace loom::core {

/// Builds the component at `pointer` of kind `kind` from the resolved `node`.
/// Throws SpecError (unknown impl), PluginError (factory failed or returned the wrong kind).
/// \param plugins  loaded plugins (their registry and host)
/// \param node     the resolved spec node, with "impl"
/// \param kind     the interface the slot requires
/// \param pointer  JSON pointer of the node, for messages
/// \param inherited options handed down by the enclosing component (or the core): keys the
///                  node does not set are added; keys it sets must be equal
/// \param fp8      the run's FP8 recipe, handed to this component and its children
///                  (IBuildContext::fp8_recipe); null when the run does not use FP8
ObjectPtr build_component(PluginManager& plugins, const nlohmann::json& node,
                          const InterfaceInfo& kind, const std::string& pointer,
                          const nlohmann::json& inherited = nlohmann::json::object(),
                          IFp8Recipe* fp8 = nullptr);

}  // namespace loom::core
