#include "core/plugin/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "core/schema/schema.h"
#include "loom/cpp/error.h"
#include "loom/kinds.h"

namespace loom::core {
namespace {

const InterfaceInfo* known_kind(const char* kind) {
  for (const InterfaceInfo& info : kinds::kComponentKinds)
    if (std::strcmp(info.kind, kind) == 0) return &info;
  return nullptr;
}

std::string str(const char* text) { return text == nullptr ? std::string() : std::string(text); }

// The IRegistry a plugin sees: forwards to the Registry with the plugin's name attached.
class RegistryView final : public IRegistry {
 public:
  RegistryView(Registry* registry, std::string plugin)
      : registry_(registry), plugin_(std::move(plugin)) {}
  virtual ~RegistryView() = default;
  InterfaceInfo interface_info() const noexcept override { return kinds::kRegistry; }
  Status add_factory(const FactoryDesc* desc, IFactory* factory) noexcept override {
    return guard([&] { registry_->add_factory(plugin_, *desc, factory); });
  }
  Status add_kernel(const KernelDesc* desc) noexcept override {
    return guard([&] { registry_->add_kernel(plugin_, *desc); });
  }
  Status add_device_runtime(IDeviceRuntime* runtime) noexcept override {
    return guard([&] { registry_->add_device_runtime(plugin_, runtime); });
  }

 private:
  Registry* registry_;
  std::string plugin_;
};

}  // namespace

std::unique_ptr<IRegistry, void (*)(IRegistry*)> Registry::view_for(const std::string& plugin) {
  // IRegistry's destructor is protected (nobody deletes through the interface); the view
  // knows its concrete type.
  return {new RegistryView(this, plugin),
          [](IRegistry* view) { delete static_cast<RegistryView*>(view); }};
}

void Registry::add_device_runtime(const std::string& plugin, IDeviceRuntime* runtime) {
  if (runtime == nullptr)
    fail(Code::kInvalidArgument, fmt::format("plugin '{}': add_device_runtime with null", plugin));
  InterfaceInfo info = runtime->interface_info();
  if (info.kind == nullptr || std::strcmp(info.kind, kinds::kDeviceRuntime.kind) != 0 ||
      info.major != kinds::kDeviceRuntime.major)
    fail(Code::kAbiMismatch,
         fmt::format("plugin '{}': its device runtime reports interface '{}' {}.{}, this loom "
                     "needs '{}' {}.x: rebuild the plugin against this SDK",
                     plugin, str(info.kind), info.major, info.minor, kinds::kDeviceRuntime.kind,
                     kinds::kDeviceRuntime.major));
  DeviceType type = runtime->device_type();
  if (type == DeviceType::kCpu)
    fail(Code::kInvalidArgument,
         fmt::format("plugin '{}': the CPU's memory belongs to the core; a device runtime "
                     "serves another device family",
                     plugin));
  auto it = runtimes_.find(type);
  if (it != runtimes_.end())
    fail(Code::kAlreadyExists,
         fmt::format("plugin '{}': device family {} already has a runtime, from plugin '{}'; "
                     "load one of the two",
                     plugin, static_cast<int>(type), it->second.second));
  runtimes_.emplace(type, std::make_pair(runtime, plugin));
}

IDeviceRuntime* Registry::device_runtime(DeviceType type, std::string* plugin) const {
  auto it = runtimes_.find(type);
  if (it == runtimes_.end()) return nullptr;
  if (plugin != nullptr) *plugin = it->second.second;
  return it->second.first;
}

void Registry::add_factory(const std::string& plugin, const FactoryDesc& desc, IFactory* factory) {
  if (desc.struct_size < sizeof(FactoryDesc))
    fail(Code::kAbiMismatch, fmt::format("plugin '{}': FactoryDesc of {} bytes is older than "
                                         "ABI 1.0 ({} bytes): rebuild the plugin",
                                         plugin, desc.struct_size, sizeof(FactoryDesc)));
  if (factory == nullptr || desc.name == nullptr || desc.interface.kind == nullptr)
    fail(Code::kInvalidArgument,
         fmt::format("plugin '{}': add_factory needs a kind, a name and a factory", plugin));
  std::string kind = desc.interface.kind, name = desc.name;
  const InterfaceInfo* core_kind = known_kind(desc.interface.kind);
  if (core_kind == nullptr)
    fail(Code::kInvalidArgument,
         fmt::format("plugin '{}': factory '{}' is for unknown kind '{}'; kinds are listed in "
                     "loom/kinds.h",
                     plugin, name, kind));
  if (desc.interface.major != core_kind->major || desc.interface.minor > core_kind->minor)
    fail(Code::kAbiMismatch,
         fmt::format("plugin '{}': factory ({}, {}) implements {} interface {}.{}, this loom "
                     "provides {}.{}: rebuild the plugin against this SDK",
                     plugin, kind, name, kind, desc.interface.major, desc.interface.minor,
                     core_kind->major, core_kind->minor));
  auto key = std::make_pair(kind, name);
  if (auto it = factories_.find(key); it != factories_.end())
    fail(Code::kAlreadyExists,
         fmt::format("duplicate registration of {} '{}': plugin '{}' registered it already and "
                     "plugin '{}' registers it again; remove one of the two plugins from the "
                     "search path or rename the component",
                     kind, name, it->second->plugin, plugin));
  auto entry = std::make_unique<FactoryEntry>();
  entry->kind = kind;
  entry->major = desc.interface.major;
  entry->minor = desc.interface.minor;
  entry->name = name;
  entry->description = str(desc.description);
  std::string origin = fmt::format("plugin '{}' component ({}, {})", plugin, kind, name);
  try {
    entry->schema = nlohmann::json::parse(
        desc.options_schema_json == nullptr ? "{}" : desc.options_schema_json);
  } catch (const nlohmann::json::exception& e) {
    fail(Code::kInvalidArgument,
         fmt::format("{}: options schema is not valid JSON: {}", origin, e.what()));
  }
  check_schema(entry->schema, origin);
  entry->factory = factory;
  entry->plugin = plugin;
  factories_.emplace(std::move(key), std::move(entry));
}

void Registry::add_kernel(const std::string& plugin, const KernelDesc& desc) {
  if (desc.struct_size < sizeof(KernelDesc))
    fail(Code::kAbiMismatch, fmt::format("plugin '{}': KernelDesc of {} bytes is older than ABI "
                                         "1.0 ({} bytes): rebuild the plugin",
                                         plugin, desc.struct_size, sizeof(KernelDesc)));
  if (desc.op == nullptr || desc.name == nullptr || desc.fn == nullptr)
    fail(Code::kInvalidArgument,
         fmt::format("plugin '{}': add_kernel needs an op, a name and a function", plugin));
  for (const auto& k : kernels_) {
    if (k->op != desc.op || k->desc.device != desc.device || k->desc.dtype != desc.dtype) continue;
    if (k->name == desc.name)
      fail(Code::kAlreadyExists,
           fmt::format("duplicate kernel '{}' for op '{}' ({}): registered by plugin '{}' and "
                       "again by plugin '{}'",
                       desc.name, desc.op, dtype_name(desc.dtype), k->plugin, plugin));
    if (k->desc.priority == desc.priority)
      fail(Code::kAlreadyExists,
           fmt::format("kernels '{}' (plugin '{}') and '{}' (plugin '{}') both serve op '{}' "
                       "({}) at priority {}: priorities must differ so the choice is defined",
                       k->name, k->plugin, desc.name, plugin, desc.op, dtype_name(desc.dtype),
                       desc.priority));
  }
  auto entry = std::make_unique<KernelEntry>();
  entry->op = desc.op;
  entry->name = desc.name;
  entry->plugin = plugin;
  entry->desc = desc;
  entry->desc.struct_size = sizeof(KernelDesc);
  entry->desc.op = entry->op.c_str();
  entry->desc.name = entry->name.c_str();
  kernels_.push_back(std::move(entry));
}

const FactoryEntry* Registry::find_factory(const std::string& kind, const std::string& name) const {
  auto it = factories_.find({kind, name});
  return it == factories_.end() ? nullptr : it->second.get();
}

std::vector<const FactoryEntry*> Registry::factories(const std::string& kind) const {
  std::vector<const FactoryEntry*> out;
  for (const auto& [key, entry] : factories_)
    if (kind.empty() || key.first == kind) out.push_back(entry.get());
  return out;
}

std::vector<const KernelEntry*> Registry::kernels(const std::string& op, DeviceType device,
                                                  DType dtype) const {
  std::vector<const KernelEntry*> out;
  for (const auto& k : kernels_)
    if (k->op == op && k->desc.device == device && k->desc.dtype == dtype) out.push_back(k.get());
  std::sort(out.begin(), out.end(), [](const KernelEntry* a, const KernelEntry* b) {
    return a->desc.priority > b->desc.priority;
  });
  return out;
}

std::vector<const KernelEntry*> Registry::all_kernels() const {
  std::vector<const KernelEntry*> out;
  for (const auto& k : kernels_) out.push_back(k.get());
  std::sort(out.begin(), out.end(), [](const KernelEntry* a, const KernelEntry* b) {
    return std::make_tuple(a->op, a->desc.device, a->desc.dtype, -a->desc.priority) <
           std::make_tuple(b->op, b->desc.device, b->desc.dtype, -b->desc.priority);
  });
  return out;
}

}  // namespace loom::core
