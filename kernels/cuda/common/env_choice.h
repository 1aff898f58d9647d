// The environment switches of the CUDA kernels (LOOM_ATTENTION_GENERIC, LOOM_CUBLASLT_DGELU,
// LOOM_CUBLASLT_REDUCTION, LOOM_CUDNN_CAUSAL, LOOM_CUDNN_PLANS, LOOM_FP8_QUANTIZE,
// LOOM_GEMM_ALGO, LOOM_NORM_BWD, LOOM_TF32X3, LOOM_TF32X3_WORKSPACE): each picks one of a few
// named variants of a kernel, to measure one against another on a GPU
// (tools/gpu_bundle_run.sh), not to tune a run.
#pragma once

#include <loom/cpp/error.h>

#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <string>

namespace loom::kernels::cuda {

/// The index in `values` of environment variable `var`'s value: 0 (the default, values'
/// first) when it is unset or empty. Any other value throws Error(kInvalidArgument) naming
/// `op`, the variable, its value and the values it takes. Read it once (a function-local
/// static) where the kernel decides.
inline size_t env_choice(const char* op, const char* var,
                         std::initializer_list<const char*> values) {
  const char* e = std::getenv(var);
  const std::string v = e != nullptr ? e : "";
  if (v.empty()) return 0;
  size_t i = 0;
  std::string names;
  for (const char* name : values) {
    if (v == name) return i;
    names += i == 0 ? std::string(name) + " (or leave it unset)"
                    : (i + 1 == values.size() ? " or " : ", ") + std::string(name);
    ++i;
  }
  throw Error(Code::kInvalidArgument,
              std::string(op) + ": environment variable " + var + " is '" + v + "': use " + names);
}

}  // namespace loom::kernels::cuda
