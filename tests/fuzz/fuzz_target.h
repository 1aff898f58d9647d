// Fuzz targets for every parser of outside input (specs, --set overrides, .idx/.bin,
// tokenizer files, safetensors headers, checkpoint metadata, plugin manifests, rendezvous
// store values).
//
// A target is a file NAME_fuzz.cc whose body is written once with LOOM_FUZZ_TARGET(NAME):
//   - built by tools/fuzz (clang, -DLOOM_FUZZ_LIBFUZZER) it is libFuzzer's
//     `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`;
//   - built into //tests/fuzz:replay_test (gcc, the normal and ASan configs) it registers
//     itself under NAME, and the replay main runs it over tests/fuzz/corpus/NAME/ and
//     tests/fuzz/regressions/NAME/.
// The body runs inside `loom::fuzz::guarded`: a loom::Error (core's error classes derive
// from it) is a clean refusal and passes; any other exception is the "internal error" class
// of bug, and aborts, so libFuzzer (or the replay test) reports it as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <typeinfo>

#include "loom/cpp/error.h"

namespace loom::fuzz {

using TargetFn = int (*)(const uint8_t* data, size_t size);

/// Adds `fn` to the replay test's targets (not called in a libFuzzer build).
bool register_target(const char* name, TargetFn fn);
/// The registered targets, by name.
const std::map<std::string, TargetFn>& targets();

/// Runs `body`; returns normally for success or a loom::Error, aborts for anything else.
template <class Body>
void guarded(const char* target, Body&& body) {
  try {
    body();
  } catch (const loom::Error&) {
    // A clean refusal: what the user sees is one message and a documented exit code.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz target %s: uncaught %s (not a loom::Error): %s\n", target,
                 typeid(e).name(), e.what());
    std::abort();
  }
}

/// A directory of this process's own for the files a target writes (created once, removed
/// at exit).
const std::filesystem::path& scratch_dir();

/// Writes `bytes` to `path` (truncating).
void write_bytes(const std::filesystem::path& path, std::string_view bytes);

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace loom::fuzz

#define LOOM_FUZZ_BODY_NAME_(name) loom_fuzz_body_##name
#ifdef LOOM_FUZZ_LIBFUZZER
#define LOOM_FUZZ_TARGET(name)                                                          \
  static void LOOM_FUZZ_BODY_NAME_(name)(const uint8_t* data, size_t size);             \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {             \
    loom::fuzz::guarded(#name, [&] { LOOM_FUZZ_BODY_NAME_(name)(data, size); });        \
    return 0;                                                                           \
  }                                                                                     \
  static void LOOM_FUZZ_BODY_NAME_(name)(const uint8_t* data, size_t size)
#else
#define LOOM_FUZZ_TARGET(name)                                                          \
  static void LOOM_FUZZ_BODY_NAME_(name)(const uint8_t* data, size_t size);             \
  static int loom_fuzz_entry_##name(const uint8_t* data, size_t size) {                 \
    loom::fuzz::guarded(#name, [&] { LOOM_FUZZ_BODY_NAME_(name)(data, size); });        \
    return 0;                                                                           \
  }                                                                                     \
  [[maybe_unused]] static const bool loom_fuzz_registered_##name =                      \
      loom::fuzz::register_target(#name, loom_fuzz_entry_##name);                       \
  static void LOOM_FUZZ_BODY_NAME_(name)(const uint8_t* data, size_t size)
#endif
