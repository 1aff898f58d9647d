// Registers a component that testgood registers too: loading both must fail cleanly.
#include <loom/sdk.h>

#include "tests/plugins/common/test_module.h"

namespace {

class DupScale final : public loom::testing::TestModule<loom::INorm> {
 public:
  DupScale(const nlohmann::json&, loom::IBuildContext&) {}
};

class TestDup final : public loom::Plugin {
 public:
  void register_components(loom::Registrar& r) override { r.factory<DupScale>("test_scale"); }
};

}  // namespace

LOOM_PLUGIN(TestDup)
