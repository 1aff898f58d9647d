// hf_reference: loom's side of the Hugging Face checks (tests/reference/hf_test.sh).
//
//   hf_reference export SPEC OUT_DIR PLUGIN_DIR...
//       builds SPEC's model (a GPT-2, LLaMA, Mixtral or Qwen2-MoE-style "gpt") with random
//       weights, exports them through the safetensors checkpoint format into OUT_DIR/model
//       (metadata: the resolved spec, the tensors, iteration 0) and writes
//       OUT_DIR/loom.safetensors with fixed "tokens" (B, T) and loom's "logits" (B, T, V)
//       for them.
//   hf_reference import HF_DIR PLUGIN_DIR...
//       reads a directory transformers wrote through the safetensors format: its metadata
//       (the spec synthesised from config.json) builds a loom model, its weights are loaded
//       by loom name, and the logits for HF_DIR/hf.safetensors's "tokens" are written to
//       HF_DIR/loom.safetensors.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/component/builder.h"
#include "core/plugin/catalog.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/spec.h"
#include "core/train/trainer.h"
#include "loom/cpp/object.h"
#include "loom/kinds.h"
#include "tests/reference/safetensors_io.h"

namespace fs = std::filesystem;
using namespace loom;

namespace {

struct Env {
  std::unique_ptr<core::PluginManager> plugins;
  ObjectPtr object;
  ICheckpointFormat* format = nullptr;
};

// Loads the plugins under `dirs` (after resolving `spec` against them, when given) and
// builds the safetensors format.
Env make_env(nlohmann::json* spec, char** dirs, int n) {
  std::vector<core::SearchRoot> roots;
  for (int i = 0; i < n; ++i) roots.push_back({fs::absolute(dirs[i]), "test"});
  auto catalog = std::make_unique<core::Catalog>(roots);
  if (spec != nullptr) core::resolve_spec(*spec, *catalog);
  uint64_t seed = spec != nullptr ? (*spec)["train"]["seed"].get<uint64_t>() : 0;
  Env env;
  env.plugins =
      std::make_unique<core::PluginManager>(std::move(*catalog), nlohmann::json::object(), seed);
  if (spec != nullptr)
    env.plugins->load_all();
  else
    env.plugins->load("checkpoint");
  env.object = core::build_component(*env.plugins, {{"impl", "safetensors"}},
                                     kinds::kCheckpointFormat, "/checkpoint/format");
  env.format = interface_cast<ICheckpointFormat>(env.object.get());
  if (env.format == nullptr) throw std::runtime_error("safetensors is not a checkpoint_format");
  return env;
}

// One request (or saved tensor) per parameter, named "model.<name>", whole: its valid rows
// (a padded vocabulary's table holds the vocabulary's rows only, as checkpoints do).
std::vector<CheckpointTensor> parameter_tensors(core::ParameterSet& params,
                                                std::vector<std::string>& names) {
  names.clear();
  for (core::Parameter& p : params.all()) names.push_back("model." + p.name);
  std::vector<CheckpointTensor> out;
  for (size_t i = 0; i < names.size(); ++i) {
    core::Parameter& p = params.all()[i];
    CheckpointTensor t{};
    t.struct_size = sizeof(CheckpointTensor);
    t.name = names[i].c_str();
    t.ndim = p.value.ndim;
    for (int32_t d = 0; d < t.ndim; ++d) t.global_shape[d] = p.value.shape[d];
    t.data = p.value;
    if (t.ndim > 0) t.global_shape[0] = t.data.shape[0] = p.valid_rows();
    out.push_back(t);
  }
  return out;
}

void check(Status status, const std::string& what) { throw_if_error(status, what); }

std::vector<float> logits_for(core::Trainer& trainer, const std::vector<int32_t>& tokens, int64_t b,
                              int64_t t) {
  core::Batch batch;
  batch.resize(b, t);
  batch.tokens = tokens;
  std::vector<float> logits;
  trainer.forward_only(batch, &logits);
  return logits;
}

void write_logits(const fs::path& path, std::vector<int32_t>& tokens, std::vector<float>& logits,
                  int64_t b, int64_t t) {
  int64_t v = static_cast<int64_t>(logits.size()) / (b * t);
  reference::write_safetensors_file(path, {{"tokens", DType::kI32, {b, t}, tokens.data()},
                                           {"logits", DType::kF32, {b, t, v}, logits.data()}});
}

// Gives every parameter random values (norm weights around 1), so that the layout of each
// tensor, biases and norms included, shows in the logits.
void randomise(core::ParameterSet& params) {
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.f, 0.2f);
  for (core::Parameter& p : params.all()) {
    if (p.value.dtype != DType::kF32 || !is_contiguous(p.value))
      throw std::runtime_error("hf_reference expects contiguous f32 parameters: " + p.name);
    bool norm_weight = p.name.find("layernorm.weight") != std::string::npos;
    auto* v = static_cast<float*>(p.value.data);
    // A padded table's padding rows stay 0 (the model keeps them there).
    const int64_t valid = p.value.ndim == 0 || p.value.shape[0] == 0
                              ? numel(p.value)
                              : numel(p.value) / p.value.shape[0] * p.valid_rows();
    for (int64_t i = 0; i < valid; ++i) v[i] = normal(rng) + (norm_weight ? 1.f : 0.f);
  }
}

int export_model(int argc, char** argv) {
  fs::path out = argv[3];
  fs::create_directories(out / "model");
  nlohmann::json spec = core::load_spec_file(argv[2]);
  Env env = make_env(&spec, argv + 4, argc - 4);
  core::Trainer trainer(spec, *env.plugins, nullptr, {{"return_logits", true}});
  randomise(trainer.params());
  std::vector<std::string> names;
  std::vector<CheckpointTensor> tensors = parameter_tensors(trainer.params(), names);
  nlohmann::json listed = nlohmann::json::object();
  for (const CheckpointTensor& t : tensors)
    listed[t.name] = {{"dtype", dtype_name(t.data.dtype)},
                      {"shape", std::vector<int64_t>(t.global_shape, t.global_shape + t.ndim)}};
  std::string metadata = nlohmann::json{
      {"format_version", 1},
      {"iteration", 0},
      {"spec", spec},
      {"tensors", listed}}.dump();
  std::string dir = (out / "model").string();
  check(env.format->save({dir.data(), dir.size()}, tensors.data(),
                         static_cast<int64_t>(tensors.size()), {metadata.data(), metadata.size()},
                         0, 1),
        "export");
  const int64_t b = spec["train"]["micro_batch_size"], t = spec["train"]["seq_length"];
  const int64_t v = spec["model"]["vocab_size"];
  std::vector<int32_t> tokens(static_cast<size_t>(b * t));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((7 * i + 3) % v);
  std::vector<float> logits = logits_for(trainer, tokens, b, t);
  write_logits(out / "loom.safetensors", tokens, logits, b, t);
  std::printf("hf_reference: exported %zu tensors to %s\n", tensors.size(), dir.c_str());
  return 0;
}

int import_model(int argc, char** argv) {
  fs::path hf = argv[2];
  reference::SafetensorsFileData hf_file = reference::read_safetensors_file(hf / "hf.safetensors");
  const SafetensorsTensor& tok = hf_file.get("tokens");
  const int64_t b = tok.shape[0], t = tok.shape[1];
  std::vector<int32_t> tokens(static_cast<size_t>(b * t));
  std::memcpy(tokens.data(), hf_file.data(tok), tokens.size() * 4);
  // Read the metadata, then build the model it describes.
  Env env = make_env(nullptr, argv + 3, argc - 3);
  std::string dir = hf.string();
  StringView text{};
  check(env.format->metadata({dir.data(), dir.size()}, &text), "metadata of " + dir);
  nlohmann::json metadata = nlohmann::json::parse(text.data, text.data + text.size);
  nlohmann::json spec = {
      {"model", metadata["spec"]["model"]},
      {"optimizer", {{"impl", "adamw"}}},
      {"data", {{"mock", true}}},
      {"train", {{"steps", 1}, {"micro_batch_size", b}, {"seq_length", t}, {"seed", 1}}}};
  core::resolve_spec(spec, env.plugins->catalog());
  env.plugins->load_all();
  core::Trainer trainer(spec, *env.plugins, nullptr, {{"return_logits", true}});
  std::vector<std::string> names;
  std::vector<CheckpointTensor> requests = parameter_tensors(trainer.params(), names);
  check(env.format->load({dir.data(), dir.size()}, requests.data(),
                         static_cast<int64_t>(requests.size())),
        "load " + dir);
  std::vector<float> logits = logits_for(trainer, tokens, b, t);
  write_logits(hf / "loom.safetensors", tokens, logits, b, t);
  std::printf("hf_reference: loaded %zu tensors from %s as %s\n", requests.size(), dir.c_str(),
              metadata["spec"]["model"].dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "export" && argc >= 5) return export_model(argc, argv);
    if (mode == "import" && argc >= 4) return import_model(argc, argv);
    std::fprintf(stderr,
                 "usage: hf_reference export SPEC OUT_DIR PLUGIN_DIR...\n"
                 "       hf_reference import HF_DIR PLUGIN_DIR...\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_reference: %s\n", e.what());
    return 1;
  }
}
