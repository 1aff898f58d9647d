#include "core/infer/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

#include "core/plugin/kernel_libraries.h"
#include "core/runtime/forward_context.h"
#include "core/spec/spec.h"
#include "core/util/errors.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"
#include "loom/kinds.h"

namespace loom::core {
namespace {

// Host memory copied to `device` for the length of one forward pass (the CPU: used as is).
class DeviceCopy {
 public:
  DeviceCopy(IHost& host, Device device, const void* data, DType dtype,
             std::initializer_list<int64_t> shape)
      : host_(host), device_(device) {
    view_ = make_view(const_cast<void*>(data), dtype, shape, kCpu);
    if (device.type == DeviceType::kCpu) return;
    throw_if_error(host.allocate(device, nbytes(view_), 64, &owned_), "generator inputs");
    view_ = make_view(owned_, dtype, shape, device);
    copy_from_host(host, data, view_);
  }
  ~DeviceCopy() {
    if (owned_ != nullptr) host_.deallocate(device_, owned_);
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  const TensorView& view() const { return view_; }

 private:
  IHost& host_;
  Device device_;
  void* owned_ = nullptr;
  TensorView view_{};
};

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
  if (spec.contains("train") && spec["train"].value("device", std::string("cpu")) == "cuda")
    o.device = Device{DeviceType::kCuda, 0};
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
  device_ = options.device;
  load_kernel_libraries(plugins, KernelsConfig::from_json(options.kernels), device_,
                        "generation on device");
  nlohmann::json node = resolve_model(plugins, model);

  // The training run's sequence length when known; a model may also know its own length
  // (a position table), which it reports through ModelInfo (model 1.1).
  nlohmann::json inherited = {{"micro_batch_size", 1},
                              {"params_dtype", options.params_dtype},
                              {"device", device_family_name(device_.type)},
                              {"return_logits", true}};
  if (options.seq_length > 0) inherited["seq_length"] = options.seq_length;
  model_object_ = build_component(plugins, node, kinds::kModel, "/model", inherited);
  plugins.host().check_pins();  // every plugin the model needs is loaded now
  model_ = interface_cast<IModel>(model_object_.get());
  if (model_ == nullptr)
    throw PluginError(Code::kAbiMismatch, "the /model component is not a model (kinds::kModel)");
  ModelInfo info{};
  info.struct_size = sizeof(ModelInfo);
  if (model_->interface_info().minor >= 1)
    throw_if_error(model_->info(&info), "the model's info (IModel::info)");
  // The model's maximum length: its position table, else what it was trained for.
  int64_t limit = info.max_sequence > 0 ? info.max_sequence : options.seq_length;
  if (limit <= 0)
    throw InvalidArgument(
        "generator: the model does not say how long a sequence it runs (a model built against "
        "SDK 1.4 or older); pass the training run's /train/seq_length "
        "(GeneratorOptions::seq_length)");
  max_sequence_ = options.max_sequence > 0 ? options.max_sequence : limit;
  if (info.positions_bounded != 0 && max_sequence_ > limit)
    throw InvalidArgument(
        fmt::format("generator max_sequence {}: the model's learned position table has {} rows "
                    "(max_position_embeddings); generate at most {} positions",
                    max_sequence_, limit, limit));

  params_ = std::make_unique<ParameterSet>(plugins.host(), *model_, device_);
  params_->initialize(options.init_seed);
  cache_ = std::make_unique<KvCache>(plugins.host(), 1, max_sequence_, device_);
  vocab_ = info.vocab_size;
  if (vocab_ <= 0) {  // a model that does not say: ask it
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
    // The same dtype on the same device or across host and device: one copy; anything
    // else through host floats.
    const bool one_copy =
        s.value.dtype == p.value.dtype &&
        (s.value.device.type == DeviceType::kCpu || p.value.device.type == DeviceType::kCpu ||
         (s.value.device.type == p.value.device.type &&
          s.value.device.index == p.value.device.index));
    if (one_copy) {
      throw_if_error(plugins_.host().copy(p.value.device, p.value.data, s.value.device,
                                          s.value.data, nbytes(p.value)),
                     fmt::format("copy parameters: '{}'", p.name));
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
  IHost& host = plugins_.host();
  DeviceCopy ids_in(host, device_, ids.data(), DType::kI32, {1, t});
  DeviceCopy labels_in(host, device_, labels.data(), DType::kI32, {1, t});
  DeviceCopy mask_in(host, device_, mask.data(), DType::kF32, {1, t});
  std::optional<DeviceCopy> positions_in;  // only when the model takes them
  if (with_positions)
    positions_in.emplace(host, device_, positions.data(), DType::kI32,
                         std::initializer_list<int64_t>{1, t});
  TensorView inputs[5] = {ids_in.view(), labels_in.view(), mask_in.view(),
                          positions_in ? positions_in->view() : empty_view(), empty_view()};
  TensorView outputs[2] = {};
  throw_if_error(model_->forward(&ctx, inputs, 5, outputs, 2), "model forward");
  const TensorView& logits = outputs[1];
  // Columns from V on are a padded vocabulary's padding: never sampled, so dropped here.
  if (logits.data == nullptr || logits.ndim != 3 || logits.shape[0] != 1 || logits.shape[1] != t ||
      (vocab_ > 0 && logits.shape[2] < vocab_))
    throw Error(Code::kFailedPrecondition,
                fmt::format("model forward: expected logits (1, {}, {}) with return_logits (or "
                            "more columns: padding), got {}",
                            t, vocab_, logits.data == nullptr ? "none" : shape_string(logits)));
  std::vector<float> out(static_cast<size_t>(numel(logits)));
  load_floats(plugins_.host(), logits, out.data());
  keep_columns(out, logits.shape[2], vocab_);
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
