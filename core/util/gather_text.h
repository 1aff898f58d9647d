// Every rank's text, gathered over a communicator: the lengths first, then the texts padded
// to the longest. For small, rare exchanges (the metrics of a log line, the tensor table of
// a checkpoint), not for data.
#pragma once

#include <string>
#include <vector>

#include "loom/kinds/comm_backend.h"

namespace loom::core {

/// Collective over `comm`: returns the `text` of every rank, by rank. Throws naming `what`
/// when a collective fails.
std::vector<std::string> all_gather_text(ICommunicator& comm, const std::string& text,
                                         const std::string& what);

}  // namespace loom::core
