// Claims ABI minor LOOM_ABI_MINOR + 1 (newer than the core): the core must refuse it.
#include <loom/sdk.h>

#include <cstdlib>

namespace {

loom::Status must_not_run(loom::IHost*, loom::StringView, void**) { std::abort(); }
loom::Status no_register(void*, loom::IRegistry*) { std::abort(); }

}  // namespace

extern "C" LOOM_EXPORT const loom::PluginInfo* loom_plugin_v1() {
  static const loom::PluginInfo info{sizeof(loom::PluginInfo),
                                     LOOM_ABI_MAJOR,
                                     LOOM_ABI_MINOR + 1,
                                     "testabiminor",
                                     "0.1.0",
                                     LOOM_BUILD_FINGERPRINT_JSON,
                                     loom_embedded_manifest(),
                                     &must_not_run,
                                     &no_register,
                                     nullptr};
  return &info;
}
