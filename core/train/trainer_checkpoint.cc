// The trainer's side of checkpoints: what it saves, and restoring it for an exact resume.
#include <fmt/format.h>

#include "core/train/trainer.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/hash.h"
#include "core/util/log.h"
#include "core/version.h"

namespace loom::core {
namespace {

std::vector<int64_t> shape_of(const Parameter& p) {
  return std::vector<int64_t>(p.info.global_shape, p.info.global_shape + p.info.ndim);
}

std::string master_name(const Parameter& p) { return "optim.master." + p.name; }

std::string state_name(const IOptimizer& optimizer, int32_t s, const Parameter& p) {
  return fmt::format("optim.{}.{}", optimizer.state_name(s), p.name);
}

// Top-level keys of `a` and `b` (objects) whose values differ, as "/key" pointers.
std::vector<std::string> differing_keys(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::string> out;
  nlohmann::json patch = nlohmann::json::diff(a, b);
  for (const auto& op : patch) {
    std::string path = op.value("path", "");
    if (std::find(out.begin(), out.end(), path) == out.end()) out.push_back(path);
  }
  return out;
}

std::string join(const std::vector<std::string>& items, size_t limit = 6) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < limit; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > limit) s += fmt::format(" and {} more", items.size() - limit);
  return s;
}

}  // namespace

std::vector<SaveTensor> Trainer::checkpoint_tensors() const {
  std::vector<SaveTensor> out;
  for (const auto& st : states_) {
    const Parameter& p = *st->param;
    out.push_back({"model." + p.name, p.info.dtype, shape_of(p), p.value.data});
    if (p.info.dtype != DType::kF32)
      out.push_back({master_name(p), DType::kF32, shape_of(p), st->master.data});
    for (int32_t s = 0; s < static_cast<int32_t>(st->states.size()); ++s)
      out.push_back({state_name(*optimizer_, s, p), DType::kF32, shape_of(p), st->states[s].data});
  }
  return out;
}

nlohmann::json Trainer::checkpoint_metadata() const {
  if (plugin_hashes_.is_null()) {
    plugin_hashes_ = nlohmann::json::array();
    for (const LoadedPlugin& p : plugins_.loaded()) {
      std::string hash;
      try {
        hash = fmt::format("fnv1a64:{:016x}", fnv1a64(read_file(p.record->library)));
      } catch (const IoError&) {
        hash = "unreadable";
      }
      plugin_hashes_.push_back(
          {{"name", p.record->name}, {"version", p.info->version}, {"hash", hash}});
    }
  }
  nlohmann::json trainer = {
      {"iteration", iteration_},
      {"data_position", data_->position()},
      {"loss_scale", loss_scale_},
      {"good_steps", good_steps_},
      {"hysteresis_left", hysteresis_left_},
      {"nonfinite_in_a_row", nonfinite_in_a_row_},
      {"optimizer", spec_["optimizer"].value("impl", "")},
      {"rng",
       {{"seed", spec_["train"]["seed"]},
        {"scheme",
         "counter-based streams keyed by (seed, step, micro-batch, module id): the iteration "
         "is the whole state"}}}};
  return {{"format_version", 1}, {"iteration", iteration_},   {"spec", spec_},
          {"trainer", trainer},  {"plugins", plugin_hashes_}, {"loom_version", kLoomVersion}};
}

void Trainer::load_weights(CheckpointReader& reader) {
  reader.load_model(*params_);
  for (auto& st : states_)
    if (st->param->info.dtype != DType::kF32)
      load_floats(st->param->value, static_cast<float*>(st->master.data));
}

void Trainer::restore(CheckpointReader& reader) {
  const nlohmann::json& meta = reader.metadata();
  std::string where = reader.dir().string();
  if (!meta.contains("trainer") || !meta["trainer"].is_object())
    throw Error(Code::kInvalidArgument,
                fmt::format("checkpoint {} holds model weights only ({} format): resuming needs a "
                            "full training checkpoint; to start training from these weights set "
                            "checkpoint.init_from instead",
                            where, reader.format()));
  // Shapes are checked tensor by tensor below; other differences are worth a line.
  std::vector<std::string> model_diff = differing_keys(reader.model_spec(), spec_["model"]);
  if (!model_diff.empty())
    log_warning("checkpoint", fmt::format("{}: the model spec differs from the one that saved it "
                                          "at /model{}",
                                          where, join(model_diff)));
  const nlohmann::json& saved = meta.contains("spec") ? meta["spec"] : nlohmann::json::object();
  for (const char* key : {"data", "train"}) {
    if (!saved.contains(key)) continue;
    std::vector<std::string> diff = differing_keys(saved[key], spec_[key]);
    if (!diff.empty())
      log_warning("checkpoint",
                  fmt::format("{}: /{} differs from the saving run at {} (the data stream may "
                              "not continue where it stopped)",
                              where, key, join(diff)));
  }

  reader.load_model(*params_);
  std::vector<std::string> names;
  std::vector<CheckpointTensor> requests;
  names.reserve(states_.size() * 3);
  auto request = [&](std::string name, const Parameter& p, const TensorView& into) {
    if (!reader.has(name))
      throw Error(Code::kNotFound,
                  fmt::format("checkpoint {}: no tensor '{}' (saved with optimizer '{}', this run "
                              "uses '{}'); to keep only the weights set checkpoint.init_from",
                              where, name, meta["trainer"].value("optimizer", "?"),
                              spec_["optimizer"].value("impl", "?")));
    names.push_back(std::move(name));
    CheckpointTensor t{};
    t.struct_size = sizeof(CheckpointTensor);
    t.ndim = p.info.ndim;
    for (int32_t d = 0; d < p.info.ndim; ++d) t.global_shape[d] = p.info.global_shape[d];
    t.data = make_view(into.data, DType::kF32, t.global_shape, t.ndim, into.device);
    requests.push_back(t);
  };
  for (auto& st : states_) {
    const Parameter& p = *st->param;
    if (p.info.dtype != DType::kF32) request(master_name(p), p, st->master);
    for (int32_t s = 0; s < static_cast<int32_t>(st->states.size()); ++s)
      request(state_name(*optimizer_, s, p), p, st->states[s]);
  }
  for (size_t i = 0; i < requests.size(); ++i) requests[i].name = names[i].c_str();
  reader.read(requests);

  const nlohmann::json& t = meta["trainer"];
  iteration_ = t.value("iteration", reader.iteration());
  loss_scale_ = t.value("loss_scale", loss_scale_);
  good_steps_ = t.value("good_steps", int64_t{0});
  hysteresis_left_ = t.value("hysteresis_left", hysteresis_);
  nonfinite_in_a_row_ = t.value("nonfinite_in_a_row", int64_t{0});
  data_->seek(t.value("data_position", int64_t{0}));
}

}  // namespace loom::core
