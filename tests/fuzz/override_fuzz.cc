// `--set PATH=VALUE` overrides: apply the input (one or more assignments, one a line) to a
// fixed valid spec, then validate the result as `loom spec validate` would without --load.
#include <nlohmann/json.hpp>
#include <string>

#include "core/spec/spec.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

const nlohmann::json& base_spec() {
  static const nlohmann::json spec = nlohmann::json::parse(R"({
    "model": {"impl": "gpt", "num_layers": 2, "hidden_size": 64, "layers": [{"a": 1}, {"b": 2}]},
    "optimizer": {"impl": "adamw", "lr": 0.001},
    "train": {"micro_batch_size": 2, "global_batch_size": 4, "train_iters": 10, "seed": 1},
    "data": {"impl": "mock", "seq_length": 32},
    "parallel": {"tensor": 1, "pipeline": 1},
    "log": {"interval": 1}
  })");
  return spec;
}

}  // namespace

LOOM_FUZZ_TARGET(override) {
  nlohmann::json spec = base_spec();
  std::string_view text = loom::fuzz::as_text(data, size);
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    loom::core::apply_override(spec, std::string(text.substr(start, end - start)));
    start = end + 1;
  }
  auto lookup = [](const std::string&, const std::string&, nlohmann::json* schema) {
    *schema = true;  // any options
    return true;
  };
  loom::core::resolve_spec(
      spec, lookup, [](const std::string&) { return std::vector<std::string>{}; },
      [](const std::string&, const std::string&) { return std::string(); }, "(fuzz)");
  (void)spec.dump(2);
}
