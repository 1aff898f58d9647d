// What a failed Gloo operation means for the user: gloo reports every transport problem as
// an exception with a socket-level message; this turns it into a status code and a
// one-line message that names the operation, the group, this rank, the peer and the fix.
#pragma once

#include <loom/sdk.h>

#include <exception>
#include <string>
#include <vector>

namespace loom::comm_gloo {

/// A classified failure.
struct Failure {
  Code code = Code::kInternal;  ///< kDeadlineExceeded, kAborted or kInternal
  std::string message;          ///< one line, starting with the operation's description
};

/// Where and how an operation failed.
struct FailureContext {
  std::string what;         ///< "all_reduce on group 'dp/0' (rank 1 of 2)"
  int64_t timeout_ms = 0;   ///< the operation's timeout
  int64_t elapsed_ms = 0;   ///< how long it ran before failing
  int32_t known_peer = -1;  ///< the peer of a send/recv, else -1
  const std::vector<std::string>* peer_addresses = nullptr;  ///< gloo address text per rank
};

/// Classifies the exception `error` (gloo::IoException, gloo::EnforceNotMet or another
/// std::exception) thrown by the operation described by `context`:
/// - a gloo timeout, or a peer that hung up after ~the whole timeout (it timed out itself
///   and closed its connections): kDeadlineExceeded, "...: timed out after 5 s waiting for
///   the other ranks; a rank is stuck or dead (raise parallel.timeout_s if it is just slow)"
/// - a closed or reset connection: kAborted, "...: rank 0 closed the connection (it exited,
///   crashed or failed itself); check its output"
/// - another socket error: kAborted, naming gloo's message
/// - a failed gloo check (the ranks disagree on the call): kInternal
/// The peer rank is found by matching the address in gloo's message against
/// `peer_addresses`, or is `known_peer`. gloo names a peer by its published address only
/// on connections this rank opened; on those it accepted, the address is the peer's
/// ephemeral port, and the message then says "a peer".
Failure classify_failure(std::exception_ptr error, const FailureContext& context);

}  // namespace loom::comm_gloo
