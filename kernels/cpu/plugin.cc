// The `kernels_cpu` plugin: registers every kernel of the CPU library (cpu_kernels.h).
//
// Modules resolve a kernel once, without an example call, so the highest-priority kernel
// of an op is used without asking its `supports`. On a CPU without AVX2/FMA/F16C the fast
// kernels are therefore not registered at all, and every op runs its reference.
#include <loom/sdk.h>

#include <cstring>

#include "kernels/cpu/common.h"
#include "kernels/cpu/cpu_kernels.h"

namespace {

class KernelsCpu final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    bool fast = loom::kernels::cpu::cpu_has_avx2();
    if (!fast)
      log(loom::LogLevel::kWarning,
          "this CPU lacks AVX2/FMA/F16C: only the reference kernels are registered (slow)");
    for (const loom::KernelDesc& k : loom::kernels::cpu::all_kernels()) {
      if (!fast && std::strcmp(k.name, loom::kernels::cpu::kFastName) == 0) continue;
      r.kernel(k);
    }
  }
};

}  // namespace

LOOM_PLUGIN(KernelsCpu)
