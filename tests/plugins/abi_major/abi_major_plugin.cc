// Claims ABI major LOOM_ABI_MAJOR + 1: the core must refuse it before calling init.
#include <loom/sdk.h>

#include <cstdlib>

namespace {

loom::Status must_not_run(loom::IHost*, loom::StringView, void**) {
  std::abort();  // the ABI check must stop the load before init
}
loom::Status no_register(void*, loom::IRegistry*) { std::abort(); }

}  // namespace

extern "C" LOOM_EXPORT const loom::PluginInfo* loom_plugin_v1() {
  static const loom::PluginInfo info{sizeof(loom::PluginInfo),
                                     LOOM_ABI_MAJOR + 1,
                                     0,
                                     "testabimajor",
                                     "0.1.0",
                                     LOOM_BUILD_FINGERPRINT_JSON,
                                     loom_embedded_manifest(),
                                     &must_not_run,
                                     &no_register,
                                     nullptr};
  return &info;
}
