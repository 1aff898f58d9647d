// Safetensors files: the SDK's codec over the bytes in memory (parse_safetensors: header
// length, the JSON header, dtypes, shapes, offsets) and the checkpoint plugin's reader of a
// whole file (mapped, "__metadata__"."crc32c" read and every tensor verified).
#include <string>

#include "loom/cpp/safetensors.h"
#include "plugins/checkpoint/safetensors_file.h"
#include "tests/fuzz/fuzz_target.h"

using loom::fuzz::guarded;

LOOM_FUZZ_TARGET(safetensors) {
  guarded("safetensors", [&] {
    loom::SafetensorsLayout layout = loom::parse_safetensors(data, size, "fuzz.safetensors");
    // Every tensor lies inside the file: touch its first and last byte.
    volatile unsigned char sink = 0;
    for (const auto& [name, t] : layout.tensors) {
      if (t.end <= t.begin) continue;
      sink = sink ^ data[layout.data_offset + t.begin] ^ data[layout.data_offset + t.end - 1];
    }
  });
  const std::filesystem::path path = loom::fuzz::scratch_dir() / "fuzz.safetensors";
  loom::fuzz::write_bytes(path, loom::fuzz::as_text(data, size));
  loom::checkpoint::SafetensorsReader reader(path);
  for (const auto& [name, t] : reader.tensors()) reader.verify(t, name);
}
