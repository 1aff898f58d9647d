#include "core/checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/checkpoint/param_slices.h"
#include "core/schema/schema.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "loom/cpp/error.h"
#include "loom/cpp/json_input.h"
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

// The bytes of every file under `dir`: no tensor of a checkpoint has more elements than
// that (each element takes at least one byte somewhere in it).
uint64_t disk_bytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

// Checks the type (and range) of every metadata entry loom reads (kinds/checkpoint_format.h),
// so that the readers after it (resume, inspect, generate, convert) meet no surprise: a
// wrong type is Error(kDataLoss) naming the file and the JSON pointer. Shapes are bounded
// before anything is allocated from them.
void validate_metadata(const nlohmann::json& metadata, const fs::path& dir,
                       const std::string& format) {
  const std::string file = format == "sharded" ? (dir / "metadata.json").string()
                                               : dir.string() + " (" + format + " metadata)";
  JsonIn root(metadata, file, Code::kDataLoss,
              "the checkpoint is damaged; load an earlier one (training resumes from the "
              "newest good one)");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  root.expect_object();
  const uint64_t on_disk = disk_bytes(dir);
  for (const auto& [name, entry] : root["tensors"].items()) {
    entry.expect_object();
    entry["dtype"].string();
    JsonIn shape = entry["shape"];
    std::vector<int64_t> extents = shape.int64_array(0, kMaxJsonSize);
    if (extents.size() > static_cast<size_t>(kMaxDims))
      shape.fail("has " + std::to_string(extents.size()) + " dimensions, more than 8");
    int64_t elements = 1;
    for (int64_t e : extents)
      if (__builtin_mul_overflow(elements, e, &elements)) shape.fail("has more elements than 2^63");
    if (static_cast<uint64_t>(elements) > on_disk)
      shape.fail(
          fmt::format("has {} elements but the checkpoint holds only {} bytes", elements, on_disk));
  }
  for (const char* key : {"iteration", "format_version"})
    if (root.has(key)) root[key].int64(0, kMax);
  if (root.has("loom_version")) root["loom_version"].string();
  if (root.has("spec")) {
    JsonIn spec = root["spec"];
    spec.expect_object();
    for (const char* key : {"model", "train", "data", "optimizer"})
      if (spec.has(key)) spec[key].expect_object();
    if (spec.has("train") && spec["train"].has("device")) spec["train"]["device"].string();
    if (spec.has("optimizer") && spec["optimizer"].has("impl")) spec["optimizer"]["impl"].string();
  }
  if (root.has("trainer")) {
    JsonIn trainer = root["trainer"];
    trainer.expect_object();
    for (const char* key :
         {"iteration", "data_position", "good_steps", "hysteresis_left", "nonfinite_in_a_row"})
      if (trainer.has(key)) trainer[key].int64(0, kMax);
    if (trainer.has("loss_scale")) trainer["loss_scale"].number();
    if (trainer.has("optimizer")) trainer["optimizer"].string();
  }
  if (root.has("plugins"))
    for (JsonIn plugin : root["plugins"].elements()) {
      plugin.expect_object();
      for (const char* key : {"name", "version", "hash"})
        if (plugin.has(key)) plugin[key].string();
    }
  if (root.has("files"))
    for (const auto& [name, record] : root["files"].items()) {
      // A name leaving the checkpoint directory would have it read any file.
      fs::path relative(name);
      bool inside = !name.empty() && relative.is_relative();
      for (const fs::path& part : relative) inside = inside && part != "..";
      if (!inside) record.fail("names a file outside the checkpoint directory");
      record["bytes"].int64(0, kMax);
      std::string crc = record["crc32c"].string();
      if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos)
        record["crc32c"].fail("expected eight hex digits, got \"" + crc.substr(0, 20) + "\"");
    }
}

// Why no format recognises `dir`, when a file in it says so: an empty or missing
// metadata.json of an interrupted save.
std::string unrecognized_reason(const fs::path& dir) {
  std::error_code ec;
  fs::path meta = dir / "metadata.json";
  if (fs::is_regular_file(meta, ec)) {
    if (fs::file_size(meta, ec) == 0)
      return fmt::format(
          "{} is empty: the save was interrupted or the file was truncated; "
          "load an earlier checkpoint",
          meta.string());
    return fmt::format(
        "{} names no known format: the file is damaged; load an earlier "
        "checkpoint",
        meta.string());
  }
  if (fs::is_directory(dir / "shards", ec))
    return fmt::format(
        "{} is missing; the save was interrupted (rank 0 did not finish it) or "
        "the file was removed; load an earlier checkpoint",
        meta.string());
  return "";
}

}  // namespace

std::string latest_problem(const fs::path& root) {
  std::error_code ec;
  if (!fs::exists(root / "latest", ec)) return "`latest` is missing";
  if (read_latest(root)) return "";
  std::string name;
  try {
    name = read_file(root / "latest");
  } catch (const Error&) {
    return "`latest` cannot be read";
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty()) return "`latest` is empty";
  if (parse_iteration_dir(name) < 0) {
    std::string shown;
    for (char c : name.substr(0, 40)) shown += (c >= 32 && c < 127) ? c : '?';
    return fmt::format("`latest` holds \"{}\", which is no checkpoint name (the file is damaged)",
                       shown);
  }
  return fmt::format("`latest` names {}, which is missing", name);
}

void remove_stale_latest(const fs::path& root) {
  const std::string ours = fmt::format("latest.tmp.{}.", ::getpid());
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind("latest.tmp.", 0) != 0 || name.rfind(ours, 0) == 0) continue;
    std::error_code rm;
    fs::remove(it->path(), rm);
    if (!rm)
      log_info("checkpoint", fmt::format("removed {} (left by a process killed while it "
                                         "replaced `latest`)",
                                         name));
  }
}

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
  std::string reason = unrecognized_reason(dir);
  if (!reason.empty()) throw Error(Code::kDataLoss, reason);
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
      log_warning("checkpoint",
                  fmt::format("{}: {}; reading the newest complete checkpoint, {}", path.string(),
                              latest_problem(path), all.front().filename().string()));
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
  metadata_ = parse_json_input(std::string_view(json.data, json.size),
                               fmt::format("checkpoint {} ({} metadata)", text, format_),
                               Code::kDataLoss, "the checkpoint is damaged; load an earlier one");
  validate_metadata(metadata_, dir_, format_);
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
  std::vector<CheckpointTensor> requests;
  // A slice of padding whole reads nothing (its rows stay 0).
  for (Parameter& p : params.all())
    if (holds_values(p, ranks)) names.push_back("model." + p.name);
  for (Parameter& p : params.all())
    if (holds_values(p, ranks))
      requests.push_back(request_of(names[requests.size()], p, ranks, p.value.data, p.info.dtype,
                                    p.value.device));
  read(requests);
}

std::vector<FileCheck> CheckpointReader::check_files() const {
  if (!files_recorded()) return {};
  return loom::core::check_files(dir_, metadata_["files"]);
}

std::optional<fs::path> CheckpointReader::tokenizer() const {
  for (const FileCheck& c : check_files())
    if (!c.problem.empty()) throw Error(Code::kDataLoss, c.problem);
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
