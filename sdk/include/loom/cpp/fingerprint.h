// The build fingerprint: compiler, C++ standard library and its ABI flags, CUDA and SDK
// versions, as JSON text known at compile time. The core logs a plugin's fingerprint and
// warns when the C++ ABI flags differ from its own.
#pragma once

#include <cstddef>  // defines the standard library's version macros

#include "loom/version.h"

#if defined(__clang__)
#define LOOM_FP_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define LOOM_FP_COMPILER "gcc " __VERSION__
#else
#define LOOM_FP_COMPILER "unknown"
#endif

#if defined(__GLIBCXX__)
#define LOOM_FP_STDLIB "libstdc++ " LOOM_STRINGIFY(__GLIBCXX__)
#define LOOM_FP_CXX11_ABI LOOM_STRINGIFY(_GLIBCXX_USE_CXX11_ABI)
#elif defined(_LIBCPP_VERSION)
#define LOOM_FP_STDLIB "libc++ " LOOM_STRINGIFY(_LIBCPP_VERSION)
#define LOOM_FP_CXX11_ABI "null"
#else
#define LOOM_FP_STDLIB "unknown"
#define LOOM_FP_CXX11_ABI "null"
#endif

#if defined(_GLIBCXX_DEBUG)
#define LOOM_FP_GLIBCXX_DEBUG "1"
#else
#define LOOM_FP_GLIBCXX_DEBUG "0"
#endif

#if defined(CUDART_VERSION)
#define LOOM_FP_CUDA "\"" LOOM_STRINGIFY(CUDART_VERSION) "\""
#else
#define LOOM_FP_CUDA "null"
#endif

/// The fingerprint of the translation unit that expands it, as a JSON string literal.
#define LOOM_BUILD_FINGERPRINT_JSON                                                 \
  "{\"compiler\":\"" LOOM_FP_COMPILER "\",\"cxx_stdlib\":\"" LOOM_FP_STDLIB         \
  "\",\"cxx11_abi\":" LOOM_FP_CXX11_ABI ",\"glibcxx_debug\":" LOOM_FP_GLIBCXX_DEBUG \
  ",\"cuda\":" LOOM_FP_CUDA ",\"sdk\":\"" LOOM_SDK_VERSION "\",\"abi\":\"" LOOM_ABI_STRING "\"}"
