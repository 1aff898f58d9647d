// GptModel::activation_bytes: the analytic peak of one micro-batch's activations, to set
// beside the measured peak (the core's memory estimate asks for it through IModel::cost).
//
// It follows what this plugin's modules keep (they hand every other tensor back to the
// forward context as soon as it is consumed). With n = B * T tokens of the micro-batch on
// this rank, s the parameter dtype's size, C the hidden size, Hl / Gl the query heads /
// key-value groups and Fl the MLP width on this rank (each divided by tp), D the head
// dimension and Vl the vocabulary on this rank, each layer saves for backward (recompute
// "none"):
//     layer input, its normalised form, the attention output, the residual and the MLP
//     input:                                5 n C s        (C = Hl D for the output: n Hl D s)
//     fused attention: q, k, v and the row log-sum-exp: n (Hl + 2 Gl) D s + 4 n Hl
//     dot_product attention: head-major q, k, v and the probabilities:
//                                           n (Hl + 2 Gl) D s + B Hl T^2 s (not "selective")
//     MLP: fc1 output (Fl, or 2 Fl for swiglu) and activation output (Fl): n (fc1 + Fl) s
//     the two norms' statistics (f32): layernorm 2 x 2 x 4 n, rmsnorm 2 x 4 n
// and with recompute "full" only its input, n C s. With FP8 GEMMs each of the layer's four
// linear sites (qkv, proj, fc1, fc2) keeps its input's and its weight's FP8 transposes, one
// byte an element: n (2 C + Hl D + Fl) + C ((Hl + 2 Gl) D + Hl D + fc1 + Fl) bytes per layer;
// and the layer no longer keeps the normalised input, the MLP input and the activation
// output in the parameter dtype, nor the attention output unless the attention core keeps
// it (fused does, for its backward): n (2 C + Fl (+ Hl D)) s less. The model's
// num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16 layers are not FP8. After the last
// layer come the final norm's input and output, its statistics, the logits n Vl s and their
// log-sum-exp 4 n. The peak is reached when backward starts, with the logits' gradient (n Vl
// s) beside all of that, or inside the top layer's MLP backward when that is larger (dy, da,
// d(fc1 out), dx: n (2 C + Fl + fc1) s, plus n C s for hidden dropout). A pipeline stage
// counts its own layers, and the final norm and the logits only on the last stage. Not
// counted: kernel workspaces, the batch's ids, the RoPE table and the allocator's rounding,
// which is why the estimate is meant to be within 10%, not exact.
#include <algorithm>
#include <string>

#include "plugins/transformer/gpt_model.h"

namespace loom::transformer {
namespace {

// The impl of a child node ("layer" -> "norm" -> "impl"), or "" when absent.
std::string impl_of(const nlohmann::json& node) {
  if (!node.is_object() || !node.contains("impl") || !node["impl"].is_string()) return "";
  return node["impl"].get<std::string>();
}

}  // namespace

double GptModel::activation_bytes(const CostQuery& query) const {
  const GptConfig& c = config_;
  const nlohmann::json& layer = options_.value("layer", nlohmann::json::object());
  const std::string norm = impl_of(layer.value("norm", nlohmann::json::object()));
  const std::string final_norm = impl_of(options_.value("final_norm", nlohmann::json::object()));
  const std::string attention = impl_of(layer.value("attention", nlohmann::json::object()));
  const nlohmann::json& mlp = layer.value("mlp", nlohmann::json::object());
  auto known_norm = [](const std::string& n) { return n == "layernorm" || n == "rmsnorm"; };
  if (impl_of(layer) != "transformer_layer" || !known_norm(norm) || !known_norm(final_norm) ||
      (attention != "fused" && attention != "dot_product") || impl_of(mlp) != "mlp")
    return -1;  // a child from elsewhere: its memory is not known here

  const double p = static_cast<double>(tp_.size());
  const double b = static_cast<double>(query.micro_batch);
  const double t = static_cast<double>(query.seq_length);
  const double n = b * t;
  const double s = static_cast<double>(dtype_size(c.params_dtype));
  const double cc = static_cast<double>(c.hidden_size);
  const double h = static_cast<double>(c.num_attention_heads);
  const double g = static_cast<double>(c.num_query_groups);
  const double d = static_cast<double>(c.kv_channels);
  const double f = static_cast<double>(c.ffn_hidden_size);
  const double v = static_cast<double>(c.vocab_size);
  const double layers = static_cast<double>(c.layer_end - c.layer_begin);
  const double hl = h / p, gl = std::max(1.0, g / p), fl = f / p, vl = v / p;
  const bool swiglu = mlp.value("activation", std::string("gelu")) == "swiglu";
  const double fc1 = swiglu ? 2 * fl : fl;
  // Layer-boundary tensors are sequence shards with sequence parallelism.
  const double edge = tp_.sequence_parallel() ? n * cc * s / p : n * cc * s;
  auto stats = [&](const std::string& impl) { return (impl == "layernorm" ? 8.0 : 4.0) * n; };

  // What one layer keeps from its forward until its backward without recomputation.
  double kept = 0;
  kept += 2 * edge;                   // input, residual (the norms' inputs)
  kept += 2 * n * cc * s;             // normalised input, MLP input (whole sequence)
  kept += n * hl * d * s;             // attention output
  kept += n * (hl + 2 * gl) * d * s;  // q, k, v (head-major copies: dot_product)
  kept += 2 * stats(norm);            // both norms' statistics
  kept += n * (fc1 + fl) * s;         // fc1 output, activation output
  if (attention == "fused")
    kept += 4 * n * hl;  // log-sum-exp
  else if (query.recompute != RecomputePolicy::kSelective)
    kept += b * hl * t * t * s;  // probabilities
  // An FP8 layer keeps x^T and W^T of qkv, proj, fc1, fc2 in one-byte FP8 instead of those x.
  const double kept_fp8 = kept + n * (2 * cc + hl * d + fl) +
                          cc * ((hl + 2 * gl) * d + hl * d + fc1 + fl) -
                          n * (2 * cc + fl + (attention == "fused" ? 0 : hl * d)) * s;
  // This stage's layers that run in FP8 (the model's num_layers_at_{start,end}_in_bf16 stay
  // in the parameter dtype), and whether its top layer is one of them.
  double fp8_layers = 0;
  bool top_fp8 = false;
  if (query.fp8 != 0)
    for (int64_t i = c.layer_begin; i < c.layer_end; ++i) {
      bool fp8 = i >= c.layers_at_start_in_bf16 && i < c.num_layers - c.layers_at_end_in_bf16;
      fp8_layers += fp8 ? 1 : 0;
      top_fp8 = fp8;
    }
  const bool full = query.recompute == RecomputePolicy::kFull;
  double saved = full ? layers * edge : (layers - fp8_layers) * kept + fp8_layers * kept_fp8;
  // Backward's extra inside the top layer's MLP, beside everything saved (and under full
  // recomputation that layer's forward rerun).
  const double dropout = c.hidden_dropout > 0 ? n * cc * s : 0;
  const double top_mlp = n * (2 * cc + fl + fc1) * s + dropout;
  const double top_kept = top_fp8 ? kept_fp8 : kept;
  const double top_layer = layers > 0 ? (full ? top_kept : 0) + top_mlp : 0;
  if (!c.last_stage()) {
    // The stage's output (kept until its gradient comes back) beside the saves; backward
    // starts with that gradient beside them.
    return saved + edge + std::max(edge, top_layer);
  }
  const double logits = n * vl * s + 4 * n;        // and their log-sum-exp
  saved += edge + n * cc * s + stats(final_norm);  // final norm's input, output layer's input
  saved += logits;
  // Backward starts with the logits' gradient beside everything saved; in the top layer's
  // MLP backward the logits are gone.
  const double transient = std::max(n * vl * s, top_layer - logits);
  return saved + transient;
}

}  // namespace loom::transformer
