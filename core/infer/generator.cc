#include "core/infer/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

#include "core/runtime/forward_context.h"
#include "core/spec/schema.h"
#include "core/spec/spec.h"
#include "core/util/errors.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds.h"

namespace loom::core {
namespace {

constexpr Device kHost{DeviceType::kCpu, 0};

// A positive integer at `key` of `node`, or 0 when absent or null.
int64_t positive_or_zero(const nlohmann::json& node, const char* key) {
  auto it = node.find(key);
  if (it == node.end() || it->is_null() || !it->is_number_integer()) return 0;
  return std::max<int64_t>(0, it->get<int64_t>());
}

// Loads the kernel libraries of `kernels` (a spec's /kernels node; kernels_cpu always) and
// sets its pins, as a training run does.
void load_kernels(PluginManager& plugins, const nlohmann::json& kernels) {
  if (!kernels.is_object())
    throw SpecError("/kernels", "expected an object {\"libraries\": [...], \"pin\": {...}}");
  std::vector<std::string> libraries = {"kernels_cpu"};
  if (kernels.contains("libraries"))
    for (const auto& l : kernels["libraries"])
      if (std::find(libraries.begin(), libraries.end(), l.get<std::string>()) == libraries.end())
        libraries.push_back(l.get<std::string>());
  for (const std::string& lib : libraries) {
    if (plugins.is_loaded(lib)) continue;
    if (plugins.catalog().find(lib) == nullptr)
      throw PluginError(Code::kNotFound,
                        fmt::format("kernel library '{}' not found (generation runs on the CPU; "
                                    "spec /kernels/libraries); searched: {}; pass --plugin-path",
                                    lib, describe_roots(plugins.catalog().roots())));
    plugins.load(lib);
  }
  std::map<std::string, std::string> pins;
  if (kernels.contains("pin"))
    for (const auto& [op, kernel] : kernels["pin"].items()) pins[op] = kernel.get<std::string>();
  plugins.host().set_pins(std::move(pins));
}

// Resolves {"model": node} against the catalog (defaults filled, options checked, messages
// under /model), loads the plugins that provide its components and returns the resolved
// node.
nlohmann::json resolve_model(PluginManager& plugins, const nlohmann::json& node) {
  if (!node.is_object() || !node.contains("impl"))
    throw SpecError("/model", "expected a model node {\"impl\": NAME, ...}");
  nlohmann::json spec = {{"model", node}};
  std::vector<ImplUse> uses = resolve_spec(spec, plugins.catalog(), &plugins.registry());
  for (const ImplUse& use : uses)
    if (const PluginRecord* p = plugins.catalog().provider(use.kind, use.name))
      plugins.load(p->name);
  return spec["model"];
}

}  // namespace

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxNewTokens:
      return "max_new_tokens";
    case StopReason::kEod:
      return "eod";
    case StopReason::kMaxSequence:
      return "max_sequence";
  }
  return "unknown";
}

GeneratorOptions GeneratorOptions::from_spec(const nlohmann::json& spec) {
  GeneratorOptions o;
  if (spec.contains("train") && spec["train"].contains("seq_length"))
    o.seq_length = spec["train"]["seq_length"].get<int64_t>();
  if (spec.contains("kernels") && spec["kernels"].is_object()) o.kernels = spec["kernels"];
  return o;
}

Generator::Generator(PluginManager& plugins, const nlohmann::json& model,
                     const GeneratorOptions& options)
    : plugins_(plugins) {
  if (options.params_dtype != "f32" && options.params_dtype != "bf16" &&
      options.params_dtype != "f16")
    throw InvalidArgument(fmt::format("generator params_dtype '{}': must be one of f32, bf16, f16",
                                      options.params_dtype));
  if (options.seq_length < 0 || options.max_sequence < 0)
    throw InvalidArgument(fmt::format("generator: seq_length {} and max_sequence {} must be >= 0",
                                      options.seq_length, options.max_sequence));
  load_kernels(plugins, options.kernels);
  nlohmann::json node = resolve_model(plugins, model);

  // The model's maximum length: its learned position table, else what it was trained for.
  int64_t table = positive_or_zero(node, "max_position_embeddings");
  int64_t seq_length = options.seq_length > 0 ? options.seq_length : table;
  if (seq_length == 0)
    throw InvalidArgument(
        "generator: the model node sets no max_position_embeddings; pass the training run's "
        "/train/seq_length (GeneratorOptions::seq_length) so the model's length is known");
  int64_t limit = table > 0 ? table : seq_length;
  bool learned = node.value("position_embedding", std::string("learned")) == "learned";
  max_sequence_ = options.max_sequence > 0 ? options.max_sequence : limit;
  if (learned && max_sequence_ > limit)
    throw InvalidArgument(
        fmt::format("generator max_sequence {}: the model's learned position table has {} rows "
                    "(max_position_embeddings); generate at most {} positions",
                    max_sequence_, limit, limit));

  nlohmann::json inherited = {{"seq_length", std::min(seq_length, limit)},
                              {"micro_batch_size", 1},
                              {"params_dtype", options.params_dtype},
                              {"device", "cpu"},
                              {"return_logits", true}};
  model_object_ = build_component(plugins, node, kinds::kModel, "/model", inherited);
  model_ = interface_cast<IModel>(model_object_.get());
  if (model_ == nullptr)
    throw PluginError(Code::kAbiMismatch, "the /model component is not a model (kinds::kModel)");
  params_ = std::make_unique<ParameterSet>(plugins.host(), *model_, kHost);
  params_->initialize(options.init_seed);
  cache_ = std::make_unique<KvCache>(plugins.host(), 1, max_sequence_, kHost);
  vocab_ = positive_or_zero(node, "vocab_size");
  if (vocab_ == 0) {  // a model without the key: ask it
    std::vector<float> probe = forward({0}, 0, false, false);
    vocab_ = static_cast<int64_t>(probe.size());
  }
}

Generator::~Generator() = default;

void Generator::copy_parameters_from(const ParameterSet& source) {
  std::unordered_map<std::string, const Parameter*> by_name;
  for (const Parameter& p : source.all()) by_name[p.name] = &p;
  for (const Parameter& p : source.all())
    if (params_->find(p.name) == nullptr)
      throw InvalidArgument(fmt::format(
          "copy parameters: the source has '{}', which the inference model lacks: the two "
          "models differ",
          p.name));
  std::vector<float> buffer;
  for (Parameter& p : params_->all()) {
    auto it = by_name.find(p.name);
    if (it == by_name.end())
      throw InvalidArgument(
          fmt::format("copy parameters: the source has no parameter '{}'", p.name));
    const Parameter& s = *it->second;
    bool same = s.value.ndim == p.value.ndim;
    for (int32_t d = 0; same && d < p.value.ndim; ++d) same = s.value.shape[d] == p.value.shape[d];
    if (!same)
      throw InvalidArgument(
          fmt::format("copy parameters: '{}' has shape {} in the source and {} "
                      "in the inference model",
                      p.name, shape_string(s.value), shape_string(p.value)));
    if (s.value.device.type != DeviceType::kCpu)
      throw Error(Code::kUnimplemented,
                  fmt::format("copy parameters: '{}' lives on a device; copy it to the host first",
                              p.name));
    if (s.value.dtype == p.value.dtype) {
      std::memcpy(p.value.data, s.value.data, nbytes(p.value));
    } else {
      buffer.resize(static_cast<size_t>(numel(p.value)));
      load_floats(plugins_.host(), s.value, buffer.data());
      store_floats(plugins_.host(), buffer.data(), p.value);
    }
  }
}

std::vector<float> Generator::forward(const std::vector<int32_t>& tokens, int64_t first,
                                      bool with_positions, bool cached) {
  int64_t t = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> ids = tokens, labels(tokens.size(), 0), positions(tokens.size());
  std::vector<float> mask(tokens.size(), 0.f);  // the loss is ignored
  for (int64_t i = 0; i < t; ++i) positions[i] = static_cast<int32_t>(first + i);
  ForwardContext ctx(plugins_.host(), false, RecomputePolicy::kNone, 0, 0, 1,
                     &params_->module_ids());
  if (cached) ctx.set_kv_cache(cache_.get());
  TensorView inputs[5] = {
      make_view(ids.data(), DType::kI32, {1, t}), make_view(labels.data(), DType::kI32, {1, t}),
      make_view(mask.data(), DType::kF32, {1, t}),
      with_positions ? make_view(positions.data(), DType::kI32, {1, t}) : empty_view(),
      empty_view()};
  TensorView outputs[2] = {};
  throw_if_error(model_->forward(&ctx, inputs, 5, outputs, 2), "model forward");
  const TensorView& logits = outputs[1];
  if (logits.data == nullptr || logits.ndim != 3 || logits.shape[0] != 1 || logits.shape[1] != t ||
      (vocab_ > 0 && logits.shape[2] != vocab_))
    throw Error(Code::kFailedPrecondition,
                fmt::format("model forward: expected logits (1, {}, {}) with return_logits, got {}",
                            t, vocab_, logits.data == nullptr ? "none" : shape_string(logits)));
  std::vector<float> out(static_cast<size_t>(numel(logits)));
  load_floats(plugins_.host(), logits, out.data());
  if (cached) cache_->advance(t);
  return out;
}

std::vector<float> Generator::logits_full(const std::vector<int32_t>& tokens) {
  int64_t t = static_cast<int64_t>(tokens.size());
  if (t < 1 || t > max_sequence_)
    throw InvalidArgument(
        fmt::format("logits_full: {} tokens; give between 1 and {} (the model's maximum sequence)",
                    t, max_sequence_));
  return forward(tokens, 0, false, false);
}

std::vector<float> Generator::extend(const std::vector<int32_t>& tokens) {
  int64_t t = static_cast<int64_t>(tokens.size());
  if (t < 1) throw InvalidArgument("extend: no tokens given");
  int64_t past = cache_->past_length();
  if (past + t > max_sequence_)
    throw Error(Code::kOutOfRange,
                fmt::format("extend: {} cached + {} new tokens exceed the maximum sequence of {} "
                            "positions",
                            past, t, max_sequence_));
  return forward(tokens, past, true, true);
}

Generation Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                               std::optional<int32_t> eod,
                               const std::function<void(int32_t)>& on_token) {
  if (options.max_new_tokens < 0)
    throw InvalidArgument(
        fmt::format("generate: max_new_tokens {} must be >= 0", options.max_new_tokens));
  if (options.vocab_limit < 0)
    throw InvalidArgument(
        fmt::format("generate: vocab_limit {} must be >= 0 (0: every id)", options.vocab_limit));
  int64_t n = static_cast<int64_t>(prompt.size());
  if (n < 1)
    throw InvalidArgument(
        "generate: the prompt is empty; give at least one token (e.g. the "
        "end-of-document token to start a new document)");
  if (n > max_sequence_)
    throw InvalidArgument(
        fmt::format("generate: the prompt has {} tokens, more than the model's "
                    "maximum sequence of {}; shorten it",
                    n, max_sequence_));
  for (int32_t id : prompt)
    if (id < 0 || id >= vocab_)
      throw InvalidArgument(fmt::format(
          "generate: prompt token {} is outside the model's vocabulary [0, {})", id, vocab_));
  Sampler sampler(options.sampling);
  int64_t allowed = options.vocab_limit > 0 ? std::min(options.vocab_limit, vocab_) : vocab_;

  Generation result;
  if (options.max_new_tokens == 0) return result;
  if (n >= max_sequence_) {
    result.stop = StopReason::kMaxSequence;
    return result;
  }
  cache_->reset();
  std::vector<float> logits = extend(prompt);  // prefill: (n, V)
  const float* last = logits.data() + (n - 1) * vocab_;
  for (;;) {
    int32_t token = sampler.sample(last, allowed);
    result.tokens.push_back(token);
    if (on_token) on_token(token);
    if (eod && token == *eod) {
      result.stop = StopReason::kEod;
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) >= options.max_new_tokens) {
      result.stop = StopReason::kMaxNewTokens;
      break;
    }
    if (n + static_cast<int64_t>(result.tokens.size()) >= max_sequence_) {
      result.stop = StopReason::kMaxSequence;
      break;
    }
    logits = extend({token});  // (1, V)
    last = logits.data();
  }
  return result;
}

}  // namespace loom::core
