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

// This rank's box of `p` in the whole tensor: slice tp_rank along the split dimension.
struct Box {
  std::vector<int64_t> offset, shape;
};
Box box_of(const Parameter& p, int64_t tp_rank) {
  Box b;
  for (int32_t d = 0; d < p.info.ndim; ++d) {
    b.shape.push_back(p.info.shape[d]);
    b.offset.push_back(p.slice_start(d, tp_rank));
  }
  return b;
}

// A request for the box of `p` in tensor `name`, read as f32 into `into`.
CheckpointTensor request_of(const std::string& name, const Parameter& p, int64_t tp_rank,
                            void* into, Device device) {
  Box b = box_of(p, tp_rank);
  CheckpointTensor t{};
  t.struct_size = sizeof(CheckpointTensor);
  t.name = name.c_str();
  t.ndim = p.info.ndim;
  for (int32_t d = 0; d < p.info.ndim; ++d) {
    t.global_shape[d] = p.info.global_shape[d];
    t.offset[d] = b.offset[static_cast<size_t>(d)];
  }
  t.data = make_view(into, DType::kF32, b.shape.data(), t.ndim, device);
  return t;
}

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

std::vector<SaveTensor> Trainer::checkpoint_tensors() {
  // What each parameter's optimizer data is: [master if not f32, states...], as f32 arrays
  // of its local elements. With the distributed optimizer each rank holds only segments:
  // they are gathered first (every rank's segments into flat buffers, summed over dp).
  const int32_t state_count = optimizer_->state_count();
  const bool sharded = grad_sync_->sharded();
  const bool need_master = params_dtype_ != DType::kF32;
  std::vector<const float*> by_param_kind;  // [param * kinds + kind]
  const int32_t kinds = state_count + 1;    // kind 0: master
  std::vector<Parameter>& all = params_->all();
  by_param_kind.assign(all.size() * static_cast<size_t>(kinds), nullptr);
  auto index_of = [&](const Parameter* p) { return static_cast<size_t>(p - all.data()); };
  checkpoint_scratch_.clear();
  if (sharded) {
    ICommunicator* dp = nullptr;
    throw_if_error(plugins_.host().communicator(make_string_view("dp"), &dp), "the dp group");
    for (int32_t k = need_master ? 0 : 1; k < kinds; ++k) {
      checkpoint_scratch_.emplace_back(static_cast<size_t>(params_->flat_size()), 0.f);
      std::vector<float>& flat = checkpoint_scratch_.back();
      for (const auto& st : states_) {
        const TensorView& src = k == 0 ? st->master : st->states[static_cast<size_t>(k - 1)];
        throw_if_error(plugins_.host().copy(kCpu, flat.data() + st->segment.flat, device_, src.data,
                                            static_cast<uint64_t>(st->segment.length) * 4));
      }
      TensorView v = make_view(flat.data(), DType::kF32, {params_->flat_size()}, kCpu);
      throw_if_error(dp->all_reduce(&v, ReduceOp::kSum, nullptr),
                     "checkpoint: gathering the distributed optimizer's states");
      for (Parameter& p : all)
        by_param_kind[index_of(&p) * kinds + static_cast<size_t>(k)] = flat.data() + p.offset;
    }
  } else {
    for (const auto& st : states_) {
      size_t i = index_of(st->param);
      by_param_kind[i * kinds] = static_cast<const float*>(st->master.data);
      for (int32_t s = 0; s < state_count; ++s)
        by_param_kind[i * kinds + 1 + static_cast<size_t>(s)] =
            static_cast<const float*>(st->states[static_cast<size_t>(s)].data);
    }
  }
  std::vector<SaveTensor> out;
  if (dp_rank_ != 0) return out;  // data-parallel replicas hold the same
  for (Parameter& p : all) {
    // A replicated tensor is written once, by tensor-parallel rank 0.
    if (p.info.tp_split_dim < 0 && tp_rank_ != 0) continue;
    Box b = box_of(p, tp_rank_);
    size_t i = index_of(&p);
    out.push_back({"model." + p.name, p.info.dtype, shape_of(p), p.value.data, b.offset, b.shape});
    if (need_master)
      out.push_back(
          {master_name(p), DType::kF32, shape_of(p), by_param_kind[i * kinds], b.offset, b.shape});
    for (int32_t s = 0; s < state_count; ++s)
      out.push_back({state_name(*optimizer_, s, p), DType::kF32, shape_of(p),
                     by_param_kind[i * kinds + 1 + static_cast<size_t>(s)], b.offset, b.shape});
  }
  // The FP8 recipe's state (amax histories, scales): the same on every rank after a step
  // (the amaxes are reduced over tp and dp), so rank 0 writes it whole.
  if (fp8_ != nullptr && tp_rank_ == 0)
    for (int32_t i = 0; i < fp8_->state_count(); ++i) {
      auto [name, view] = fp8_state(i);
      std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
      out.push_back({name, DType::kF32, shape, view.data});
    }
  if (device_.type != DeviceType::kCpu) {
    // The writers read host memory: copy what still lives on the device (the flats of the
    // distributed optimizer are host memory already).
    checkpoint_bytes_.clear();
    checkpoint_bytes_.reserve(out.size());
    for (SaveTensor& t : out) {
      bool on_host = false;
      for (const std::vector<float>& f : checkpoint_scratch_)
        on_host = on_host || (t.data >= f.data() && t.data < f.data() + f.size());
      if (on_host) continue;
      int64_t n = 1;
      for (int64_t d : t.slice_shape()) n *= d;
      uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(t.dtype);
      checkpoint_bytes_.emplace_back((bytes + 7) / 8);
      throw_if_error(
          plugins_.host().copy(kCpu, checkpoint_bytes_.back().data(), device_, t.data, bytes),
          fmt::format("checkpoint: copying {} from the device", t.name));
      t.data = checkpoint_bytes_.back().data();
    }
  }
  return out;
}

nlohmann::json Trainer::checkpoint_metadata() const {
  if (plugin_hashes_.is_null()) {
    plugin_hashes_ = nlohmann::json::array();
    for (const LoadedPlugin& p : plugins_.loaded()) {
      std::string hash;
      try {
        hash = file_digest(p.record->library);
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

std::pair<std::string, TensorView> Trainer::fp8_state(int32_t index) const {
  const char* name = nullptr;
  TensorView view{};
  throw_if_error(fp8_->state(index, device_, &name, &view),
                 fmt::format("the FP8 recipe's state tensor {}", index));
  if (name == nullptr || view.dtype != DType::kF32)
    throw Error(Code::kInternal,
                fmt::format("the FP8 recipe's state tensor {} has no name or is not f32", index));
  return {std::string("fp8.") + name, view};
}

void Trainer::restore_fp8(CheckpointReader& reader) {
  if (fp8_ == nullptr || fp8_->state_count() == 0) return;
  std::vector<std::string> names;
  std::vector<CheckpointTensor> requests;
  for (int32_t i = 0; i < fp8_->state_count(); ++i) {
    auto [name, view] = fp8_state(i);
    if (!reader.has(name)) {
      log_warning("checkpoint",
                  fmt::format("{} holds no FP8 recipe state ('{}'; saved without "
                              "/precision/fp8 or with another recipe): the amax histories and "
                              "scales start afresh",
                              reader.dir().string(), name));
      return;
    }
    names.push_back(name);
    CheckpointTensor t{};
    t.struct_size = sizeof(CheckpointTensor);
    t.ndim = view.ndim;
    for (int32_t d = 0; d < view.ndim; ++d) t.global_shape[d] = view.shape[d];
    t.data = view;
    requests.push_back(t);
  }
  for (size_t i = 0; i < requests.size(); ++i) requests[i].name = names[i].c_str();
  reader.read(requests);
}

void Trainer::load_weights(CheckpointReader& reader) {
  reader.load_model(*params_, tp_rank_);
  for (auto& st : states_) {  // the master weights of this rank's segments
    const Parameter& p = *st->param;
    if (p.info.dtype == DType::kF32) continue;
    char* first = static_cast<char*>(p.value.data) +
                  st->segment.begin * static_cast<int64_t>(dtype_size(p.info.dtype));
    std::vector<float> staging(static_cast<size_t>(st->segment.length));
    load_floats(plugins_.host(), make_view(first, p.info.dtype, {st->segment.length}, device_),
                staging.data());
    copy_from_host(plugins_.host(), staging.data(), st->master);
  }
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

  reader.load_model(*params_, tp_rank_);
  // With the distributed optimizer each rank reads its parameters' whole local boxes into
  // flat buffers and keeps its segments; otherwise straight into the states.
  const bool sharded = grad_sync_->sharded();
  const int32_t state_count = optimizer_->state_count();
  const bool need_master = params_dtype_ != DType::kF32;
  std::vector<std::vector<float>> flats;
  if (sharded)
    for (int32_t k = 0; k < state_count + 1; ++k)
      flats.emplace_back(k == 0 && !need_master ? 0 : static_cast<size_t>(params_->flat_size()),
                         0.f);
  std::vector<std::string> names;
  std::vector<CheckpointTensor> requests;
  names.reserve(params_->all().size() * 3);
  auto request = [&](std::string name, const Parameter& p, void* into) {
    if (!reader.has(name))
      throw Error(Code::kNotFound,
                  fmt::format("checkpoint {}: no tensor '{}' (saved with optimizer '{}', this run "
                              "uses '{}'); to keep only the weights set checkpoint.init_from",
                              where, name, meta["trainer"].value("optimizer", "?"),
                              spec_["optimizer"].value("impl", "?")));
    names.push_back(std::move(name));
    // The flat buffers of the distributed optimizer are host memory.
    requests.push_back(request_of(names.back(), p, tp_rank_, into, sharded ? kCpu : device_));
  };
  if (sharded) {
    for (Parameter& p : params_->all()) {
      if (need_master) request(master_name(p), p, flats[0].data() + p.offset);
      for (int32_t s = 0; s < state_count; ++s)
        request(state_name(*optimizer_, s, p), p,
                flats[static_cast<size_t>(s) + 1].data() + p.offset);
    }
  } else {
    for (auto& st : states_) {
      const Parameter& p = *st->param;
      if (need_master) request(master_name(p), p, st->master.data);
      for (int32_t s = 0; s < state_count; ++s)
        request(state_name(*optimizer_, s, p), p, st->states[static_cast<size_t>(s)].data);
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) requests[i].name = names[i].c_str();
  reader.read(requests);
  if (sharded) {
    for (auto& st : states_) {
      size_t n = static_cast<size_t>(st->segment.length) * 4;
      IHost& host = plugins_.host();
      if (need_master)
        throw_if_error(
            host.copy(device_, st->master.data, kCpu, flats[0].data() + st->segment.flat, n));
      for (int32_t s = 0; s < state_count; ++s)
        throw_if_error(host.copy(device_, st->states[static_cast<size_t>(s)].data, kCpu,
                                 flats[static_cast<size_t>(s) + 1].data() + st->segment.flat, n));
    }
  }

  restore_fp8(reader);

  const nlohmann::json& t = meta["trainer"];
  iteration_ = t.value("iteration", reader.iteration());
  loss_scale_ = t.value("loss_scale", loss_scale_);
  good_steps_ = t.value("good_steps", int64_t{0});
  hysteresis_left_ = t.value("hysteresis_left", hysteresis_);
  nonfinite_in_a_row_ = t.value("nonfinite_in_a_row", int64_t{0});
  data_->seek(t.value("data_position", int64_t{0}));
}

}  // namespace loom::core
