// Object<Interface>: implements IObject's bookkeeping for a plugin class, so a plugin
// writes only the methods of its kind.
//
//   class MyNorm final : public loom::Object<loom::INorm> { ... };
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>

#include "loom/kinds.h"
#include "loom/kinds/attention.h"
#include "loom/kinds/checkpoint_format.h"
#include "loom/kinds/comm_backend.h"
#include "loom/kinds/fp8_recipe.h"
#include "loom/kinds/mixer.h"
#include "loom/kinds/model.h"
#include "loom/kinds/moe.h"
#include "loom/kinds/optimizer.h"
#include "loom/kinds/pipeline_schedule.h"

namespace loom {

/// Maps an interface class to its (kind, version).
template <class Interface>
struct KindOf;
#define LOOM_KIND_OF(Interface, info)            \
  template <>                                    \
  struct KindOf<Interface> {                     \
    static constexpr InterfaceInfo value = info; \
  }
LOOM_KIND_OF(IModel, kinds::kModel);
LOOM_KIND_OF(ILayer, kinds::kLayer);
LOOM_KIND_OF(IGenericModule, kinds::kModule);
LOOM_KIND_OF(IAttention, kinds::kAttention);
LOOM_KIND_OF(IMlp, kinds::kMlp);
LOOM_KIND_OF(INorm, kinds::kNorm);
LOOM_KIND_OF(IMixer, kinds::kMixer);
LOOM_KIND_OF(IRouter, kinds::kRouter);
LOOM_KIND_OF(IMoeDispatcher, kinds::kMoeDispatcher);
LOOM_KIND_OF(IFp8Recipe, kinds::kFp8Recipe);
LOOM_KIND_OF(IOptimizer, kinds::kOptimizer);
LOOM_KIND_OF(ILrSchedule, kinds::kLrSchedule);
LOOM_KIND_OF(IPipelineSchedule, kinds::kPipelineSchedule);
LOOM_KIND_OF(ICheckpointFormat, kinds::kCheckpointFormat);
LOOM_KIND_OF(ICommBackend, kinds::kCommBackend);
LOOM_KIND_OF(ICommunicator, kinds::kCommunicator);
LOOM_KIND_OF(ICommWork, kinds::kCommWork);
#undef LOOM_KIND_OF

/// Base for plugin classes: reports the interface's kind and version and deletes itself
/// in the library that allocated it.
template <class Interface>
class Object : public Interface {
 public:
  static constexpr InterfaceInfo kInterface = KindOf<Interface>::value;
  InterfaceInfo interface_info() const noexcept override { return kInterface; }
  void destroy() noexcept override { delete this; }

 protected:
  virtual ~Object() = default;
};

/// Deletes an IObject through its own library (IObject::destroy).
struct ObjectDeleter {
  void operator()(IObject* object) const {
    if (object != nullptr) object->destroy();
  }
};
/// Owns an object made by another library: destroyed there, never with `delete`.
using ObjectPtr = std::unique_ptr<IObject, ObjectDeleter>;

/// Copies the value struct `from` (whose first field is `uint32_t struct_size`) into the
/// caller's `*to`: at most to->struct_size bytes, since an older caller's struct is smaller
/// and a newer caller's keeps its later fields as it set them; to->struct_size becomes the
/// number of bytes written. For an object filling a struct its caller passed in.
template <class T>
void copy_struct(const T& from, T* to) {
  const uint32_t caller = to->struct_size;
  const uint32_t bytes = std::min<uint32_t>(caller, static_cast<uint32_t>(sizeof(T)));
  std::memcpy(static_cast<void*>(to), &from, bytes);
  to->struct_size = bytes;
}

/// Casts an object received across the boundary to `Interface` after checking its kind
/// and major version; null when they do not match.
template <class Interface>
Interface* interface_cast(IObject* object) noexcept {
  if (object == nullptr) return nullptr;
  InterfaceInfo have = object->interface_info();
  InterfaceInfo want = KindOf<Interface>::value;
  const char* a = have.kind;
  const char* b = want.kind;
  if (a == nullptr) return nullptr;
  while (*a != '\0' && *a == *b) ++a, ++b;
  if (*a != *b || have.major != want.major) return nullptr;
  return static_cast<Interface*>(object);
}

}  // namespace loom
