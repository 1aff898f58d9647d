// Generator: a model built for inference with incremental (KV-cache) decoding, the engine
// of `loom generate` and of the sample a training run prints at its end (DESIGN.md
// section 7).
//
// The model of a "model" spec node is built on the options' device (the CPU by default, or
// a GPU) with micro-batch 1 and return_logits = true, its kernels loaded as a training run
// loads them (the spec's /kernels/libraries or kernels_<device>, and /kernels/pin). Only
// the logits of each pass come back to host memory, for sampling. The generator owns the parameters
// (core::ParameterSet): the caller loads weights into params() (CheckpointReader::load_model)
// or copies them from a trainer's (copy_parameters_from).
//
// Decoding: the prompt runs through the model in one forward pass (prefill) that fills the
// KV cache; every new token then runs alone at its position (explicit position ids
// past .. past + T - 1), its attention reading the cached keys and values of every earlier
// position. The model is fed labels of zeros and a zero loss mask; its loss is ignored.
// Generation stops after max_new_tokens, at the end-of-document token, or when the sequence
// reaches the model's maximum length (stop reason kMaxSequence: the caller says so).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/component/builder.h"
#include "core/infer/sampler.h"
#include "core/plugin/plugin_manager.h"
#include "core/runtime/kv_cache.h"
#include "core/runtime/parameters.h"
#include "loom/kinds/model.h"

namespace loom::core {

/// How the inference model is built.
struct GeneratorOptions {
  /// The training run's /train/seq_length, handed to the model as training would (the
  /// default of max_position_embeddings). 0: the model node's max_position_embeddings,
  /// which must then be set.
  int64_t seq_length = 0;
  /// The longest sequence (prompt + new tokens) and the KV cache's capacity. 0: the model's
  /// maximum, max_position_embeddings when set, else seq_length. With learned position
  /// embeddings it cannot exceed max_position_embeddings.
  int64_t max_sequence = 0;
  /// Parameter dtype of the inference model: "f32" (default), "bf16" or "f16".
  std::string params_dtype = "f32";
  /// The spec's /kernels node ({"libraries": [...], "pin": {op: kernel}}) or an empty
  /// object: kernels_cpu, no pins.
  nlohmann::json kernels = nlohmann::json::object();
  /// Seed of the initial (random) weights, before the caller loads real ones.
  uint64_t init_seed = 0;
  /// Where the model, its parameters and the KV cache live.
  Device device{DeviceType::kCpu, 0};

  /// seq_length from /train/seq_length, kernels from /kernels and the device (index 0)
  /// from /train/device of a resolved spec.
  static GeneratorOptions from_spec(const nlohmann::json& spec);
};

/// What one `generate` call asks for.
struct GenerateOptions {
  int64_t max_new_tokens = 64;  ///< >= 0
  SamplingOptions sampling;     ///< temperature, top_k, top_p, seed
  /// Sample only ids below this (the tokenizer's size when the model's vocabulary is padded
  /// beyond it). 0: every id of the model.
  int64_t vocab_limit = 0;
};

/// Why generation stopped.
enum class StopReason {
  kMaxNewTokens,  ///< max_new_tokens were generated
  kEod,           ///< the end-of-document token was generated (it is the last new token)
  kMaxSequence,   ///< the sequence reached the model's maximum length (max_sequence())
};

/// "max_new_tokens", "eod", "max_sequence".
const char* stop_reason_name(StopReason reason);

/// The result of `generate`.
struct Generation {
  std::vector<int32_t> tokens;  ///< the new tokens, in order (without the prompt)
  StopReason stop = StopReason::kMaxNewTokens;
};

class Generator {
 public:
  /// Builds the model of `model` (a "model" spec node with "impl", resolved or not) on the
  /// CPU. Loads the plugins that provide the node's components and the kernel libraries
  /// when they are not loaded yet.
  /// \param plugins  the plugin manager (its catalog, registry and host); must outlive this
  /// \param model    the "model" node, e.g. CheckpointReader::model_spec() or spec["model"]
  /// \param options  see GeneratorOptions
  /// Throws SpecError (a bad node, pointers under "/model"), PluginError (a missing plugin
  /// or kernel library) or InvalidArgument (options out of range).
  Generator(PluginManager& plugins, const nlohmann::json& model,
            const GeneratorOptions& options = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  /// The parameters, named as in the model's state dict; load weights into them.
  ParameterSet& params() { return *params_; }
  /// The model.
  IModel& model() { return *model_; }
  /// V, the model's vocabulary size (logits per position).
  int64_t vocab_size() const { return vocab_; }
  /// The longest sequence (prompt + new tokens) this generator decodes.
  int64_t max_sequence() const { return max_sequence_; }

  /// Copies every parameter's values from `source` by name (converting the dtype), e.g.
  /// from a trainer's parameters. Throws InvalidArgument naming a parameter that `source`
  /// lacks or holds with another shape.
  void copy_parameters_from(const ParameterSet& source);

  /// One forward pass over all of `tokens` (positions 0 .. T-1), no cache: the logits of
  /// every position, (T, V) row-major f32. 1 <= T <= max_sequence().
  std::vector<float> logits_full(const std::vector<int32_t>& tokens);

  /// Runs `tokens` at the positions after those already cached, reading and filling the KV
  /// cache: their logits, (T, V) row-major f32. Throws Error(kOutOfRange) when
  /// cached_length() + T would exceed max_sequence().
  std::vector<float> extend(const std::vector<int32_t>& tokens);
  /// Positions in the KV cache.
  int64_t cached_length() const { return cache_->past_length(); }
  /// Empties the KV cache (a new sequence).
  void reset() { cache_->reset(); }

  /// Generates up to options.max_new_tokens tokens after `prompt`: prefill of the prompt in
  /// one forward pass, then one pass per new token through the KV cache. Starts a new
  /// sequence (the cache is reset).
  /// \param prompt    the token ids to continue, 1 <= size <= max_sequence()
  /// \param options   see GenerateOptions (sampling validated: InvalidArgument)
  /// \param eod       the end-of-document id: generation stops after producing it
  /// \param on_token  called with each new token as soon as it is chosen (streaming)
  Generation generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                      std::optional<int32_t> eod = std::nullopt,
                      const std::function<void(int32_t)>& on_token = {});

 private:
  // Forward of (1, T) `tokens` at positions `first` .. first + T - 1 (explicit ids when
  // `with_positions`), through the cache when `cached`. Returns the logits.
  std::vector<float> forward(const std::vector<int32_t>& tokens, int64_t first, bool with_positions,
                             bool cached);

  PluginManager& plugins_;
  Device device_{DeviceType::kCpu, 0};
  ObjectPtr model_object_;
  IModel* model_ = nullptr;
  std::unique_ptr<ParameterSet> params_;
  std::unique_ptr<KvCache> cache_;
  int64_t vocab_ = 0, max_sequence_ = 0;
};

}  // namespace loom::core
