// loom generate --checkpoint DIR (--prompt TEXT | --prompts FILE) [--max-new-tokens N]
//                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer PATH]
//                [--device cpu|cuda] [--plugin-path DIR] [--json]
// Text from a checkpoint with KV-cache decoding (core/infer/generator.h), on the CPU unless
// --device cuda (the checkpoint's /kernels when it trained on cuda, else kernels_cuda).
//   --prompt TEXT: the prompt and then the completion stream to stdout as tokens arrive
//     (--json: one JSON line instead).
//   --prompts FILE: one prompt per line, or JSONL lines {"prompt": TEXT, ...}; one JSON line
//     per prompt on stdout: {"prompt", "completion", "tokens" (the new ids), "new_tokens"
//     (their count), "stop" ("max_new_tokens", "eod" or "max_sequence")}.
// Every prompt is sampled with the same --seed, so a prompt's completion does not depend on
// the prompts before it. The end-of-document token ends a completion and is not printed.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/checkpoint/checkpoint.h"
#include "core/data/tokenizer.h"
#include "core/infer/generator.h"
#include "core/util/errors.h"
#include "loom/cpp/json_input.h"
#include "tools/cli/commands.h"

namespace fs = std::filesystem;

namespace loom::cli {
namespace {

constexpr const char* kUsage =
    "loom generate --checkpoint DIR (--prompt TEXT | --prompts FILE) [--max-new-tokens N] "
    "[--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer PATH] "
    "[--device cpu|cuda] [--plugin-path DIR] [--json]";

// The last value of option `name` as a finite number within the bounds, else `fallback`
// when absent. Throws UsageError naming the option and the range.
double number(const Args& args, const std::string& name, double fallback, double min,
              bool min_exclusive, double max, const std::string& range) {
  std::string v = args.get(name);
  if (v.empty()) return fallback;
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x) && (min_exclusive ? x > min : x >= min) && x <= max)
      return x;
  } catch (const std::exception&) {
  }
  throw core::UsageError(fmt::format("{} expects {}, got '{}' ({})", name, range, v, kUsage));
}

struct Prompt {
  std::string text;
  std::string where;  // "--prompt" or "--prompts FILE line N", for messages
};

// The prompts of a --prompts file: plain lines, or JSON objects with a "prompt" string.
// Blank lines are skipped.
std::vector<Prompt> read_prompts(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw core::UsageError(
        fmt::format("--prompts '{}': cannot read the file; give a text file "
                    "with one prompt per line ({})",
                    file.string(), kUsage));
  std::vector<Prompt> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    std::string where = fmt::format("--prompts {} line {}", file.string(), number);
    if (line[first] != '{') {
      out.push_back({line, where});
      continue;
    }
    nlohmann::json j;
    try {
      // Depth cap, numbers beyond double, syntax: never one of nlohmann's exceptions.
      j = parse_json_input(line, "line", Code::kInvalidArgument);
    } catch (const Error& e) {
      // "line:1:COLUMN: problem" (the line was parsed alone) -> "column COLUMN: problem".
      std::string problem = e.what();
      if (problem.rfind("line:1:", 0) == 0) problem = "column " + problem.substr(7);
      throw core::UsageError(
          fmt::format("{}: starts with '{{' but is not JSON ({}); write JSONL lines "
                      "{{\"prompt\": \"...\"}} or plain text that does not start with '{{'",
                      where, problem));
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      throw core::UsageError(fmt::format(
          "{}: a JSON line needs a \"prompt\" string, e.g. {{\"prompt\": \"Once\"}}", where));
    out.push_back({j["prompt"].get<std::string>(), where});
  }
  if (out.empty())
    throw core::UsageError(
        fmt::format("--prompts '{}': the file holds no prompt; write one per line", file.string()));
  return out;
}

// The GeneratorOptions of a checkpoint's spec for generation on `device` ("cpu" or "cuda"):
// its seq_length, and its kernels when it trained on that device (else that device's
// default library).
core::GeneratorOptions generator_options(const core::CheckpointReader& reader,
                                         const std::string& device) {
  core::GeneratorOptions options;
  const nlohmann::json& metadata = reader.metadata();
  if (metadata.contains("spec") && metadata["spec"].is_object()) {
    const nlohmann::json& spec = metadata["spec"];
    options = core::GeneratorOptions::from_spec(spec);
    if (!spec.contains("train") || spec["train"].value("device", std::string("cpu")) != device)
      options.kernels = nlohmann::json::object();
  }
  options.device = Device{device == "cuda" ? DeviceType::kCuda : DeviceType::kCpu, 0};
  return options;
}

}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  Args args = parse_args(
      argv, {{"--json"},
             {"--checkpoint", "--prompt", "--prompts", "--max-new-tokens", "--temperature",
              "--top-k", "--top-p", "--seed", "--tokenizer", "--device", "--plugin-path"},
             0,
             0,
             kUsage});
  // Every argument is checked before anything is loaded.
  std::string checkpoint = args.get("--checkpoint");
  if (checkpoint.empty())
    throw core::UsageError(
        fmt::format("--checkpoint DIR is required: the checkpoint to generate from ({})", kUsage));
  std::error_code ec;
  if (!fs::exists(checkpoint, ec))
    throw core::UsageError(fmt::format(
        "--checkpoint '{}': no such file or directory; give a checkpoint directory ({})",
        checkpoint, kUsage));
  bool single = !args.all("--prompt").empty(), batch = !args.all("--prompts").empty();
  if (single == batch)
    throw core::UsageError(
        fmt::format("give exactly one of --prompt TEXT or --prompts FILE ({})", kUsage));
  core::GenerateOptions g;
  g.max_new_tokens = args.integer("--max-new-tokens", 64, 1);
  g.sampling.temperature = number(args, "--temperature", 1.0, 0.0, false, INFINITY,
                                  "a number >= 0 (0 is greedy decoding)");
  g.sampling.top_k = args.integer("--top-k", 0, 0);
  g.sampling.top_p =
      number(args, "--top-p", 1.0, 0.0, true, 1.0, "a number in (0, 1] (1 keeps every token)");
  g.sampling.seed = static_cast<uint64_t>(args.integer("--seed", 0, 0));
  std::string tokenizer_arg = args.get("--tokenizer");
  if (!tokenizer_arg.empty() && !fs::exists(tokenizer_arg, ec))
    throw core::UsageError(fmt::format(
        "--tokenizer '{}': no such file or directory; give a directory with tokenizer.json or "
        "vocab.json + merges.txt ({})",
        tokenizer_arg, kUsage));
  std::vector<Prompt> prompts = batch ? read_prompts(args.get("--prompts"))
                                      : std::vector<Prompt>{{args.get("--prompt"), "--prompt"}};
  bool json = batch || args.flag("--json");
  std::string device = args.get("--device").empty() ? "cpu" : args.get("--device");
  if (device != "cpu" && device != "cuda")
    throw core::UsageError(fmt::format("--device '{}': use cpu or cuda ({})", device, kUsage));

  // The model, its weights and the tokenizer.
  core::PluginManager plugins(catalog_from_args(args));
  core::CheckpointReader reader(plugins, checkpoint);
  std::optional<fs::path> tokenizer_path =
      tokenizer_arg.empty() ? reader.tokenizer() : std::optional<fs::path>(tokenizer_arg);
  if (!tokenizer_path)
    throw core::UsageError(fmt::format(
        "checkpoint {} holds no tokenizer files: pass --tokenizer PATH (the tokenizer the model "
        "was trained with: a directory with tokenizer.json or vocab.json + merges.txt)",
        reader.dir().string()));
  std::unique_ptr<core::Tokenizer> tokenizer = core::Tokenizer::load(*tokenizer_path);
  core::Generator generator(plugins, reader.model_spec(), generator_options(reader, device));
  reader.load_model(generator.params());
  if (tokenizer->vocab_size() > generator.vocab_size())
    throw core::UsageError(fmt::format(
        "the tokenizer {} has {} ids but the model only {}: pass the tokenizer the model was "
        "trained with (--tokenizer)",
        tokenizer_path->string(), tokenizer->vocab_size(), generator.vocab_size()));
  g.vocab_limit = tokenizer->vocab_size();
  std::optional<int32_t> eod = tokenizer->eod();

  // Encode every prompt first, so that a bad one fails before any output.
  std::vector<std::vector<int32_t>> ids;
  for (const Prompt& p : prompts) {
    std::vector<int32_t> t = tokenizer->encode(p.text);
    if (t.empty()) {  // start a new document
      if (!eod)
        throw core::UsageError(
            fmt::format("{}: the prompt is empty and the tokenizer has no "
                        "end-of-document token to start from; give some text",
                        p.where));
      t.push_back(*eod);
    }
    if (static_cast<int64_t>(t.size()) > generator.max_sequence())
      throw core::UsageError(fmt::format(
          "{}: the prompt is {} tokens, more than the model's maximum sequence of {}; shorten it",
          p.where, t.size(), generator.max_sequence()));
    ids.push_back(std::move(t));
  }

  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> shown;  // new tokens without the end-of-document token
    size_t printed = 0;          // bytes of the completion already on stdout
    auto on_token = [&](int32_t token) {
      if (eod && token == *eod) return;
      shown.push_back(token);
      if (json) return;
      // Decode the whole completion and print what is new: a character split over tokens
      // comes out whole once its last byte arrives.
      std::string text = tokenizer->decode(shown);
      std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
      std::fflush(stdout);
      printed = text.size();
    };
    if (!json) {
      std::fwrite(prompts[i].text.data(), 1, prompts[i].text.size(), stdout);
      std::fflush(stdout);
    }
    core::Generation out = generator.generate(ids[i], g, eod, on_token);
    if (out.stop == core::StopReason::kMaxSequence)
      std::fprintf(stderr,
                   "loom generate: %s: stopped after %zu new tokens at the model's maximum "
                   "sequence of %lld tokens\n",
                   prompts[i].where.c_str(), out.tokens.size(),
                   static_cast<long long>(generator.max_sequence()));
    if (json) {
      nlohmann::json line = {{"prompt", prompts[i].text},
                             {"completion", tokenizer->decode(shown)},
                             {"tokens", out.tokens},
                             {"new_tokens", out.tokens.size()},
                             {"stop", core::stop_reason_name(out.stop)}};
      std::printf("%s\n",
                  line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return core::kExitOk;
}

}  // namespace loom::cli
