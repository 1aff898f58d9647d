// What a refused call says, for tests of argument checks: the message of the loom::Error it
// throws, with its code checked on the way.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "loom/cpp/error.h"

namespace loom::testing {

/// Runs `body`; returns the message of the Error it throws ("" when it throws none) and
/// expects that Error to carry `code`.
/// \param body  the call under test
/// \param code  the code a refusal must carry
template <class Body>
std::string refusal(Body&& body, Code code = Code::kInvalidArgument) {
  try {
    body();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  return "";
}

/// Whether `text` contains `part`.
inline bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace loom::testing
