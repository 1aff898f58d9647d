// Plugin manifests (core/plugin/catalog.cc): the input is a plugin.json; read_manifest checks
// it (schema, name, version, library, components and their option schemas), then a catalog
// scans the directory that holds it, as `loom plugins list` and spec validation do.
#include "core/plugin/catalog.h"
#include "tests/fuzz/fuzz_target.h"

using loom::fuzz::guarded;

LOOM_FUZZ_TARGET(manifest) {
  const std::filesystem::path root = loom::fuzz::scratch_dir() / "plugins";
  const std::filesystem::path dir = root / "fuzzed";
  std::filesystem::create_directories(dir);
  loom::fuzz::write_bytes(dir / "plugin.json", loom::fuzz::as_text(data, size));
  guarded("manifest", [&] {
    loom::core::PluginRecord record = loom::core::read_manifest(dir / "plugin.json", "fuzz");
    guarded("manifest", [&] { loom::core::check_library_file_exists(record); });
  });
  loom::core::Catalog catalog({{root, "fuzz"}});
  for (const loom::core::PluginRecord& p : catalog.plugins())
    for (const loom::core::ManifestComponent& c : p.components) {
      if (catalog.provider(c.kind, c.name) == nullptr) std::abort();
      (void)catalog.component_names(c.kind);
    }
}
