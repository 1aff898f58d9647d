#include "plugins/comm_gloo/failure.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace loom::comm_gloo {
namespace {

bool contains(const std::string& text, const char* needle) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find(needle) != std::string::npos;
}

// gloo prefixes its messages with "[file:line] " and some span lines: keep one line of the
// part that says what happened.
std::string gloo_text(const char* what) {
  std::string text = what;
  if (!text.empty() && text[0] == '[') {
    size_t end = text.find("] ");
    if (end != std::string::npos) text = text.substr(end + 2);
  }
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

std::string seconds(int64_t ms) {
  char buf[32];
  if (ms % 1000 == 0)
    std::snprintf(buf, sizeof(buf), "%lld s", static_cast<long long>(ms / 1000));
  else
    std::snprintf(buf, sizeof(buf), "%g s", static_cast<double>(ms) / 1000.0);
  return buf;
}

int32_t peer_in(const std::string& text, const FailureContext& context) {
  if (context.peer_addresses != nullptr)
    for (size_t rank = 0; rank < context.peer_addresses->size(); ++rank) {
      const std::string& address = (*context.peer_addresses)[rank];
      if (!address.empty() && text.find(address) != std::string::npos)
        return static_cast<int32_t>(rank);
    }
  return context.known_peer;
}

Failure timed_out(const FailureContext& context, int32_t peer) {
  std::string waiting = peer >= 0 ? "rank " + std::to_string(peer) + " (or the ranks it waits for)"
                                  : "the other ranks";
  return {Code::kDeadlineExceeded,
          context.what + ": timed out after " + seconds(context.timeout_ms) + " waiting for " +
              waiting + "; a rank is stuck or dead (raise parallel.timeout_s if it is just slow)"};
}

Failure io_failure(const std::string& text, const FailureContext& context) {
  const int32_t peer = peer_in(text, context);
  if (contains(text, "timed out") || contains(text, "timeout")) return timed_out(context, peer);
  const bool closed = contains(text, "closed") || contains(text, "reset") ||
                      contains(text, "broken pipe") || contains(text, "eof");
  // A peer that gave up after its own timeout closes its connections: seen from here the
  // connection closes when (nearly) the whole timeout has passed. That is a timeout of the
  // group, not a crash; 9/10 leaves room for the ranks entering the operation at
  // slightly different times.
  if (closed && context.timeout_ms > 0 && context.elapsed_ms * 10 >= context.timeout_ms * 9)
    return timed_out(context, -1);
  const std::string who = peer >= 0 ? "rank " + std::to_string(peer) : "a peer";
  if (closed)
    return {Code::kAborted,
            context.what + ": " + who + " closed the connection (it exited, crashed or failed " +
                "itself); check " + (peer >= 0 ? "its" : "the other ranks'") + " output"};
  return {Code::kAborted, context.what + ": the connection to " + who + " failed (gloo: " + text +
                              "); check " + (peer >= 0 ? "its" : "the other ranks'") +
                              " output and the network"};
}

}  // namespace

Failure classify_failure(std::exception_ptr error, const FailureContext& context) {
  try {
    std::rethrow_exception(error);
  } catch (const gloo::IoException& e) {
    return io_failure(gloo_text(e.what()), context);
  } catch (const gloo::EnforceNotMet& e) {
    return {Code::kInternal, context.what + ": gloo rejected the call (" + gloo_text(e.what()) +
                                 "); the ranks probably disagree on this operation's sizes, "
                                 "dtypes or order"};
  } catch (const std::bad_alloc&) {
    return {Code::kResourceExhausted, context.what + ": out of host memory"};
  } catch (const std::exception& e) {
    std::string text = gloo_text(e.what());
    // Exceptions other than IoException can still carry socket errors (std::system_error).
    if (contains(text, "closed") || contains(text, "reset") || contains(text, "timed out"))
      return io_failure(text, context);
    return {Code::kInternal, context.what + ": " + text};
  } catch (...) {
    return {Code::kInternal, context.what + ": unknown exception"};
  }
}

}  // namespace loom::comm_gloo
