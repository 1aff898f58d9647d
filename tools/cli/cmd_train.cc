// loom train SPEC [--set PATH=VALUE]... [--run-dir DIR]
#include <fmt/format.h>

#include <cstdio>

#include "core/build/builder.h"
#include "core/plugin/plugin_manager.h"
#include "core/spec/schema.h"
#include "core/util/errors.h"
#include "core/util/log.h"
#include "loom/cpp/object.h"
#include "loom/kinds.h"
#include "tools/cli/commands.h"

namespace fs = std::filesystem;

namespace loom::cli {
namespace {

// Parameters of a module tree: (count of tensors, count of elements).
std::pair<int64_t, int64_t> count_params(IModule* module) {
  std::pair<int64_t, int64_t> total{0, 0};
  for (int32_t i = 0; i < module->param_count(); ++i) {
    ParamInfo info{};
    info.struct_size = sizeof(ParamInfo);
    throw_if_error(module->param_info(i, &info), "param_info");
    int64_t n = 1;
    for (int32_t d = 0; d < info.ndim; ++d) n *= info.global_shape[d];
    total.first += 1;
    total.second += n;
  }
  for (int32_t i = 0; i < module->child_count(); ++i) {
    StringView name{};
    IModule* child = nullptr;
    throw_if_error(module->child(i, &name, &child), "child");
    auto sub = count_params(child);
    total.first += sub.first;
    total.second += sub.second;
  }
  return total;
}

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  const std::string usage =
      "loom train SPEC [--set PATH=VALUE]... [--run-dir DIR] [--plugin-path DIR]";
  Args args = parse_args(argv, {{}, {"--set", "--run-dir", "--plugin-path"}, 1, 1, usage});
  ResolvedSpec spec = read_spec(args);
  if (!spec.spec.contains("model"))
    throw core::SpecError("/model", "missing: training needs a model node {\"impl\": NAME, ...}");
  if (spec.catalog->component_names("model").empty())
    throw Error(
        Code::kUnavailable,
        fmt::format("no model plugin yet: the spec selects model '{}' but no plugin on "
                    "the search path provides any model (searched: {}); add the directory of a "
                    "plugin that provides one with --plugin-path or LOOM_PLUGIN_PATH",
                    spec.spec["model"].is_object() ? spec.spec["model"].value("impl", "?") : "?",
                    core::describe_roots(spec.catalog->roots())));
  spec.uses = core::resolve_spec(spec.spec, *spec.catalog);

  const nlohmann::json& log = spec.spec["log"];
  LogLevel level;
  if (core::parse_log_level(log["level"].get<std::string>(), &level)) core::set_log_level(level);

  core::PluginManager manager(std::move(*spec.catalog), spec.spec["plugins"]["options"],
                              spec.spec["train"]["seed"].get<uint64_t>());
  load_plugins_for(spec, manager);

  // The run directory holds the resolved spec (defaults filled in), metrics, checkpoints.
  fs::path run_dir = args.get("--run-dir");
  if (run_dir.empty())
    run_dir = log.contains("run_dir") ? fs::path(log["run_dir"].get<std::string>())
                                      : fs::path("runs") / spec.path.stem();
  spec.spec["log"]["run_dir"] = run_dir.string();
  core::write_json_atomically(spec.spec, run_dir / "spec.resolved.json");

  const nlohmann::json& par = spec.spec["parallel"];
  int64_t world = par["tp"].get<int64_t>() * par["cp"].get<int64_t>() * par["dp"].get<int64_t>() *
                  par["pp"].get<int64_t>();
  std::printf(
      "loom train %s\n  run dir: %s\n  layout: tp=%d cp=%d ep=%d dp=%d pp=%d (world size %lld)\n",
      spec.path.string().c_str(), run_dir.string().c_str(), par["tp"].get<int>(),
      par["cp"].get<int>(), par["ep"].get<int>(), par["dp"].get<int>(), par["pp"].get<int>(),
      static_cast<long long>(world));
  for (const core::LoadedPlugin& p : manager.loaded())
    std::printf("  plugin %s %s (%s)\n", p.record->name.c_str(), p.info->version,
                p.record->library.string().c_str());

  core::ObjectPtr model_object =
      core::build_component(manager, spec.spec["model"], kinds::kModel, "/model");
  IModel* model = interface_cast<IModel>(model_object.get());
  auto [tensors, elements] = count_params(model);
  std::printf("  model: %s, %lld parameters in %lld tensors\n",
              spec.spec["model"]["impl"].get<std::string>().c_str(),
              static_cast<long long>(elements), static_cast<long long>(tensors));
  throw Error(Code::kUnimplemented,
              "the model was built, but this loom has no training loop yet; nothing was trained");
}

}  // namespace loom::cli
