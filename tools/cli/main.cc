// `loom`: the front door. One binary with subcommands; see `loom --help`.
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/util/errors.h"
#include "core/version.h"
#include "tools/cli/commands.h"

namespace {

constexpr const char* kHelp = R"(loom: train large language models from a JSON spec, with plugins.

usage: loom COMMAND [ARGS]

commands:
  train SPEC [--set PATH=VALUE]... [--run-dir DIR]   train the model a spec describes
  bench SPEC [--steps N] [--warmup N] [--json]      time training steps (synthetic tokens)
  preprocess --input FILE|DIR --tokenizer PATH --output PREFIX [--append-eod] ...
                                                     text -> Megatron .bin/.idx dataset
  dataset inspect PREFIX [--show N] [--tokenizer PATH] [--json]
                                                     check and describe a .bin/.idx dataset
  tokenizer train|encode|decode|bench|info ...       byte-level BPE tokenizers: learn one,
                                                     encode, decode, time
  checkpoint inspect DIR [--spec SPEC] [--json]      what a checkpoint holds; diff against a spec
  checkpoint convert SRC DST --to sharded|safetensors [--dtype f32|bf16|f16]
                                                     between loom's sharded format and Hugging
                                                     Face safetensors (GPT-2, LLaMA)
  generate --checkpoint DIR (--prompt TEXT | --prompts FILE) [--max-new-tokens N]
           [--temperature T] [--top-k K] [--top-p P] [--seed S]
                                                     sample text with a KV cache
  launch --nproc N [--nnodes M --node-rank R] [--rdzv DIR|redis://HOST:PORT] -- CMD [ARGS...]
                                                     run CMD as N ranks on this machine (like
                                                     torchrun); output prefixed "[rank R] "
  plot RUN_DIR [--out FILE.png]                      draw a run's loss, LR, grad norm, tokens/s
                                                     (and pipeline bubble) over steps
  schedule show --pp P [--vpp V] --micro-batches M [--schedule NAME]
                                                     a pipeline schedule's plan per rank and
                                                     its bubble, simulated (nothing runs)
  spec validate SPEC [--set PATH=VALUE]... [--write-resolved FILE] [--load]
                                                     check a spec without running it
  plugins list [--json]                              plugins on the search path (manifests)
  plugins describe NAME [--json]                     a plugin's or component's options
  plugins check [NAME]                               load plugins and verify their ABI
  version                                            versions of loom, its SDK and ABI

options for every command:
  --plugin-path DIR    search DIR for plugins first (repeatable); LOOM_PLUGIN_PATH is
                       searched next, then the install's plugin directory

exit codes:
  0  success                 4  plugin error (missing, unloadable, ABI, duplicate, init)
  1  internal error (a bug)  5  I/O error (a file cannot be read or written)
  2  usage error             6  training failed while running
  3  spec error              7  something the run needs is not available
  130 interrupted
)";

}  // namespace

int main(int argc, char** argv) {
  // The CPU kernels run OpenMP regions between OpenBLAS calls, which use their own threads.
  // OpenMP workers that busy-wait after a region steal the cores OpenBLAS needs (measured:
  // 20% slower GPT-2 steps on 2 cores), so they sleep unless the user asked otherwise; but
  // only after a short spin (GOMP_SPINCOUNT): waking a sleeping worker for every small
  // region cost 22 of the 23 ms of a step of a 12-layer model with tiny tensors, and the
  // short spin leaves the GPT-2 124M and gpt_tiny steps as they were (BENCHMARKS.md). Set
  // before any plugin (and so libgomp) is loaded.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
    setenv("GOMP_SPINCOUNT", "10000", /*overwrite=*/0);
  }

  // A file-size limit (ulimit -f) makes a write fail with EFBIG, which loom reports naming
  // the file, instead of killing the process with SIGXFSZ halfway through a save.
  std::signal(SIGXFSZ, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::fputs(kHelp, args.empty() ? stderr : stdout);
    return args.empty() ? loom::core::kExitUsage : loom::core::kExitOk;
  }
  std::string command = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    if (command == "version" || command == "--version") return loom::cli::cmd_version(rest);
    if (command == "plugins") return loom::cli::cmd_plugins(rest);
    if (command == "spec") return loom::cli::cmd_spec(rest);
    if (command == "train") return loom::cli::cmd_train(rest);
    if (command == "bench") return loom::cli::cmd_bench(rest);
    if (command == "tokenizer") return loom::cli::cmd_tokenizer(rest);
    if (command == "preprocess") return loom::cli::cmd_preprocess(rest);
    if (command == "dataset") return loom::cli::cmd_dataset(rest);
    if (command == "checkpoint") return loom::cli::cmd_checkpoint(rest);
    if (command == "generate") return loom::cli::cmd_generate(rest);
    if (command == "launch") return loom::cli::cmd_launch(rest);
    if (command == "schedule") return loom::cli::cmd_schedule(rest);
    if (command == "plot") return loom::cli::cmd_plot(rest);
    throw loom::core::UsageError(
        fmt::format("unknown command '{}'; run 'loom --help' for the list", command));
  } catch (const std::exception& e) {
    int code = loom::core::exit_code_for(e);
    const char* kind = code == loom::core::kExitInternal ? "internal error" : "error";
    std::fprintf(stderr, "loom %s: %s: %s\n", command.c_str(), kind, e.what());
    if (code == loom::core::kExitInternal)
      std::fprintf(stderr, "this is a bug in loom %s; please report it with the command line\n",
                   loom::core::kLoomVersion);
    return code;
  }
}
