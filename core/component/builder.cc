#include "core/component/builder.h"

#include <fmt/format.h>

#include <cstring>

#include "core/schema/schema.h"
#include "core/util/errors.h"
#include "loom/cpp/error.h"
#include "loom/kinds.h"

namespace loom::core {
namespace {

class BuildContext final : public IBuildContext {
 public:
  BuildContext(PluginManager& plugins, const nlohmann::json& node, std::string pointer,
               const nlohmann::json& inherited, IFp8Recipe* fp8)
      : plugins_(plugins),
        node_(node),
        pointer_(std::move(pointer)),
        inherited_(inherited.dump()),
        fp8_(fp8) {}
  virtual ~BuildContext() = default;

  InterfaceInfo interface_info() const noexcept override { return kinds::kBuildContext; }
  StringView spec_pointer() const noexcept override {
    return StringView{pointer_.data(), pointer_.size()};
  }
  Status build_child(StringView key, InterfaceInfo kind, IObject** out) noexcept override {
    static constexpr char kEmpty[] = "{}";
    return build_child_with(key, kind, StringView{kEmpty, 2}, out);
  }
  IHost* host() noexcept override { return &plugins_.host(); }
  Status build_child_with(StringView key, InterfaceInfo kind, StringView inherited_json,
                          IObject** out) noexcept override {
    return guard([&] {
      std::string name(key.data, key.size);
      std::string child = child_pointer(pointer_, name);
      if (!node_.contains(name))
        throw SpecError(child, fmt::format("missing {} node (required by the {} at {})", kind.kind,
                                           node_.value("impl", "?"), pointer_));
      nlohmann::json inherited =
          nlohmann::json::parse(inherited_json.data, inherited_json.data + inherited_json.size);
      if (!inherited.is_object())
        fail(Code::kInvalidArgument, "build_child_with: inherited options must be a JSON object");
      *out = build_component(plugins_, node_[name], kind, child, inherited, fp8_).release();
    });
  }
  StringView inherited() const noexcept override {
    return StringView{inherited_.data(), inherited_.size()};
  }
  IFp8Recipe* fp8_recipe() noexcept override { return fp8_; }

 private:
  PluginManager& plugins_;
  const nlohmann::json& node_;
  std::string pointer_;
  std::string inherited_;
  IFp8Recipe* fp8_;
};

}  // namespace

ObjectPtr build_component(PluginManager& plugins, const nlohmann::json& node,
                          const InterfaceInfo& kind, const std::string& pointer,
                          const nlohmann::json& inherited, IFp8Recipe* fp8) {
  std::string name = node.value("impl", "");
  const FactoryEntry* factory = plugins.registry().find_factory(kind.kind, name);
  if (factory == nullptr)
    throw SpecError(child_pointer(pointer, "impl"),
                    fmt::format("no loaded plugin provides {} '{}'", kind.kind, name));
  // Inherited options fill what the node leaves out; a node that sets one must agree.
  nlohmann::json merged = node;
  for (const auto& [key, value] : inherited.items()) {
    if (!merged.contains(key)) {
      merged[key] = value;
    } else if (merged[key] != value) {
      throw SpecError(child_pointer(pointer, key),
                      fmt::format("{} conflicts with {} given by the enclosing component; "
                                  "remove it here or make them equal",
                                  compact_value(merged[key]), compact_value(value)));
    }
  }
  BuildContext ctx(plugins, node, pointer, inherited, fp8);
  std::string options = merged.dump();
  IObject* raw = nullptr;
  Status status = factory->factory->create(StringView{options.data(), options.size()}, &ctx, &raw);
  if (status.code != Code::kOk) {
    std::string why = take_message(&status);
    if (status.code == Code::kInvalidArgument) {
      // "/key: problem" is relative to this node, "#/a/b: problem" is absolute.
      size_t colon = why.find(": ");
      if (colon != std::string::npos && why.rfind("#/", 0) == 0)
        throw SpecError(why.substr(1, colon - 1), why.substr(colon + 2));
      if (colon != std::string::npos && why.rfind("/", 0) == 0 && why.find(' ') > colon)
        throw SpecError(pointer + why.substr(0, colon), why.substr(colon + 2));
      throw SpecError(pointer, why);
    }
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
