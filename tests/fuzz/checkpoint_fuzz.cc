// Checkpoint metadata: the sealed JSON files of a sharded checkpoint (metadata.json and
// shards/rank_NNNNN.json, plugins/checkpoint) and the readers of what they hold: the
// sharded reader (format, version, world, the per-rank index), the shard index, and the
// model that `loom checkpoint convert` reads from the metadata (hf_model_from_metadata) or
// from a Hugging Face config.json (hf_model_from_config).
//
// A mutated file almost never keeps its checksum, so besides opening the input as it is,
// the target re-seals a parsed input (and its "shard" member as rank 0's index) so that the
// readers behind the checksum see the fuzzer's values.
#include <nlohmann/json.hpp>
#include <string>

#include "loom/cpp/json_input.h"
#include "plugins/checkpoint/hf_model.h"
#include "plugins/checkpoint/sealed_json.h"
#include "plugins/checkpoint/shard_index.h"
#include "plugins/checkpoint/sharded.h"
#include "tests/fuzz/fuzz_target.h"

namespace fs = std::filesystem;
using loom::fuzz::guarded;

LOOM_FUZZ_TARGET(checkpoint) {
  const std::string text(loom::fuzz::as_text(data, size));
  guarded("checkpoint", [&] { loom::checkpoint::open_sealed_json(text, "metadata.json", "hint"); });
  nlohmann::json body = loom::parse_json_input(text, "metadata.json", loom::Code::kDataLoss);
  if (!body.is_object()) return;
  body.erase("checksum");
  const fs::path dir = loom::fuzz::scratch_dir() / "checkpoint";
  fs::remove_all(dir);
  fs::create_directories(dir / "shards");
  nlohmann::json shard;
  if (body.contains("shard") && body["shard"].is_object()) {
    shard = body["shard"];
    shard.erase("checksum");
    body.erase("shard");
    loom::fuzz::write_bytes(dir / "shards" / "rank_00000.json", loom::checkpoint::seal_json(shard));
    loom::fuzz::write_bytes(dir / "shards" / "rank_00000.bin", std::string(256, '\0'));
  }
  const std::string sealed = loom::checkpoint::seal_json(body);
  loom::fuzz::write_bytes(dir / "metadata.json", sealed);
  guarded("checkpoint", [&] {
    nlohmann::json opened = loom::checkpoint::open_sealed_json(sealed, dir / "metadata.json", "");
    if (opened != body) {
      std::fprintf(stderr, "checkpoint: a sealed body does not open to itself\n");
      std::abort();
    }
  });
  guarded("checkpoint", [&] { loom::checkpoint::ShardedReader reader(dir); });
  if (!shard.is_null())
    guarded("checkpoint", [&] { loom::checkpoint::index_from_json(shard, dir / "x.json"); });
  guarded("checkpoint", [&] { loom::checkpoint::index_from_json(body, dir / "x.json"); });
  guarded("checkpoint", [&] {
    loom::checkpoint::hf_model_from_metadata(body.contains("loom") ? body["loom"] : body);
  });
  guarded("checkpoint", [&] { loom::checkpoint::hf_model_from_config(body, dir / "config.json"); });
}
