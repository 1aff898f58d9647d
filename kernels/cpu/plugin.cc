// The `kernels_cpu` plugin: registers every kernel of the CPU library (cpu_kernels.h).
#include <loom/sdk.h>

#include "kernels/cpu/cpu_kernels.h"

namespace {

class KernelsCpu final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    for (const loom::KernelDesc& k : loom::kernels::cpu::all_kernels()) r.kernel(k);
  }
};

}  // namespace

LOOM_PLUGIN(KernelsCpu)
