#include "core/checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/schema/schema.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "loom/cpp/error.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds.h"

namespace fs = std::filesystem;

namespace loom::core {

std::string iteration_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

namespace {

// The iteration of a complete checkpoint directory name ("iter_0000100"), or -1.
int64_t parse_iteration_dir(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "iter_") != 0) return -1;
  int64_t value = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || value > (INT64_MAX - 9) / 10) return -1;
    value = value * 10 + (name[i] - '0');
  }
  return value;
}

std::string shape_text(const nlohmann::json& shape) { return shape.dump(); }

std::string shape_text(const int64_t* shape, int32_t ndim) {
  std::string s = "[";
  for (int32_t d = 0; d < ndim; ++d) s += (d ? "," : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace

std::optional<fs::path> read_latest(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_regular_file(root / "latest", ec)) return std::nullopt;
  std::string name;
  try {
    name = read_file(root / "latest");
  } catch (const IoError&) {
    return std::nullopt;
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (parse_iteration_dir(name) < 0 || !fs::is_directory(root / name, ec)) return std::nullopt;
  return root / name;
}

std::vector<fs::path> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    int64_t iteration = parse_iteration_dir(it->path().filename().string());
    if (iteration >= 0) found.emplace_back(iteration, it->path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<fs::path> out;
  for (auto& [iteration, path] : found) out.push_back(path);
  return out;
}

ObjectPtr make_checkpoint_format(PluginManager& plugins, nlohmann::json node,
                                 const std::string& pointer) {
  if (!node.is_object() || !node.contains("impl") || !node["impl"].is_string())
    throw SpecError(pointer, "expected an object {\"impl\": NAME} naming a checkpoint format");
  std::string name = node["impl"].get<std::string>();
  const std::string kind = kinds::kCheckpointFormat.kind;
  const PluginRecord* record = plugins.catalog().provider(kind, name);
  if (record == nullptr) {
    std::string known;
    for (const std::string& n : plugins.catalog().component_names(kind))
      known += (known.empty() ? "" : ", ") + n;
    throw SpecError(
        child_pointer(pointer, "impl"),
        fmt::format("unknown checkpoint format '{}' (known: {}); searched: {}", name,
                    known.empty() ? "none" : known, describe_roots(plugins.catalog().roots())));
  }
  if (!plugins.is_loaded(record->name)) plugins.load(record->name);
  nlohmann::json options = node;
  options.erase("impl");
  validate(plugins.catalog().component(kind, name)->options, options, pointer, {});
  options["impl"] = name;
  return build_component(plugins, options, kinds::kCheckpointFormat, pointer);
}

std::string detect_format(PluginManager& plugins, const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw IoError(fmt::format("checkpoint {}: not a directory", dir.string()));
  std::vector<std::string> names = plugins.catalog().component_names(kinds::kCheckpointFormat.kind);
  for (const std::string& name : names) {
    ObjectPtr object =
        make_checkpoint_format(plugins, {{"impl", name}}, "(checkpoint format " + name + ")");
    auto* format = interface_cast<ICheckpointFormat>(object.get());
    std::string text = dir.string();
    if (format != nullptr && format->recognizes(StringView{text.data(), text.size()})) return name;
  }
  std::string tried;
  for (const std::string& n : names) tried += (tried.empty() ? "" : ", ") + n;
  throw IoError(fmt::format(
      "{}: not a checkpoint in any known format (tried: {}); expected a loom checkpoint "
      "(metadata.json), a checkpoint root (iter_* directories) or a Hugging Face model "
      "directory (config.json + model.safetensors)",
      dir.string(), tried.empty() ? "none: is the checkpoint plugin on the search path?" : tried));
}

CheckpointReader::CheckpointReader(PluginManager& plugins, const fs::path& path,
                                   const std::string& format)
    : plugins_(plugins) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw IoError(fmt::format("checkpoint {}: no such file or directory", path.string()));
  dir_ = path;
  // A root: follow `latest`, else take the newest complete iteration.
  std::vector<fs::path> all = list_checkpoints(path);
  if (std::optional<fs::path> latest = read_latest(path)) {
    dir_ = *latest;
  } else if (!all.empty()) {
    if (fs::exists(path / "latest", ec))
      log_warning("checkpoint", fmt::format("{}: `latest` does not name a checkpoint here; "
                                            "reading the newest one, {}",
                                            path.string(), all.front().filename().string()));
    dir_ = all.front();
  }
  format_ = format.empty() ? detect_format(plugins_, dir_) : format;
  object_ = make_checkpoint_format(plugins_, {{"impl", format_}}, "(checkpoint format)");
  impl_ = interface_cast<ICheckpointFormat>(object_.get());
  if (impl_ == nullptr)
    throw PluginError(Code::kAbiMismatch,
                      fmt::format("checkpoint format '{}' is not a checkpoint_format", format_));
  std::string text = dir_.string();
  StringView json{};
  throw_if_error(impl_->metadata(StringView{text.data(), text.size()}, &json),
                 fmt::format("checkpoint {}", text));
  try {
    metadata_ = nlohmann::json::parse(json.data, json.data + json.size);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Code::kDataLoss,
                fmt::format("checkpoint {}: the {} format returned metadata that is not JSON ({})",
                            text, format_, e.what()));
  }
  if (!metadata_.is_object() || !metadata_.contains("tensors") || !metadata_["tensors"].is_object())
    throw Error(Code::kDataLoss,
                fmt::format("checkpoint {}: metadata lacks the \"tensors\" table", text));
}

CheckpointReader::~CheckpointReader() = default;

int64_t CheckpointReader::iteration() const { return metadata_.value("iteration", int64_t{0}); }

const nlohmann::json& CheckpointReader::model_spec() const {
  if (!metadata_.contains("spec") || !metadata_["spec"].contains("model"))
    throw Error(
        Code::kDataLoss,
        fmt::format("checkpoint {}: metadata has no spec with a model node", dir_.string()));
  return metadata_["spec"]["model"];
}

bool CheckpointReader::has(const std::string& name) const {
  return metadata_["tensors"].contains(name);
}

void CheckpointReader::read(std::vector<CheckpointTensor>& requests) {
  for (const CheckpointTensor& r : requests) {
    if (!has(r.name))
      throw Error(Code::kNotFound,
                  fmt::format("checkpoint {}: no tensor '{}'", dir_.string(), r.name));
    const nlohmann::json& stored = metadata_["tensors"][r.name]["shape"];
    bool same = stored.is_array() && static_cast<int32_t>(stored.size()) == r.ndim;
    for (int32_t d = 0; same && d < r.ndim; ++d)
      same = stored[static_cast<size_t>(d)].get<int64_t>() == r.global_shape[d];
    if (!same)
      throw Error(Code::kInvalidArgument,
                  fmt::format("checkpoint {}: tensor '{}' has shape {} but {} was expected (the "
                              "model differs from the one that saved it; compare with `loom "
                              "checkpoint inspect {} --spec SPEC`)",
                              dir_.string(), r.name, shape_text(stored),
                              shape_text(r.global_shape, r.ndim), dir_.string()));
  }
  // Formats read into host memory: a request into device memory is read into a host
  // buffer first and copied over after.
  std::vector<std::vector<uint64_t>> staging;
  std::vector<std::pair<size_t, TensorView>> staged;  // (request, its device view)
  for (size_t i = 0; i < requests.size(); ++i) {
    TensorView& v = requests[i].data;
    if (v.device.type == DeviceType::kCpu) continue;
    staged.emplace_back(i, v);
    staging.emplace_back((nbytes(v) + 7) / 8);
    v.data = staging.back().data();
    v.device = kCpu;
  }
  std::string text = dir_.string();
  Status status = impl_->load(StringView{text.data(), text.size()}, requests.data(),
                              static_cast<int64_t>(requests.size()));
  for (auto& [i, v] : staged) requests[i].data = v;
  throw_if_error(status, fmt::format("checkpoint {}", text));
  for (size_t k = 0; k < staged.size(); ++k) {
    const TensorView& v = staged[k].second;
    throw_if_error(plugins_.host().copy(v.device, v.data, kCpu, staging[k].data(), nbytes(v)),
                   fmt::format("checkpoint {}: copying '{}' to the device", text,
                               requests[staged[k].first].name));
  }
}

void CheckpointReader::read(const std::string& name, const TensorView& out) {
  CheckpointTensor t{};
  t.struct_size = sizeof(CheckpointTensor);
  t.name = name.c_str();
  t.ndim = out.ndim;
  for (int32_t d = 0; d < out.ndim; ++d) t.global_shape[d] = out.shape[d];
  t.data = out;
  std::vector<CheckpointTensor> one{t};
  read(one);
}

void CheckpointReader::load_model(ParameterSet& params, const SplitRanks& ranks) {
  std::vector<std::string> names;
  names.reserve(params.all().size());
  for (Parameter& p : params.all()) names.push_back("model." + p.name);
  std::vector<CheckpointTensor> requests;
  for (size_t i = 0; i < names.size(); ++i) {
    Parameter& p = params.all()[i];
    CheckpointTensor t{};
    t.struct_size = sizeof(CheckpointTensor);
    t.name = names[i].c_str();
    t.ndim = p.info.ndim;
    for (int32_t d = 0; d < p.info.ndim; ++d) {
      t.global_shape[d] = p.info.global_shape[d];
      t.offset[d] = p.slice_start(d, ranks);
    }
    t.data = p.value;
    requests.push_back(t);
  }
  read(requests);
}

std::optional<fs::path> CheckpointReader::tokenizer() const {
  std::error_code ec;
  for (const fs::path& dir : {dir_ / "tokenizer", dir_})
    if (fs::exists(dir / "tokenizer.json", ec) ||
        (fs::exists(dir / "vocab.json", ec) && fs::exists(dir / "merges.txt", ec)))
      return dir;
  return std::nullopt;
}

std::vector<std::pair<std::string, fs::path>> tokenizer_files(const fs::path& path,
                                                              const std::string& prefix) {
  std::vector<std::pair<std::string, fs::path>> out;
  std::error_code ec;
  auto add = [&](const fs::path& from, const std::string& name) {
    if (fs::is_regular_file(from, ec)) out.emplace_back(prefix + name, from);
  };
  if (fs::is_directory(path, ec)) {
    for (const char* name : {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
                             "special_tokens_map.json"})
      add(path / name, name);
  } else if (path.extension() == ".json" && path.filename() != "vocab.json" &&
             path.filename().string().find("vocab") == std::string::npos) {
    add(path, "tokenizer.json");
  } else {
    add(path, "vocab.json");
    std::string merges = path.filename().string();
    size_t at = merges.find("vocab.json");
    if (at != std::string::npos) merges.replace(at, 10, "merges.txt");
    add(path.parent_path() / merges, "merges.txt");
    add(path.parent_path() / "tokenizer_config.json", "tokenizer_config.json");
  }
  return out;
}

}  // namespace loom::core
