// Status: how every call across the plugin boundary reports success or failure.
//
// Exceptions never cross the boundary. A method returns a `loom::Status` by value: a plain
// struct with a code and, on failure, a message that the side which made the status owns.
// Whoever receives a failed status reads it and then calls `loom::status_release`, which
// calls back into the library that allocated the message (plugins are never unloaded, so
// that code is always there). The C++ conveniences in loom/cpp/error.h do this for you.
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace loom {

/// Error codes. Values are part of the ABI: never renumber, only append.
enum class Code : int32_t {
  kOk = 0,
  kInvalidArgument = 1,     ///< bad option, bad shape, bad spec value
  kNotFound = 2,            ///< missing file, unknown name
  kAlreadyExists = 3,       ///< duplicate registration
  kFailedPrecondition = 4,  ///< called in the wrong state
  kOutOfRange = 5,          ///< index or value outside what is allowed
  kUnimplemented = 6,       ///< this implementation does not support the request
  kInternal = 7,            ///< a broken invariant: a bug
  kUnavailable = 8,         ///< a device or peer is not there
  kResourceExhausted = 9,   ///< out of memory or another resource
  kIoError = 10,            ///< reading or writing a file failed
  kAborted = 11,            ///< stopped on request or because a peer failed
  kDeadlineExceeded = 12,   ///< a timeout expired
  kAbiMismatch = 13,        ///< plugin and core disagree on the ABI or an interface version
  kDataLoss = 14,           ///< stored data is damaged (checksum mismatch, truncated file)
};

/// Returns the lower-case name of a code ("invalid_argument"); "unknown" for others.
inline const char* code_name(Code code) noexcept {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kNotFound:
      return "not_found";
    case Code::kAlreadyExists:
      return "already_exists";
    case Code::kFailedPrecondition:
      return "failed_precondition";
    case Code::kOutOfRange:
      return "out_of_range";
    case Code::kUnimplemented:
      return "unimplemented";
    case Code::kInternal:
      return "internal";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kResourceExhausted:
      return "resource_exhausted";
    case Code::kIoError:
      return "io_error";
    case Code::kAborted:
      return "aborted";
    case Code::kDeadlineExceeded:
      return "deadline_exceeded";
    case Code::kAbiMismatch:
      return "abi_mismatch";
    case Code::kDataLoss:
      return "data_loss";
  }
  return "unknown";
}

/// The result of a call across the boundary. Trivially copyable; 24 bytes.
struct Status {
  Code code;            ///< kOk on success
  const char* message;  ///< NUL-terminated UTF-8, null on success; owned by `release`
  /// Frees `message`. Set by the library that allocated it; null when message is null.
  void (*release)(const char* message);
};

namespace detail {
// Each library that includes this header gets its own copy (hidden visibility), so the
// pointer stored in a Status frees with the allocator of the library that made it.
inline void status_free_message(const char* message) { free(const_cast<char*>(message)); }
}  // namespace detail

/// A successful status.
inline Status ok_status() noexcept { return Status{Code::kOk, nullptr, nullptr}; }

/// A failed status with a copy of `message` (`length` bytes, not NUL-terminated needed).
/// \param code     the error code, not kOk
/// \param message  text that names the place and the fix
/// \param length   bytes of `message` to copy
inline Status make_status(Code code, const char* message, size_t length) noexcept {
  char* copy = static_cast<char*>(malloc(length + 1));
  if (copy == nullptr) return Status{code, nullptr, nullptr};  // message lost, code kept
  memcpy(copy, message, length);
  copy[length] = '\0';
  return Status{code, copy, &detail::status_free_message};
}

/// A failed status with a copy of the NUL-terminated `message`.
inline Status make_status(Code code, const char* message) noexcept {
  return make_status(code, message, strlen(message));
}

/// Frees the message of `status` (safe on success and on an already released status).
inline void status_release(Status* status) noexcept {
  if (status->message != nullptr && status->release != nullptr) status->release(status->message);
  status->message = nullptr;
  status->release = nullptr;
}

}  // namespace loom
