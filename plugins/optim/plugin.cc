// The optim plugin: optimizers over fp32 master weights (their math in the "adamw_step",
// "adamw_step_multi" and "sgd_step" kernels, so every device's kernel library serves them)
// and learning-rate schedules. Names, descriptions and option schemas are in manifest.json.
#include <loom/sdk.h>

#include "plugins/optim/adamw.h"
#include "plugins/optim/lr_schedule.h"
#include "plugins/optim/sgd.h"

namespace {

class Optim final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override {
    r.factory<loom::optim::AdamW>("adamw");
    r.factory<loom::optim::Sgd>("sgd");
    r.factory<loom::optim::ConstantSchedule>("constant");
    r.factory<loom::optim::LinearSchedule>("linear");
    r.factory<loom::optim::CosineSchedule>("cosine");
    r.factory<loom::optim::InverseSquareRootSchedule>("inverse_square_root");
    r.factory<loom::optim::WsdSchedule>("wsd");
  }
};

}  // namespace

LOOM_PLUGIN(Optim)
