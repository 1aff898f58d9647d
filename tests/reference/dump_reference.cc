// dump_reference SPEC OUT_DIR PLUGIN_DIR...: runs a tiny model the way `loom train` does and
// writes what tests/reference/check_against_torch.py compares with PyTorch:
//   OUT_DIR/weights.safetensors  initial parameters (f32), by Megatron name
//   OUT_DIR/forward.safetensors  batch 0 (tokens, labels, loss_mask, and for packed documents
//                                position_ids and segment_ids), its logits, loss and every
//                                parameter's gradient ("grad.<name>")
//   OUT_DIR/train.json           per step: the batch's tokens and labels, loss, grad norm, lr
//   OUT_DIR/final.safetensors    parameters after the steps
//   OUT_DIR/master.safetensors   (bf16 or f16 parameters) the f32 master weights after them
//   OUT_DIR/modules.json         every module's path, in tree order (the ids of the dropout
//                                streams are hashes of these; the checker derives the streams
//                                itself and uses the list only to say which path it missed)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "core/plugin/catalog.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/spec.h"
#include "core/train/trainer.h"
#include "core/util/errors.h"
#include "tests/reference/safetensors_io.h"

namespace fs = std::filesystem;
using namespace loom;
using reference::TensorBytes;
using reference::write_safetensors_file;

namespace {

std::vector<float> as_floats(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(numel(v)));
  core::load_floats(v, out.data());
  return out;
}

// `v` (a parameter's value or gradient, one rank holding it whole) without the padding rows
// of a padded parameter (ParamInfo::valid_rows): what PyTorch's unpadded model holds. The
// padding must be exactly 0 (it starts at 0 and its gradient is 0): anything else fails.
std::vector<float> valid_part(const core::Parameter& p, const TensorView& v, const char* what,
                              std::vector<int64_t>* shape) {
  std::vector<float> all = as_floats(v);
  shape->assign(v.shape, v.shape + v.ndim);
  if (v.ndim == 0 || p.valid_rows() == v.shape[0]) return all;
  const size_t keep = all.size() / static_cast<size_t>(v.shape[0]) *
                      static_cast<size_t>(p.valid_rows());
  for (size_t i = keep; i < all.size(); ++i)
    if (all[i] != 0.f)
      throw std::runtime_error(p.name + ": the " + what + " of padding row " +
                               std::to_string(i / (all.size() / v.shape[0])) + " is " +
                               std::to_string(all[i]) + ", not 0");
  (*shape)[0] = p.valid_rows();
  all.resize(keep);
  return all;
}

void dump_params(core::ParameterSet& params, const fs::path& path) {
  std::vector<std::vector<float>> keep;
  std::vector<TensorBytes> entries;
  keep.reserve(params.all().size());
  for (core::Parameter& p : params.all()) {
    std::vector<int64_t> shape;
    keep.push_back(valid_part(p, p.value, "value", &shape));
    entries.push_back({p.name, DType::kF32, shape, keep.back().data()});
  }
  write_safetensors_file(path, entries);
}

int run(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: dump_reference SPEC OUT_DIR PLUGIN_DIR...\n");
    return 2;
  }
  fs::path out = argv[2];
  fs::create_directories(out);
  nlohmann::json spec = core::load_spec_file(argv[1]);
  // The test's own options (not loom's): {"packed_documents": true} makes batch 0 rows of
  // several documents, as a packed dataset with reset_position_ids, reset_attention_mask
  // and eod_mask_loss gives them: positions restart and attention stays within each
  // document, and the loss skips each document's last token (its EOD).
  nlohmann::json test_options = spec.value("reference", nlohmann::json::object());
  spec.erase("reference");
  std::vector<core::SearchRoot> roots;
  for (int i = 3; i < argc; ++i) roots.push_back({fs::absolute(argv[i]), "test"});
  auto catalog = std::make_unique<core::Catalog>(roots);
  core::resolve_spec(spec, *catalog);
  core::PluginManager plugins(std::move(*catalog), nlohmann::json::object(),
                              spec["train"]["seed"].get<uint64_t>());
  plugins.load_all();
  core::Trainer trainer(spec, plugins, nullptr, {{"return_logits", true}});
  dump_params(trainer.params(), out / "weights.safetensors");
  {
    nlohmann::json paths = nlohmann::json::array();
    for (const auto& [path, module] : trainer.params().modules()) paths.push_back(path);
    std::ofstream(out / "modules.json") << paths.dump() << "\n";
  }

  // Batch 0: logits, loss and gradients with d(loss) = 1.
  core::Batch batch;
  int64_t start = trainer.data().position();
  trainer.data().next_train(batch);
  trainer.data().seek(start);
  if (test_options.value("packed_documents", false)) {
    int64_t b = batch.batch, t = batch.seq_length;
    batch.position_ids.assign(static_cast<size_t>(b * t), 0);
    batch.segment_ids.assign(static_cast<size_t>(b * t), 0);
    for (int64_t r = 0; r < b; ++r) {
      // Row r: documents ending after positions 2 + 3r and t / 2 + r (in range), and the rest.
      std::vector<int64_t> ends = {std::min(2 + 3 * r, t - 1), std::min(t / 2 + r, t - 1), t - 1};
      int32_t segment = 0;
      int64_t begin = 0;
      for (int64_t i = 0; i < t; ++i) {
        size_t k = static_cast<size_t>(r * t + i);
        batch.segment_ids[k] = segment;
        batch.position_ids[k] = static_cast<int32_t>(i - begin);
        bool last = std::find(ends.begin(), ends.end(), i) != ends.end();
        batch.loss_mask[k] = last ? 0.f : 1.f;
        if (last) ++segment, begin = i + 1;
      }
    }
  }
  trainer.params().zero_grads();
  std::vector<float> logits;
  float loss = static_cast<float>(trainer.forward_backward(batch, 1.0, &logits));
  {
    std::vector<std::vector<float>> keep;
    std::vector<TensorBytes> entries;
    keep.reserve(trainer.params().all().size());
    int64_t b = batch.batch, t = batch.seq_length;
    entries.push_back({"tokens", DType::kI32, {b, t}, batch.tokens.data()});
    entries.push_back({"labels", DType::kI32, {b, t}, batch.labels.data()});
    entries.push_back({"loss_mask", DType::kF32, {b, t}, batch.loss_mask.data()});
    if (!batch.position_ids.empty())
      entries.push_back({"position_ids", DType::kI32, {b, t}, batch.position_ids.data()});
    if (!batch.segment_ids.empty())
      entries.push_back({"segment_ids", DType::kI32, {b, t}, batch.segment_ids.data()});
    // (B, T, V): the Trainer leaves a padded vocabulary's padding columns out.
    entries.push_back({"logits",
                       DType::kF32,
                       {b, t, static_cast<int64_t>(logits.size()) / (b * t)},
                       logits.data()});
    entries.push_back({"loss", DType::kF32, {}, &loss});
    for (core::Parameter& p : trainer.params().all()) {
      std::vector<int64_t> shape;
      keep.push_back(valid_part(p, p.grad, "gradient", &shape));
      entries.push_back({"grad." + p.name, DType::kF32, shape, keep.back().data()});
    }
    write_safetensors_file(out / "forward.safetensors", entries);
  }

  // Training steps: record each step's batch, loss, grad norm and LR.
  nlohmann::json steps = nlohmann::json::array();
  int64_t n = spec["train"]["steps"].get<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t pos = trainer.data().position();
    trainer.data().next_train(batch);
    trainer.data().seek(pos);
    core::StepResult r = trainer.step();
    steps.push_back({{"step", r.step},
                     {"tokens", batch.tokens},
                     {"labels", batch.labels},
                     {"loss", r.loss},
                     {"grad_norm", r.grad_norm},
                     {"lr", r.lr},
                     {"loss_scale", r.loss_scale},
                     {"skipped", r.skipped}});
  }
  std::ofstream(out / "train.json") << steps.dump() << "\n";
  dump_params(trainer.params(), out / "final.safetensors");
  {
    // bf16 or f16 parameters: the optimizer's f32 master weights after the steps too.
    std::vector<core::SaveTensor> tensors = trainer.checkpoint_tensors();
    std::vector<TensorBytes> masters;
    const std::string prefix = "optim.master.";
    for (const core::SaveTensor& t : tensors)
      if (t.name.rfind(prefix, 0) == 0 && t.dtype == DType::kF32 &&
          t.slice_shape() == t.shape)
        masters.push_back({t.name.substr(prefix.size()), DType::kF32, t.shape, t.data});
    if (!masters.empty()) write_safetensors_file(out / "master.safetensors", masters);
  }
  std::printf("dump_reference: wrote %s (loss %.6f)\n", out.string().c_str(), loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_reference: %s\n", e.what());
    return 1;
  }
}
