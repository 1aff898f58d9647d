// A plugin whose init throws: the core must report it as a clean plugin error.
#include <loom/sdk.h>

namespace {

class TestInitFails final : public loom::Plugin {
 public:
  void init(const nlohmann::json&) override {
    loom::fail(loom::Code::kUnavailable, "license server unreachable (test)");
  }
  void register_components(loom::Registrar&) override {}
};

}  // namespace

LOOM_PLUGIN(TestInitFails)
