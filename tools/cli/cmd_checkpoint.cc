// loom checkpoint inspect DIR [--spec SPEC [--set PATH=VALUE]...] [--verify] [--json]
// loom checkpoint convert SRC DST --to sharded|safetensors [--dtype f32|bf16|f16]
#include <fmt/format.h>

#include <cstdio>
#include <cstring>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/schema/schema.h"
#include "core/spec/spec.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"
#include "tools/cli/commands.h"

namespace fs = std::filesystem;

namespace loom::cli {
namespace {

constexpr const char* kInspectUsage =
    "loom checkpoint inspect DIR [--spec SPEC [--set PATH=VALUE]...] [--verify] [--json] "
    "[--plugin-path DIR]";
constexpr const char* kConvertUsage =
    "loom checkpoint convert SRC DST --to sharded|safetensors [--dtype f32|bf16|f16] "
    "[--plugin-path DIR]";

uint64_t disk_bytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

DType parse_dtype(const std::string& name, const char* option) {
  DType dtype = dtype_from_name(name.c_str());
  if (dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16) return dtype;
  throw core::UsageError(fmt::format("{} '{}': expected f32, bf16 or f16", option, name));
}

int64_t element_count(const nlohmann::json& shape) {
  int64_t n = 1;
  for (const auto& d : shape) n *= d.get<int64_t>();
  return n;
}

// A tensor of the checkpoint read into memory of `dtype`.
struct LoadedTensor {
  core::SaveTensor save;
  std::vector<char> bytes;
};

LoadedTensor read_tensor(core::CheckpointReader& reader, const std::string& name, DType dtype) {
  const nlohmann::json& entry = reader.metadata()["tensors"][name];
  LoadedTensor t;
  t.save.name = name;
  t.save.dtype = dtype;
  for (const auto& d : entry["shape"]) t.save.shape.push_back(d.get<int64_t>());
  t.bytes.resize(static_cast<size_t>(element_count(entry["shape"])) * dtype_size(dtype));
  reader.read(name, make_view(t.bytes.data(), dtype, t.save.shape.data(),
                              static_cast<int32_t>(t.save.shape.size()), kCpu));
  t.save.data = t.bytes.data();
  return t;
}

DType stored_dtype(const nlohmann::json& entry) {
  DType dtype = dtype_from_name(entry.value("dtype", "f32").c_str());
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64})
    if (dtype == d) return d;
  return DType::kF32;
}

nlohmann::json describe(core::CheckpointReader& reader, bool verify) {
  const nlohmann::json& meta = reader.metadata();
  nlohmann::json out = {{"dir", reader.dir().string()},
                        {"format", reader.format()},
                        {"iteration", reader.iteration()},
                        {"disk_bytes", disk_bytes(reader.dir())},
                        {"loom_version", meta.value("loom_version", "")},
                        {"plugins", meta.value("plugins", nlohmann::json::array())}};
  if (meta.contains("trainer")) out["trainer"] = meta["trainer"];
  int64_t model_params = 0, model_bytes = 0, other_bytes = 0;
  nlohmann::json tensors = nlohmann::json::array();
  std::vector<std::string> failures;
  for (const auto& [name, entry] : meta["tensors"].items()) {
    int64_t n = element_count(entry["shape"]);
    int64_t bytes = n * static_cast<int64_t>(dtype_size(stored_dtype(entry)));
    bool model = name.rfind("model.", 0) == 0;
    (model ? model_bytes : other_bytes) += bytes;
    if (model) model_params += n;
    nlohmann::json row = {
        {"name", name}, {"dtype", entry["dtype"]}, {"shape", entry["shape"]}, {"bytes", bytes}};
    if (verify) {
      try {
        read_tensor(reader, name, stored_dtype(entry));
        row["verified"] = true;
      } catch (const std::exception& e) {
        row["verified"] = false;
        row["error"] = e.what();
        failures.push_back(e.what());
      }
    }
    tensors.push_back(row);
  }
  out["model_parameters"] = model_params;
  out["model_bytes"] = model_bytes;
  out["optimizer_bytes"] = other_bytes;
  out["tensors"] = tensors;
  if (verify) {
    // The plain files (the tokenizer copy): checked against the checksums saved with them.
    nlohmann::json files = nlohmann::json::array();
    for (const core::FileCheck& c : reader.check_files()) {
      files.push_back({{"name", c.name}, {"verified", c.problem.empty()}, {"error", c.problem}});
      if (!c.problem.empty()) failures.push_back(c.problem);
    }
    out["files"] = files;
    out["files_recorded"] = reader.files_recorded();
    out["damaged"] = failures;
  }
  return out;
}

void print_description(const nlohmann::json& d, bool verify) {
  std::printf("checkpoint %s\n  format: %s, iteration %lld, written by loom %s\n",
              d["dir"].get<std::string>().c_str(), d["format"].get<std::string>().c_str(),
              static_cast<long long>(d["iteration"].get<int64_t>()),
              d["loom_version"].get<std::string>().empty()
                  ? "?"
                  : d["loom_version"].get<std::string>().c_str());
  std::printf("  size on disk: %s; model: %lld parameters (%s); optimizer state: %s\n",
              core::human_bytes(d["disk_bytes"].get<double>()).c_str(),
              static_cast<long long>(d["model_parameters"].get<int64_t>()),
              core::human_bytes(d["model_bytes"].get<double>()).c_str(),
              core::human_bytes(d["optimizer_bytes"].get<double>()).c_str());
  if (d.contains("trainer")) {
    const nlohmann::json& t = d["trainer"];
    std::printf("  trainer: optimizer %s, data position %lld, loss scale %g\n",
                t.value("optimizer", "?").c_str(),
                static_cast<long long>(t.value("data_position", int64_t{0})),
                t.value("loss_scale", 1.0));
  } else {
    std::printf("  model weights only (no optimizer or trainer state)\n");
  }
  for (const auto& p : d["plugins"])
    std::printf("  plugin %s %s (%s)\n", p.value("name", "?").c_str(),
                p.value("version", "?").c_str(), p.value("hash", "?").c_str());
  std::printf("  %zu tensors:\n", d["tensors"].size());
  for (const auto& t : d["tensors"]) {
    std::string status;
    if (verify) status = t["verified"].get<bool>() ? "  ok" : "  DAMAGED: " + t.value("error", "");
    std::printf("    %-64s %-5s %-18s %10s%s\n", t["name"].get<std::string>().c_str(),
                t["dtype"].get<std::string>().c_str(), t["shape"].dump().c_str(),
                core::human_bytes(t["bytes"].get<double>()).c_str(), status.c_str());
  }
  if (verify && !d["files_recorded"].get<bool>()) {
    std::printf("  files (tokenizer copy): checksums not recorded (saved by an older loom)\n");
  } else if (verify) {
    std::printf("  %zu files:\n", d["files"].size());
    for (const auto& f : d["files"])
      std::printf(
          "    %-64s %s\n", f["name"].get<std::string>().c_str(),
          f["verified"].get<bool>() ? "ok" : ("DAMAGED: " + f["error"].get<std::string>()).c_str());
  }
}

// "/model/hidden_size: 256 -> 512" lines between the checkpoint's spec and `spec`.
std::vector<std::string> spec_diff(const nlohmann::json& saved, const nlohmann::json& spec) {
  std::vector<std::string> out;
  for (const auto& op : nlohmann::json::diff(saved, spec)) {
    std::string path = op.value("path", ""), kind = op.value("op", "");
    nlohmann::json::json_pointer ptr(path);
    std::string before = kind == "add" ? "(absent)" : core::compact_value(saved.at(ptr));
    std::string after = kind == "remove" ? "(absent)" : core::compact_value(op["value"]);
    out.push_back(fmt::format("{}: {} -> {}", path, before, after));
  }
  return out;
}

int inspect(const std::vector<std::string>& argv) {
  Args args = parse_args(
      argv, {{"--json", "--verify"}, {"--spec", "--set", "--plugin-path"}, 1, 1, kInspectUsage});
  if (!args.all("--set").empty() && args.get("--spec").empty())
    throw core::UsageError(fmt::format("--set needs --spec ({})", kInspectUsage));
  fs::path path = args.positionals[0];
  core::PluginManager plugins(catalog_from_args(args));
  bool json = args.flag("--json"), verify = args.flag("--verify");
  nlohmann::json out;
  // A root lists its checkpoints, then describes the one `latest` names.
  std::vector<fs::path> all = core::list_checkpoints(path);
  if (!all.empty()) {
    std::optional<fs::path> latest = core::read_latest(path);
    nlohmann::json list = nlohmann::json::array();
    for (const fs::path& dir : all)
      list.push_back({{"dir", dir.filename().string()},
                      {"disk_bytes", disk_bytes(dir)},
                      {"latest", latest && *latest == dir}});
    out["checkpoints"] = list;
    if (!json) {
      std::printf("checkpoint root %s: %zu checkpoints\n", path.string().c_str(), all.size());
      for (const auto& c : list)
        std::printf("  %s  %10s%s\n", c["dir"].get<std::string>().c_str(),
                    core::human_bytes(c["disk_bytes"].get<double>()).c_str(),
                    c["latest"].get<bool>() ? "  <- latest" : "");
    }
  }
  core::CheckpointReader reader(plugins, path);
  out["checkpoint"] = describe(reader, verify);
  if (!json) print_description(out["checkpoint"], verify);
  if (!args.get("--spec").empty()) {
    Args spec_args = args;
    spec_args.positionals = {args.get("--spec")};
    ResolvedSpec spec = load_spec(spec_args);
    nlohmann::json saved = reader.metadata().value("spec", nlohmann::json::object());
    // A Hugging Face directory describes only the model: compare that.
    nlohmann::json mine =
        saved.contains("train") ? spec.spec : nlohmann::json{{"model", spec.spec["model"]}};
    std::vector<std::string> diff = spec_diff(saved, mine);
    out["spec_diff"] = diff;
    if (!json) {
      std::printf("  spec %s: %s\n", spec.path.string().c_str(),
                  diff.empty() ? "identical to the checkpoint's" : "differs from the checkpoint's");
      for (const std::string& line : diff) std::printf("    %s\n", line.c_str());
    }
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  if (verify && !out["checkpoint"]["damaged"].empty()) {
    if (!json) {
      for (const auto& problem : out["checkpoint"]["damaged"])
        std::fprintf(stderr, "loom checkpoint inspect: %s\n", problem.get<std::string>().c_str());
      std::fprintf(stderr, "loom checkpoint inspect: %zu damaged tensors or files in %s\n",
                   out["checkpoint"]["damaged"].size(), reader.dir().string().c_str());
    }
    return core::kExitIo;
  }
  return core::kExitOk;
}

int convert(const std::vector<std::string>& argv) {
  Args args = parse_args(argv, {{}, {"--to", "--dtype", "--plugin-path"}, 2, 2, kConvertUsage});
  std::string to = args.get("--to");
  if (to.empty()) throw core::UsageError(fmt::format("--to is required ({})", kConvertUsage));
  fs::path src = args.positionals[0], dst = args.positionals[1];
  std::optional<DType> dtype;
  if (!args.get("--dtype").empty()) dtype = parse_dtype(args.get("--dtype"), "--dtype");
  core::PluginManager plugins(catalog_from_args(args));
  ObjectPtr object = core::make_checkpoint_format(plugins, {{"impl", to}}, "--to");
  auto* format = interface_cast<ICheckpointFormat>(object.get());
  std::error_code ec;
  if (fs::exists(dst, ec) && !fs::is_empty(dst, ec))
    throw core::UsageError(
        fmt::format("{} exists and is not empty; remove it or choose another "
                    "destination",
                    dst.string()));
  core::CheckpointReader reader(plugins, src);
  nlohmann::json metadata = reader.metadata();
  // Safetensors holds model weights only; the sharded format takes everything.
  std::vector<LoadedTensor> tensors;
  nlohmann::json table = nlohmann::json::object();
  int64_t dropped = 0;
  for (const auto& [name, entry] : metadata["tensors"].items()) {
    bool model = name.rfind("model.", 0) == 0;
    if (!model && to == "safetensors") {
      ++dropped;
      continue;
    }
    DType d = model && dtype ? *dtype : stored_dtype(entry);
    tensors.push_back(read_tensor(reader, name, d));
    table[name] = {{"dtype", dtype_name(d)}, {"shape", entry["shape"]}};
  }
  metadata["tensors"] = table;
  if (dropped > 0) metadata.erase("trainer");
  std::vector<core::SaveTensor> saves;
  for (const LoadedTensor& t : tensors) saves.push_back(t.save);
  std::vector<std::pair<std::string, fs::path>> extra;
  if (std::optional<fs::path> tok = reader.tokenizer())
    // Hugging Face keeps tokenizer files beside the weights; loom under tokenizer/.
    extra = core::tokenizer_files(*tok, to == "safetensors" ? "" : "tokenizer/");
  // sharded: DST is a checkpoint root (DST/iter_N and latest); safetensors: DST is the
  // Hugging Face model directory itself.
  fs::path final_dir =
      to == "safetensors" ? dst : dst / core::iteration_dir_name(reader.iteration());
  if (to != "safetensors") fs::create_directories(dst);
  core::write_checkpoint_directory(*format, final_dir, saves, metadata, extra, reader.iteration());
  if (to != "safetensors")
    core::write_file_atomic(dst / "latest", final_dir.filename().string() + "\n");
  std::printf("converted %s (%s) -> %s (%s): %zu tensors%s\n", reader.dir().string().c_str(),
              reader.format().c_str(), final_dir.string().c_str(), to.c_str(), tensors.size(),
              dropped ? fmt::format("; {} optimizer tensors left out (safetensors holds model "
                                    "weights only)",
                                    dropped)
                            .c_str()
                      : "");
  return core::kExitOk;
}

}  // namespace

int cmd_checkpoint(const std::vector<std::string>& argv) {
  const std::string usage = std::string("usage:\n  ") + kInspectUsage + "\n  " + kConvertUsage;
  if (argv.empty()) throw core::UsageError("missing subcommand: inspect or convert; " + usage);
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (argv[0] == "inspect") return inspect(rest);
  if (argv[0] == "convert") return convert(rest);
  throw core::UsageError(
      fmt::format("unknown subcommand '{}': expected inspect or convert", argv[0]));
}

}  // namespace loom::cli
