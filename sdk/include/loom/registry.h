// IRegistry and IFactory: how a plugin tells the core what it provides.
//
// During `register_components` a plugin adds factories, keyed by (kind, name), and
// kernels, keyed by (op, device, dtype, name). A spec node `{"impl": NAME, ...}` in a slot
// of kind K is built by the factory (K, NAME). Duplicates are refused, naming both
// plugins. The descriptors' strings must be static (they live as long as the process).
#pragma once

#include <stdint.h>

#include "loom/device.h"
#include "loom/kernel.h"
#include "loom/object.h"
#include "loom/status.h"
#include "loom/types.h"

namespace loom {

class IBuildContext;

/// Creates components of one kind. Owned by the plugin; the core never destroys it.
class IFactory {
 public:
  /// kinds::kFactory.
  virtual InterfaceInfo interface_info() const noexcept = 0;
  /// Builds one component.
  /// \param options_json  the spec node as JSON text, already validated against the
  ///                      factory's options schema with every default filled in ("impl"
  ///                      included); child component nodes are left for ctx->build_child
  /// \param ctx           the build context: spec location, children, process grid
  /// \param[out] out      the new object; its interface_info().kind must be the kind
  ///                      the factory was registered for
  virtual Status create(StringView options_json, IBuildContext* ctx, IObject** out) noexcept = 0;

 protected:
  ~IFactory() = default;
};

/// What a factory is registered as.
struct FactoryDesc {
  uint32_t struct_size;             ///< sizeof(FactoryDesc) of the registering plugin
  InterfaceInfo interface;          ///< kind and the version the objects implement
  const char* name;                 ///< what a spec writes in "impl", e.g. "rmsnorm"
  const char* description;          ///< one line for `loom plugins describe`
  const char* options_schema_json;  ///< JSON Schema subset (sdk/README.md lists the keywords)
};

/// The registrar handed to a plugin's `register_components`. Valid only during that call.
class IRegistry {
 public:
  /// kinds::kRegistry.
  virtual InterfaceInfo interface_info() const noexcept = 0;
  /// Adds a factory. Fails with kAlreadyExists when (kind, name) is taken, kAbiMismatch
  /// when the kind's major differs from the core's, kInvalidArgument when the schema is not
  /// valid JSON or the kind is unknown.
  /// \param desc     the descriptor; copied
  /// \param factory  the factory; must outlive the process (plugins are never unloaded)
  virtual Status add_factory(const FactoryDesc* desc, IFactory* factory) noexcept = 0;
  /// Adds a kernel. Fails with kAlreadyExists when (op, device, dtype, name) is taken or
  /// another kernel has the same priority for (op, device, dtype).
  /// \param desc  the descriptor; copied
  virtual Status add_kernel(const KernelDesc* desc) noexcept = 0;
  /// Adds the runtime of a device family (loom/device.h): the core routes allocations,
  /// copies and memory figures of that family to it. Fails with kAlreadyExists when the
  /// family has one, kInvalidArgument for kCpu or a null runtime. Registry 1.1 (ABI 1.2):
  /// check interface_info().minor before calling it.
  /// \param runtime  the runtime; must outlive the process (plugins are never unloaded)
  virtual Status add_device_runtime(IDeviceRuntime* runtime) noexcept = 0;

 protected:
  ~IRegistry() = default;
};

/// Context of one build call: where in the spec the node is, and its children.
class IBuildContext {
 public:
  /// kinds::kBuildContext.
  virtual InterfaceInfo interface_info() const noexcept = 0;
  /// JSON pointer of the node being built, e.g. "/model/layer/attention"; for messages.
  virtual StringView spec_pointer() const noexcept = 0;
  /// Builds the child component at `key` of this node (a nested `{"impl": ...}` node).
  /// \param key       the option's name, e.g. "attention"
  /// \param kind      the interface the child must implement (e.g. kinds::kAttention)
  /// \param[out] out  the child; the caller owns it (IObject::destroy)
  virtual Status build_child(StringView key, InterfaceInfo kind, IObject** out) noexcept = 0;
  /// The host, for kernels, memory and communicators.
  virtual class IHost* host() noexcept = 0;
  /// Builds the child at `key` like build_child, with `inherited_json` (a JSON object
  /// text) merged into its options: a key the child's node does not set takes the
  /// inherited value; a key it sets must hold the same value, else kInvalidArgument naming
  /// both places. This is how a model hands its shape (hidden size, heads, dtype) to its
  /// layers, as Megatron's TransformerConfig does. ABI 1.1.
  virtual Status build_child_with(StringView key, InterfaceInfo kind, StringView inherited_json,
                                  IObject** out) noexcept = 0;
  /// The options the parent handed down to this node (a JSON object text, "{}" at the
  /// root unless the core passes some: the root model gets "seq_length",
  /// "micro_batch_size", "params_dtype" and "device"). ABI 1.1.
  virtual StringView inherited() const noexcept = 0;
  /// The run's FP8 recipe (spec /precision/fp8), or null when the run does not train in
  /// FP8. Owned by the core; it outlives every component built in this run. A module whose
  /// GEMMs may run in FP8 asks it for quantisers while it is built (loom/kinds/fp8_recipe.h).
  /// Build context 1.1 (ABI 1.4): check interface_info().minor before calling it.
  virtual class IFp8Recipe* fp8_recipe() noexcept = 0;

 protected:
  ~IBuildContext() = default;
};

}  // namespace loom
