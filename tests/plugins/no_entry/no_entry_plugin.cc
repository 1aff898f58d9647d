// A shared object with the loom layout but no loom_plugin_v1: the core must say so.
extern "C" __attribute__((visibility("default"))) int loom_plugin_v0() { return 0; }
