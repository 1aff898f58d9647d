#include "core/train/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>

namespace loom::core {
namespace {

// The impl of a child node ("layer" -> "norm" -> "impl"), or "" when absent.
std::string impl_of(const nlohmann::json& node) {
  if (!node.is_object() || !node.contains("impl") || !node["impl"].is_string()) return "";
  return node["impl"].get<std::string>();
}

// An integer option, or `fallback` when absent or null.
int64_t integer(const nlohmann::json& node, const char* key, int64_t fallback) {
  if (!node.is_object() || !node.contains(key) || !node[key].is_number_integer()) return fallback;
  return node[key].get<int64_t>();
}

double number(const nlohmann::json& node, const char* key) {
  if (!node.is_object() || !node.contains(key) || !node[key].is_number()) return 0;
  return node[key].get<double>();
}

}  // namespace

uint64_t MemoryEstimate::total() const {
  return weights + grads + master + optimizer + fp8 + activations.value_or(0);
}

std::string MemoryEstimate::describe() const {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  auto g = [&](uint64_t b) { return static_cast<double>(b) / kGiB; };
  return fmt::format(
      "{:.3g} GiB: weights {:.3g}, grads {:.3g}, master {:.3g}, optimizer {:.3g}, {}"
      "activations {} GiB",
      g(total()), g(weights), g(grads), g(master), g(optimizer),
      fp8 > 0 ? fmt::format("fp8 state {:.3g}, ", g(fp8)) : std::string(),
      activations ? fmt::format("{:.3g}", g(*activations)) : std::string("not estimated"));
}

std::optional<uint64_t> transformer_activation_bytes(const nlohmann::json& model,
                                                     const ActivationShape& shape) {
  if (impl_of(model) != "gpt") return std::nullopt;
  const nlohmann::json& layer = model.value("layer", nlohmann::json::object());
  std::string norm = impl_of(layer.value("norm", nlohmann::json::object()));
  std::string final_norm = impl_of(model.value("final_norm", nlohmann::json::object()));
  std::string attention = impl_of(layer.value("attention", nlohmann::json::object()));
  const nlohmann::json& mlp = layer.value("mlp", nlohmann::json::object());
  auto known_norm = [](const std::string& n) { return n == "layernorm" || n == "rmsnorm"; };
  if (impl_of(layer) != "transformer_layer" || !known_norm(norm) || !known_norm(final_norm) ||
      (attention != "fused" && attention != "dot_product") || impl_of(mlp) != "mlp")
    return std::nullopt;

  const double p = static_cast<double>(std::max<int64_t>(1, shape.tp));
  const double b = static_cast<double>(shape.micro_batch);
  const double t = static_cast<double>(shape.seq_length);
  const double n = b * t;
  const double s = static_cast<double>(dtype_size(shape.dtype));
  const int64_t hidden = integer(model, "hidden_size", 0);
  const int64_t heads = std::max<int64_t>(1, integer(model, "num_attention_heads", 1));
  const double c = static_cast<double>(hidden);
  const double h = static_cast<double>(heads);
  const double g = static_cast<double>(integer(model, "num_query_groups", heads));
  const double d = static_cast<double>(integer(model, "kv_channels", hidden / heads));
  const double f = static_cast<double>(integer(model, "ffn_hidden_size", 4 * hidden));
  const double v = static_cast<double>(integer(model, "vocab_size", 0));
  const double layers = static_cast<double>(integer(model, "num_layers", 0));
  const double hl = h / p, gl = std::max(1.0, g / p), fl = f / p, vl = v / p;
  const bool swiglu = mlp.value("activation", std::string("gelu")) == "swiglu";
  const double fc1 = swiglu ? 2 * fl : fl;
  // Layer-boundary tensors are sequence shards with sequence parallelism.
  const double edge = shape.sequence_parallel && p > 1 ? n * c * s / p : n * c * s;
  auto stats = [&](const std::string& impl) { return (impl == "layernorm" ? 8.0 : 4.0) * n; };

  // What one layer keeps from its forward until its backward without recomputation.
  double kept = 0;
  kept += 2 * edge;                   // input, residual (the norms' inputs)
  kept += 2 * n * c * s;              // normalised input, MLP input (whole sequence)
  kept += n * hl * d * s;             // attention output
  kept += n * (hl + 2 * gl) * d * s;  // q, k, v (head-major copies: dot_product)
  kept += 2 * stats(norm);            // both norms' statistics
  kept += n * (fc1 + fl) * s;         // fc1 output, activation output
  if (attention == "fused")
    kept += 4 * n * hl;  // log-sum-exp
  else if (shape.recompute != RecomputePolicy::kSelective)
    kept += b * hl * t * t * s;  // probabilities
  // An FP8 layer keeps x^T and W^T of qkv, proj, fc1, fc2 in one-byte FP8 instead of those x.
  const double kept_fp8 = kept + n * (2 * c + hl * d + fl) +
                          c * ((hl + 2 * gl) * d + hl * d + fc1 + fl) -
                          n * (2 * c + fl + (attention == "fused" ? 0 : hl * d)) * s;
  // Layers kept out of FP8 at either end (the model's num_layers_at_{start,end}_in_bf16).
  const double bf16_start = static_cast<double>(integer(model, "num_layers_at_start_in_bf16", 0));
  const double bf16_end = static_cast<double>(integer(model, "num_layers_at_end_in_bf16", 0));
  const double fp8_layers = shape.fp8 ? std::max(0.0, layers - bf16_start - bf16_end) : 0.0;
  const bool top_fp8 = shape.fp8 && bf16_end == 0 && fp8_layers > 0;
  const bool full = shape.recompute == RecomputePolicy::kFull;
  const double logits = n * vl * s + 4 * n;  // and their log-sum-exp
  double saved = full ? layers * edge : (layers - fp8_layers) * kept + fp8_layers * kept_fp8;
  saved += edge + n * c * s + stats(final_norm);  // final norm's input, output layer's input
  saved += logits;
  // Backward starts with the logits' gradient beside everything saved; in the top layer's
  // MLP backward the logits are gone, and under full recomputation that layer's forward has
  // been rerun.
  const double dropout = number(model, "hidden_dropout") > 0 ? n * c * s : 0;
  const double top_mlp = n * (2 * c + fl + fc1) * s + dropout;
  const double top_kept = top_fp8 ? kept_fp8 : kept;
  const double transient = std::max(n * vl * s, (full ? top_kept : 0) + top_mlp - logits);
  return static_cast<uint64_t>(saved + transient);
}

}  // namespace loom::core
