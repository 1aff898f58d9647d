// The trainer's side of checkpoints: what it saves, and restoring it for an exact resume.
// The optimizer's tensors are the DistributedOptimizer's (core/optim/optimizer_checkpoint.cc).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/checkpoint/checkpoint_files.h"
#include "core/checkpoint/param_slices.h"
#include "core/train/trainer.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/gather_text.h"
#include "core/util/hash.h"
#include "core/util/log.h"
#include "core/version.h"
#include "loom/cpp/json_input.h"

namespace loom::core {
namespace {

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
  // The optimizer's tensors first (collective with the distributed optimizer).
  optim_->prepare_checkpoint();
  std::vector<SaveTensor> out;
  checkpoint_bytes_.clear();  // the host copies of the last save
  // Data-parallel replicas hold the same; an expert's parameters are written by the first
  // of its expert-data replicas (a rank of any data coordinate may own experts).
  const int expert_dp_rank =
      parallel_ != nullptr ? group(ParallelRole::kExpertData).rank() : 0;
  const int expert_tp_rank =
      parallel_ != nullptr ? group(ParallelRole::kExpertTensor).rank() : 0;
  for (Parameter& p : params_->all()) {
    const bool expert = (p.info.flags & kParamExpert) != 0;
    if ((expert ? expert_dp_rank : data_rank_) != 0) continue;
    // A replicated tensor is written once, by tensor-parallel rank 0.
    if (p.info.tp_split_dim < 0 && (expert ? expert_tp_rank : tp_rank_) != 0) continue;
    // The last pipeline stage's tied table is the first stage's copy: written there.
    if (config_.parallel.pp > 1 && pp_rank_ != 0 && (p.info.flags & kParamTiedEmbedding) != 0)
      continue;
    append_save_tensor(out, "model." + p.name, p, split_ranks_, p.value.data, p.info.dtype);
    optim_->append_checkpoint_tensors(p, out);
  }
  if (device_.type != DeviceType::kCpu) {
    // The writers read host memory: copy what still lives on the device.
    checkpoint_bytes_.reserve(out.size());
    for (SaveTensor& t : out) {
      // The distributed optimizer's gathered states are host memory already.
      if (optim_->checkpoint_on_host() && t.name.rfind("optim.", 0) == 0) continue;
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
  // The FP8 recipe's state (amax histories, scales), already in host memory.
  if (fp8_ != nullptr) append_fp8_state(out);
  return out;
}

namespace {

// A tensor of `shape` as (outer, the dimension `dim`, inner) blocks: the elements of entries
// [first, first + count) along `dim` are `outer` runs of count x inner, `q` x inner apart.
struct Columns {
  int64_t outer = 1, q = 1, inner = 1;
  Columns(const std::vector<int64_t>& shape, int32_t dim) {
    for (int32_t d = 0; d < static_cast<int32_t>(shape.size()); ++d)
      (d < dim ? outer : d == dim ? q : inner) *= shape[static_cast<size_t>(d)];
  }
  // Copies entries [first, first + count) of `whole` into `part` (gather), or back (scatter).
  void copy(float* whole, float* part, int64_t first, int64_t count, bool gather) const {
    for (int64_t o = 0; o < outer; ++o) {
      float* w = whole + (o * q + first) * inner;
      float* p = part + o * count * inner;
      const size_t bytes = static_cast<size_t>(count * inner) * sizeof(float);
      if (gather)
        std::memcpy(p, w, bytes);
      else
        std::memcpy(w, p, bytes);
    }
  }
};

}  // namespace

void Trainer::append_fp8_state(std::vector<SaveTensor>& out) {
  const Fp8StateLayout& layout = fp8_state_layout();
  if (tp_rank_ != 0 || data_rank_ != 0) return;
  for (int32_t i = 0; i < fp8_->state_count(); ++i) {
    auto [name, view] = fp8_state(i);
    const std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
    const int32_t dim = layout.dims[static_cast<size_t>(i)];
    if (dim < 0 && pp_rank_ != 0) continue;  // alike on every stage: stage 0 writes it
    std::vector<uint64_t> whole((nbytes(view) + 7) / 8);
    throw_if_error(plugins_.host().copy(kCpu, whole.data(), device_, view.data, nbytes(view)),
                   fmt::format("checkpoint: copying {} from the device", name));
    if (dim < 0 || layout.total == layout.local) {  // the whole tensor
      checkpoint_bytes_.push_back(std::move(whole));
      out.push_back({name, DType::kF32, shape, checkpoint_bytes_.back().data()});
      continue;
    }
    const Columns columns(shape, dim);
    for (const Fp8StateLayout::Chunk& c : layout.chunks) {
      if (c.count == 0) continue;  // a chunk without FP8 layers
      std::vector<int64_t> local = shape, offset(shape.size(), 0), global = shape;
      local[static_cast<size_t>(dim)] = c.count;
      offset[static_cast<size_t>(dim)] = c.offset;
      global[static_cast<size_t>(dim)] = layout.total;
      std::vector<uint64_t> part((columns.outer * c.count * columns.inner * 4 + 7) / 8);
      columns.copy(reinterpret_cast<float*>(whole.data()), reinterpret_cast<float*>(part.data()),
                   c.first, c.count, true);
      checkpoint_bytes_.push_back(std::move(part));
      out.push_back({name, DType::kF32, global, checkpoint_bytes_.back().data(), offset, local});
    }
  }
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
      {"loss_scale", scaler_.state().scale},
      {"good_steps", scaler_.state().good_steps},
      {"hysteresis_left", scaler_.state().hysteresis_left},
      {"nonfinite_in_a_row", nonfinite_in_a_row_},
      {"optimizer", spec_["optimizer"].value("impl", "")},
      {"rng",
       {{"seed", config_.train.seed},
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

const Trainer::Fp8StateLayout& Trainer::fp8_state_layout() {
  if (fp8_layout_) return *fp8_layout_;
  Fp8StateLayout layout;
  layout.local = -1;
  for (int32_t i = 0; i < fp8_->state_count(); ++i) {
    const int32_t dim = fp8_->interface_info().minor >= 2 ? fp8_->state_quantizer_dim(i) : -1;
    auto [name, view] = fp8_state(i);
    if (dim >= view.ndim)
      throw Error(Code::kInternal,
                  fmt::format("the FP8 recipe says {} ({} dimensions) runs over its quantisers "
                              "along dimension {}",
                              name, view.ndim, dim));
    if (dim >= 0) {
      if (layout.local >= 0 && view.shape[dim] != layout.local)
        throw Error(Code::kInternal,
                    fmt::format("the FP8 recipe's state tensors disagree on its number of "
                                "quantisers ({}: {}, the others {})",
                                name, view.shape[dim], layout.local));
      layout.local = view.shape[dim];
    }
    layout.dims.push_back(dim);
  }
  if (layout.local < 0) {  // no per-quantiser state (current scaling keeps none): no slices
    layout.local = 0;
    fp8_layout_ = std::move(layout);
    return *fp8_layout_;
  }
  // This rank's chunks (one without a pipeline or an older recipe: all its quantisers).
  std::vector<int64_t> counts(components_.fp8_chunk_quantizers.begin(),
                              components_.fp8_chunk_quantizers.end());
  if (counts.empty()) counts.push_back(layout.local);
  int64_t sum = 0;
  for (int64_t q : counts) sum += q;
  if (sum != layout.local)
    throw Error(Code::kInternal,
                fmt::format("the FP8 recipe holds state for {} quantisers, but the model's chunks "
                            "registered {}",
                            layout.local, sum));
  // Every stage's chunk counts, then the virtual stages in order: chunk c of stage r is
  // virtual stage c x pp + r.
  std::vector<std::vector<int64_t>> all = {counts};
  if (config_.parallel.pp > 1) {
    std::string mine;
    for (int64_t q : counts) mine += (mine.empty() ? "" : ",") + std::to_string(q);
    all.clear();
    for (const std::string& text :
         all_gather_text(group(ParallelRole::kPipeline), mine, "the FP8 state's layout")) {
      std::vector<int64_t> theirs;
      for (size_t at = 0; at <= text.size();) {
        size_t comma = std::min(text.find(',', at), text.size());
        theirs.push_back(std::stoll(text.substr(at, comma - at)));
        at = comma + 1;
      }
      if (theirs.size() != counts.size())
        throw Error(Code::kInternal, "pipeline stages with different numbers of virtual chunks");
      all.push_back(std::move(theirs));
    }
  }
  const int64_t stages = static_cast<int64_t>(all.size());
  int64_t first = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    Fp8StateLayout::Chunk chunk{first, counts[c], 0};
    for (size_t v = 0; v < c * stages + pp_rank_; ++v) chunk.offset += all[v % stages][v / stages];
    layout.chunks.push_back(chunk);
    first += counts[c];
  }
  for (const std::vector<int64_t>& stage : all)
    for (int64_t q : stage) layout.total += q;
  fp8_layout_ = std::move(layout);
  return *fp8_layout_;
}

void Trainer::check_fp8_state_agrees() {
  if (fp8_ == nullptr || parallel_ == nullptr) return;
  ICommunicator& amax = group(ParallelRole::kAmax);
  if (amax.size() <= 1) return;
  // A CRC-32C of each state tensor's bytes: equal on every rank, or the amax reduction (or
  // something writing into the recipe's state) is broken, and rank 0's copy would resume the
  // other ranks with scales they never had.
  std::string digest;
  std::vector<char> bytes;
  for (int32_t i = 0; i < fp8_->state_count(); ++i) {
    auto [name, view] = fp8_state(i);
    bytes.resize(static_cast<size_t>(numel(view)) * dtype_size(view.dtype));
    throw_if_error(plugins_.host().copy(kCpu, bytes.data(), device_, view.data, bytes.size()),
                   fmt::format("checkpoint: reading {} from the device", name));
    digest += fmt::format("{}={:08x};", name, crc32c_of(bytes.data(), bytes.size()));
  }
  std::vector<std::string> all = all_gather_text(amax, digest, "the FP8 state check");
  std::vector<std::string> differing;
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differing.push_back(std::to_string(r));
  if (!differing.empty())
    throw Error(Code::kInternal,
                fmt::format("checkpoint of step {}: the FP8 recipe's state (amax histories, "
                            "scales) of amax-group rank(s) {} differs from rank 0's ({} against "
                            "{}); the amaxes are reduced over tp, cp and dp after every step, so "
                            "this is a bug: please report it with the spec",
                            iteration_, join(differing), all[std::stoul(differing[0])], all[0]));
}

void Trainer::restore_fp8(CheckpointReader& reader) {
  if (fp8_ == nullptr || fp8_->state_count() == 0) return;
  const Fp8StateLayout& layout = fp8_state_layout();
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
  }
  for (int32_t i = 0; i < fp8_->state_count(); ++i) {
    auto [name, view] = fp8_state(i);
    const int32_t dim = layout.dims[static_cast<size_t>(i)];
    if (dim < 0) {  // whole, alike on every stage
      reader.read(name, view);
      continue;
    }
    // Each chunk's entries among the checkpoint's, into a host image of this rank's tensor.
    const std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
    const Columns columns(shape, dim);
    std::vector<float> whole(static_cast<size_t>(numel(view)));
    for (const Fp8StateLayout::Chunk& c : layout.chunks) {
      if (c.count == 0) continue;
      std::vector<int64_t> local = shape;
      local[static_cast<size_t>(dim)] = c.count;
      std::vector<float> part(static_cast<size_t>(columns.outer * c.count * columns.inner));
      CheckpointTensor t{};
      t.struct_size = sizeof(CheckpointTensor);
      t.name = name.c_str();
      t.ndim = view.ndim;
      for (int32_t d = 0; d < view.ndim; ++d) t.global_shape[d] = view.shape[d];
      t.global_shape[dim] = layout.total;
      t.offset[dim] = c.offset;
      t.data = make_view(part.data(), DType::kF32, local.data(), view.ndim);
      std::vector<CheckpointTensor> one{t};
      reader.read(one);
      columns.copy(whole.data(), part.data(), c.first, c.count, false);
    }
    throw_if_error(plugins_.host().copy(device_, view.data, kCpu, whole.data(), nbytes(view)),
                   fmt::format("checkpoint: copying {} to the device", name));
  }
}

void Trainer::load_weights(CheckpointReader& reader) {
  reader.load_model(*params_, split_ranks_);
  optim_->refresh_masters();
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

  reader.load_model(*params_, split_ranks_);
  optim_->restore(reader,
                  meta["trainer"].contains("optimizer") && meta["trainer"]["optimizer"].is_string()
                      ? meta["trainer"]["optimizer"].get<std::string>()
                      : std::string("?"),
                  spec_["optimizer"].value("impl", "?"));
  restore_fp8(reader);

  // Typed reads (the reader checked these types already; JsonIn names the place if not).
  JsonIn t(meta["trainer"], where + " trainer state", Code::kDataLoss,
           "the checkpoint is damaged; load an earlier one");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto integer = [&](const char* key, int64_t fallback) {
    return t.has(key) ? t[key].int64(0, kMax) : fallback;
  };
  iteration_ = integer("iteration", reader.iteration());
  LossScaler::State scale = scaler_.state();
  if (t.has("loss_scale")) scale.scale = t["loss_scale"].number();
  scale.good_steps = integer("good_steps", 0);
  scale.hysteresis_left = integer("hysteresis_left", config_.precision.hysteresis);
  scaler_.restore(scale);
  nonfinite_in_a_row_ = integer("nonfinite_in_a_row", 0);
  data_->seek(integer("data_position", 0));
}

}  // namespace loom::core
