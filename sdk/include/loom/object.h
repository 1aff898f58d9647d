// IObject: the root of every interface that crosses the plugin boundary.
//
// Interfaces are pure abstract classes (TensorRT / COM style): every method is virtual,
// `noexcept`, and uses only C types and SDK value structs. The Itanium C++ ABI that g++ and
// clang++ share on Linux fixes their layout, so a plugin built by either compiler can
// implement them. New methods are only ever appended at the end of a class, with the
// interface's minor version raised; callers check `interface_info().minor` before calling
// a method newer than 1.0.
#pragma once

#include "loom/types.h"

namespace loom {

/// Base of every object a plugin hands to the core.
class IObject {
 public:
  /// Kind and version of the most derived interface this object implements.
  virtual InterfaceInfo interface_info() const noexcept = 0;
  /// Destroys the object with the allocator of the library that created it. The caller
  /// must not use the pointer afterwards.
  virtual void destroy() noexcept = 0;

 protected:
  // Not virtual and not public: nobody but the owning library may `delete` an object.
  ~IObject() = default;
};

}  // namespace loom
