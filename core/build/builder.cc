#include "core/build/builder.h"

#include <fmt/format.h>

#include <cstring>

#include "core/spec/schema.h"
#include "core/util/errors.h"
#include "loom/cpp/error.h"
#include "loom/kinds.h"

namespace loom::core {
namespace {

class BuildContext final : public IBuildContext {
 public:
  BuildContext(PluginManager& plugins, const nlohmann::json& node, std::string pointer)
      : plugins_(plugins), node_(node), pointer_(std::move(pointer)) {}
  virtual ~BuildContext() = default;

  InterfaceInfo interface_info() const noexcept override { return kinds::kBuildContext; }
  StringView spec_pointer() const noexcept override {
    return StringView{pointer_.data(), pointer_.size()};
  }
  Status build_child(StringView key, InterfaceInfo kind, IObject** out) noexcept override {
    return guard([&] {
      std::string name(key.data, key.size);
      std::string child = child_pointer(pointer_, name);
      if (!node_.contains(name))
        throw SpecError(child, fmt::format("missing {} node (required by the {} at {})", kind.kind,
                                           node_.value("impl", "?"), pointer_));
      *out = build_component(plugins_, node_[name], kind, child).release();
    });
  }
  IHost* host() noexcept override { return &plugins_.host(); }

 private:
  PluginManager& plugins_;
  const nlohmann::json& node_;
  std::string pointer_;
};

}  // namespace

ObjectPtr build_component(PluginManager& plugins, const nlohmann::json& node,
                          const InterfaceInfo& kind, const std::string& pointer) {
  std::string name = node.value("impl", "");
  const FactoryEntry* factory = plugins.registry().find_factory(kind.kind, name);
  if (factory == nullptr)
    throw SpecError(child_pointer(pointer, "impl"),
                    fmt::format("no loaded plugin provides {} '{}'", kind.kind, name));
  BuildContext ctx(plugins, node, pointer);
  std::string options = node.dump();
  IObject* raw = nullptr;
  Status status = factory->factory->create(StringView{options.data(), options.size()}, &ctx, &raw);
  if (status.code != Code::kOk) {
    std::string why = take_message(&status);
    if (status.code == Code::kInvalidArgument) throw SpecError(pointer, why);
    throw PluginError(status.code, fmt::format("{} '{}' (plugin '{}') at spec {}: {}", kind.kind,
                                               name, factory->plugin, pointer, why));
  }
  ObjectPtr object(raw);
  if (raw == nullptr)
    throw PluginError(Code::kInternal, fmt::format("{} '{}' (plugin '{}') returned no object",
                                                   kind.kind, name, factory->plugin));
  InterfaceInfo got = raw->interface_info();
  if (got.kind == nullptr || std::strcmp(got.kind, kind.kind) != 0 || got.major != kind.major)
    throw PluginError(
        Code::kAbiMismatch,
        fmt::format("{} '{}' (plugin '{}') built a '{}' {}.{} object where a {} "
                    "{}.x was required",
                    kind.kind, name, factory->plugin, got.kind == nullptr ? "?" : got.kind,
                    got.major, got.minor, kind.kind, kind.major));
  return object;
}

}  // namespace loom::core
