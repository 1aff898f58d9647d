// Error categories of the core and the exit codes the `loom` command maps them to.
//
// User errors are exceptions inside the core (loom::Error and the classes below); the
// command line turns each into one clean message and the documented exit code.
#pragma once

#include <string>

#include "loom/cpp/error.h"

namespace loom::core {

/// Exit codes of the `loom` command (documented in README.md and `loom --help`).
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,     ///< a bug in loom: please report it
  kExitUsage = 2,        ///< bad command-line arguments
  kExitSpec = 3,         ///< the spec is malformed or breaks a rule
  kExitPlugin = 4,       ///< a plugin is missing, unloadable or misbehaves
  kExitIo = 5,           ///< a file could not be read or written
  kExitRuntime = 6,      ///< training failed while running
  kExitUnavailable = 7,  ///< something the run needs is not available here
  kExitInterrupted = 130,
};

/// A problem with a plugin (loading, ABI, registration, init).
class PluginError : public Error {
 public:
  PluginError(Code code, std::string message) : Error(code, std::move(message)) {}
};

/// A file that cannot be read or written.
class IoError : public Error {
 public:
  explicit IoError(std::string message) : Error(Code::kIoError, std::move(message)) {}
};

/// A bad command line.
class UsageError : public Error {
 public:
  explicit UsageError(std::string message) : Error(Code::kInvalidArgument, std::move(message)) {}
};

/// A bad value handed to a core function (an id outside a vocabulary, a value that does not
/// fit a file's dtype).
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(std::string message)
      : Error(Code::kInvalidArgument, std::move(message)) {}
};

/// Thrown for a spec that breaks its schema (code kInvalidArgument). what() is the whole
/// one-line message, "spec /model/layer/mlp/num_experts: expected integer >= 1, got 0", or
/// "spec: <problem>" when the pointer is the root ("").
class SpecError : public loom::Error {
 public:
  /// \param pointer  JSON pointer (RFC 6901) of the offending value in the spec
  /// \param problem  what is wrong and, where possible, the fix
  SpecError(std::string pointer, std::string problem);
  const std::string& pointer() const { return pointer_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string pointer_;
  std::string problem_;
};

/// Maps an exception caught at the top of the command to its exit code.
int exit_code_for(const std::exception& error);

}  // namespace loom::core
