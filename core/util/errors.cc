#include "core/util/errors.h"

#include <new>

namespace loom::core {

SpecError::SpecError(std::string pointer, std::string problem)
    : Error(Code::kInvalidArgument,
            pointer.empty() ? "spec: " + problem : "spec " + pointer + ": " + problem),
      pointer_(std::move(pointer)),
      problem_(std::move(problem)) {}

int exit_code_for(const std::exception& error) {
  if (dynamic_cast<const UsageError*>(&error)) return kExitUsage;
  if (dynamic_cast<const SpecError*>(&error)) return kExitSpec;
  if (dynamic_cast<const PluginError*>(&error)) return kExitPlugin;
  if (dynamic_cast<const IoError*>(&error)) return kExitIo;
  if (dynamic_cast<const std::bad_alloc*>(&error)) return kExitRuntime;
  if (const auto* e = dynamic_cast<const Error*>(&error)) {
    switch (e->code()) {
      case Code::kInvalidArgument:
      case Code::kOutOfRange:
        return kExitSpec;
      case Code::kAbiMismatch:
      case Code::kAlreadyExists:
        return kExitPlugin;
      case Code::kIoError:
      case Code::kNotFound:
      case Code::kDataLoss:
        return kExitIo;
      case Code::kUnavailable:
      case Code::kUnimplemented:
        return kExitUnavailable;
      case Code::kAborted:
      case Code::kDeadlineExceeded:
      case Code::kResourceExhausted:
      case Code::kFailedPrecondition:
        return kExitRuntime;
      case Code::kOk:
      case Code::kInternal:
        return kExitInternal;
    }
  }
  return kExitInternal;
}

}  // namespace loom::core
