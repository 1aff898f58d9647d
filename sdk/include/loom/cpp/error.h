// C++ conveniences for errors (header-only; nothing here crosses the boundary).
//
// Inside a plugin or the core, user errors are exceptions (`loom::Error`); at the plugin
// boundary `loom::guard` turns them into a Status, and `loom::throw_if_error` turns a
// Status back into an exception on the other side.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "loom/status.h"

namespace loom {

/// An error with a code. The message names the place and the fix.
class Error : public std::runtime_error {
 public:
  /// \param code     what kind of error (never kOk)
  /// \param message  what is wrong, where, and how to fix it
  Error(Code code, std::string message) : std::runtime_error(std::move(message)), code_(code) {}
  Code code() const noexcept { return code_; }

 private:
  Code code_;
};

/// Throws Error(code, message).
[[noreturn]] inline void fail(Code code, std::string message) {
  throw Error(code, std::move(message));
}

/// Returns the message of `status` ("(no message)" when it has none) and releases it; the
/// code stays readable afterwards.
inline std::string take_message(Status* status) {
  std::string message = status->message != nullptr ? status->message : "(no message)";
  status_release(status);
  return message;
}

/// Releases `status` and, when it failed, throws it as an Error.
/// \param status   what a boundary call returned
/// \param context  prefixed to the message when not empty ("plugin 'x' init: ...")
inline void throw_if_error(Status status, const std::string& context = {}) {
  if (status.code == Code::kOk) return;
  std::string message = take_message(&status);
  throw Error(status.code, context.empty() ? message : context + ": " + message);
}

/// Runs `body` and converts whatever it throws into a Status: for use inside every
/// `noexcept` method that implements an SDK interface.
template <class Body>
Status guard(Body&& body) noexcept {
  try {
    body();
    return ok_status();
  } catch (const Error& e) {
    return make_status(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_status(Code::kResourceExhausted, "out of host memory");
  } catch (const std::exception& e) {
    return make_status(Code::kInternal, e.what());
  } catch (...) {
    return make_status(Code::kInternal, "unknown exception");
  }
}

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace loom

/// Internal invariant: on failure throws loom::Error(kInternal) with file, line, the
/// condition and the streamed values, e.g. LOOM_CHECK(n > 0, "n=", n).
#define LOOM_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::loom::fail(::loom::Code::kInternal,                                                   \
                   ::loom::detail::concat(__FILE__, ":", __LINE__, ": check failed: ", #cond, \
                                          " " __VA_OPT__(, ) __VA_ARGS__));                   \
  } while (0)
