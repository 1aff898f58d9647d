// GptModel::activation_bytes: the analytic peak of one micro-batch's activations, to set
// beside the measured peak (the core's memory estimate asks for it through IModel::cost).
//
// It follows what this plugin's modules keep (they hand every other tensor back to the
// forward context as soon as it is consumed). With n = B * T tokens of the micro-batch on
// this rank, s the parameter dtype's size, C the hidden size, Hl / Gl the query heads /
// key-value groups and Fl the MLP width on this rank (each divided by tp), D the head
// dimension and Vl the (padded) vocabulary on this rank, each layer saves for backward
// (recompute "none"):
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
// num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16 layers are not FP8. When the FP8
// weights are kept across micro-batches (CostQuery::fp8 2, nn::Linear), W^T is not a
// micro-batch's: every FP8 site's kept W and W^T, 2 bytes a weight, count once, whatever the
// recomputation. After the last
// layer come the final norm's input and output, its statistics, the logits n Vl s and their
// log-sum-exp 4 n. The peak is reached when backward starts, with the logits' gradient (n Vl
// s) beside all of that (with the loss fused, GptModel::fuses_loss, that gradient is the
// logits' memory, and the output layer's input gradient n C s, less the log-sum-exp, takes
// its place), or in the top layer's backward when that is larger, with the other
// layers' saves beside it and the final norm's and the logits' gone:
//   inside its MLP's backward, all the layer saved beside dy, da, d(fc1 out), dx:
//     n (2 C + Fl + fc1) s, plus n C s for hidden dropout; in FP8 also d(fc1 out) quantised
//     and transposed, 2 n fc1, where swiglu_fp8_bwd writes only those (no n fc1 s);
//   at the end of its attention core's backward (the core releases its buffers only then),
//     the attention half of its saves (less the residual and the pre-MLP norm's statistics,
//     the MLP half's) beside dy, the residual's gradient, d(core out) (2 n C s + n Hl D s)
//     and the core's buffers: fused dq, dk, dv, n (Hl + 2 Gl) D s; dot_product also their
//     head-major copies and d(out)'s (n (2 Hl + 2 Gl) D s more) and the probabilities' and
//     the scores' gradients, 2 B Hl T^2 s (3 under "selective", which recomputes the
//     probabilities there; 2 more with attention dropout: the dropped probabilities and
//     their gradient).
// Under "full" the top layer's saves are those of its rerun, whose input is the one the
// layer kept. A pipeline stage counts its own layers, and the final norm and the logits only
// on the last stage. Not counted: kernel workspaces, the batch's ids, the RoPE table and the
// allocator's rounding (tests/tools/memory_test holds the estimate within 1% of the peak;
// the models there reach 1.0000 to 1.0060).
//
// A mixture-of-experts layer (mlp impl "moe", plugins/moe; the layers moe_layer_freq marks
// 0 take dense_mlp and count as above) keeps its attention half as above; its MLP half is
// moe_layer_bytes below, from what the router, the dispatcher, the grouped experts and the
// shared experts save. How many rows reach this rank's experts depends on the routing:
// dropless, the estimate assumes balanced routing (each expert-parallel rank receives N K
// of the N K ep rows of its expert group; at ep 1 that is exact whatever the routing); with
// expert_capacity_factor it takes the capacity's bound (E ceil(N K / E x factor) rows, at
// most N K ep), which a run can only stay under.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "plugins/transformer/gpt_model.h"
#include "plugins/transformer/mlp.h"

namespace loom::transformer {
namespace {

// The impl of a child node ("layer" -> "norm" -> "impl"), or "" when absent.
std::string impl_of(const nlohmann::json& node) {
  if (!node.is_object() || !node.contains("impl") || !node["impl"].is_string()) return "";
  return node["impl"].get<std::string>();
}

// A number option of `node`, or `otherwise` when absent or null.
double number_of(const nlohmann::json& node, const char* key, double otherwise) {
  if (!node.is_object() || !node.contains(key) || !node[key].is_number()) return otherwise;
  return node[key].get<double>();
}

// One layer's bytes: what it keeps from its forward until its backward (in the parameter
// dtype, and with FP8 GEMMs), the largest extra its MLP's backward holds beside all of
// that, the MLP's output gradient included, and all the layer holds (its output gradient
// included) at the end of its attention core's backward, when the MLP half's saves are gone.
struct LayerBytes {
  double kept = 0, kept_fp8 = 0, top_mlp = 0, top_mlp_fp8 = 0, attention = 0, attention_fp8 = 0;
  double fp8_weights = 0;  // elements of the layer's FP8 sites' weights on this rank
};

// The shapes a mixture-of-experts layer's estimate needs (the model's, on this rank).
struct MoeShapes {
  double n;        // tokens of whole sequences (the shared experts' with sequence parallelism)
  double nm;       // the layer's own tokens: n, or its sequence shard n / tp
  double p;        // tensor-parallel ranks (they split the shared experts' width)
  bool sp;         // sequence parallelism (the shared experts gather the sequence)
  double ep;       // expert-parallel ranks
  double etp;      // expert-tensor-parallel ranks (they split F and share their rows)
  double c, s;     // hidden size, parameter dtype's size
  double ffn;      // the model's ffn_hidden_size (moe_ffn_hidden_size's default)
  double dropout;  // bytes of the hidden dropout's gradient copy (0 without dropout)
};

// The MLP half of a mixture-of-experts layer (plugins/moe, recompute "none"): kept = what
// the router, the dispatcher and the experts save, top_mlp = its backward's largest extra.
// Unset when a child is not one whose memory is known here. With N = nm tokens, K choices,
// E experts, M rows reaching this rank's experts and Ms rows it sends (the routing
// assumption of the file comment), F the expert width (fc1: F, or 2 F for swiglu):
//   router (topk):    its input N C s, the logits 4 N E, the chosen experts 4 N K; with a
//                     load-balancing term the scores' gradient and order 8 N E, with the
//                     z-loss the logsumexp's gradient 4 N
//   alltoall:         slot -> row and row -> slot maps 4 (N K + Ms), the regrouping maps
//                     8 M, the probs 4 N K, the rows returned from the experts Ms C s
//   allgather:        the maps and the probs of the group's ep N tokens 8 ep N K, the row
//                     -> slot map 4 M, the experts' output M C s
//   experts:          their input, fc1 output, activation output M (C + fc1 + F) s; with
//                     etp > 1 the input of every etp rank's rows, etp M C s, and F / etp
//   shared experts:   fc1 output and activation output n (fc1 + F) / tp s, the gathered
//                     input n C s with sequence parallelism; the gate keeps its output N C s
//                     and 16 N bytes of gate values
// Backward runs the shared experts first (their saves go, their dx N C stays), then the
// combine's backward, the experts' (the largest as a rule: d(out), da, d(fc1 out), dx of
// M rows beside the probs' gradient), the dispatch's and the router's.
std::optional<LayerBytes> moe_layer_bytes(const nlohmann::json& moe, const MoeShapes& m) {
  const nlohmann::json router = moe.value("router", nlohmann::json::object());
  const nlohmann::json dispatcher = moe.value("dispatcher", nlohmann::json::object());
  const std::string router_impl = impl_of(router), dispatcher_impl = impl_of(dispatcher);
  if (!router_impl.empty() && router_impl != "topk") return std::nullopt;
  if (!dispatcher_impl.empty() && dispatcher_impl != "alltoall" && dispatcher_impl != "allgather")
    return std::nullopt;
  const bool allgather = dispatcher_impl == "allgather";
  const double e = number_of(moe, "num_experts", 0), k = number_of(router, "topk", 2);
  if (e < 1 || k < 1) return std::nullopt;
  const double c = m.c, s = m.s, nm = m.nm, ep = m.ep;
  const double f = number_of(moe, "moe_ffn_hidden_size", m.ffn);
  const bool swiglu = moe.value("activation", std::string("gelu")) == "swiglu";
  const double fc1 = swiglu ? 2 * f : f;
  // The router's load-balancing terms (any type but "none" with a coefficient > 0).
  nlohmann::json types = router.value("load_balancing_type", nlohmann::json("aux_loss"));
  nlohmann::json coeffs = router.value("aux_loss_coeff", nlohmann::json(0.0));
  if (!types.is_array()) types = nlohmann::json::array({types});
  if (!coeffs.is_array()) coeffs = nlohmann::json::array({coeffs});
  bool balance = false;
  for (size_t i = 0; i < types.size() && i < coeffs.size(); ++i)
    balance = balance || (types[i] != "none" && coeffs[i].is_number() && coeffs[i] > 0);
  const bool z_loss = number_of(router, "z_loss_coeff", 0) > 0;

  // Rows: this rank's N K choices; dropless, balanced routing brings each rank N K rows;
  // the capacity (the moe layer's, from this rank's tokens) bounds each expert at ep x
  // capacity rows and this rank's sends at E x capacity.
  const double choices = nm * k;
  double sent = choices, rows = choices;
  const double factor = number_of(moe, "expert_capacity_factor", 0);
  if (factor > 0) {
    const double capacity = std::ceil(choices / e * factor);
    sent = std::min(choices, e * capacity);
    rows = std::min(ep * choices, e * capacity);
  }
  const double slots = allgather ? ep * choices : choices;  // (token, choice) slots indexed

  const double router_kept =
      nm * c * s + 4 * nm * e + 4 * choices + (balance ? 8 * nm * e : 0) + (z_loss ? 4 * nm : 0);
  const double dispatcher_kept = allgather ? 8 * slots + 4 * rows + rows * c * s
                                           : 8 * choices + 4 * sent + 8 * rows + sent * c * s;
  const double etp = m.etp;
  const double experts_kept = etp * rows * c * s + rows * (fc1 + f) * s;
  const double shared = number_of(moe, "shared_expert_intermediate_size", 0);
  const bool gate = shared > 0 && moe.value("shared_expert_gate", false);
  const double sf = shared / m.p, sfc1 = swiglu ? 2 * sf : sf;  // this rank's shared width
  double shared_kept = shared > 0 ? (m.sp ? m.n * c * s : 0) + m.n * (sfc1 + sf) * s : 0;
  if (gate) shared_kept += nm * c * s + 16 * nm;

  LayerBytes out;
  out.kept = router_kept + dispatcher_kept + experts_kept + shared_kept;
  // Backward, phase by phase, beyond every save of the layer and its output gradient.
  const double dprobs = 4 * choices;
  // Shared experts: the gathered dy, da, d(fc1 out), dx (partial, and its shard), the
  // gate's dy and dx.
  const double shared_bwd = shared > 0 ? (m.sp ? m.n * c * s + nm * c * s : 0) +
                                             m.n * (sf + sfc1 + c) * s + (gate ? 2 * nm * c * s : 0)
                                       : 0;
  const double after_shared = shared > 0 ? nm * c * s - shared_kept : 0;
  // Combine's backward: the returned rows' gradient, the probs' gradient and the rows in
  // expert order (alltoall: and those arrived, ep > 1); allgather: the gathered dy, the
  // experts' output gradient, the group's probs gradient and this rank's share.
  const double combine_bwd =
      after_shared + (allgather ? (ep > 1 ? ep * nm * c * s + dprobs : 0) + rows * c * s + 4 * slots
                                : sent * c * s + dprobs + (ep > 1 ? 2 : 1) * rows * c * s);
  // Experts' backward: their output gradient, da, d(fc1 out), dx, the probs' gradient;
  // with etp > 1 the gathered output gradient and dx of etp M rows, then dx's etp parts and
  // its sum for this rank's rows in place of da and d(fc1 out).
  const double experts_bwd =
      after_shared + dprobs + rows * c * s +
      (etp > 1 ? 2 * etp * rows * c * s + std::max(rows * (f + fc1), (etp + 1) * rows * c) * s
               : rows * (f + fc1 + c) * s);
  // Dispatch's backward (the experts' saves gone; their output gradient and dx kept until
  // the layer's end): the rows back in this rank's order and its token gradient.
  const double dispatch_bwd =
      after_shared + dprobs + 2 * rows * c * s - experts_kept + nm * c * s +
      (allgather ? (ep > 1 ? ep * nm * c * s : 0) : rows * c * s + (ep > 1 ? sent * c * s : 0));
  // Router's backward (the dispatcher's saves gone too): d logits, the balance terms', their
  // cast to the parameter dtype, dx.
  const double router_bwd = after_shared + dprobs + 2 * rows * c * s - experts_kept -
                            dispatcher_kept + nm * c * s + 4 * nm * e * (balance ? 2 : 1) +
                            (s < 4 ? nm * e * s : 0) + nm * c * s;
  out.top_mlp = nm * c * s + m.dropout +
                std::max({shared_bwd, combine_bwd, experts_bwd, dispatch_bwd, router_bwd});
  out.top_mlp_fp8 = out.top_mlp;  // the experts' GEMMs are not FP8
  return out;
}

}  // namespace

double GptModel::activation_bytes(const CostQuery& query) const {
  const GptConfig& c = config_;
  const nlohmann::json& layer = options_.value("layer", nlohmann::json::object());
  const std::string norm = impl_of(layer.value("norm", nlohmann::json::object()));
  const std::string final_norm = impl_of(options_.value("final_norm", nlohmann::json::object()));
  const std::string attention = impl_of(layer.value("attention", nlohmann::json::object()));
  // The layers moe_layer_freq marks take "mlp", the others "dense_mlp".
  const nlohmann::json& mlp = layer.value("mlp", nlohmann::json::object());
  const nlohmann::json& dense_mlp =
      layer.value("dense_mlp", nlohmann::json{{"impl", std::string("mlp")}});
  auto known_norm = [](const std::string& n) { return n == "layernorm" || n == "rmsnorm"; };
  if (impl_of(layer) != "transformer_layer" || !known_norm(norm) || !known_norm(final_norm) ||
      (attention != "fused" && attention != "dot_product"))
    return -1;                          // a child from elsewhere: its memory is not known here
  if (c.mtp_num_layers > 0) return -1;  // multi-token prediction's depths: not modelled here
  if (!c.hybrid_layer_pattern.empty())
    return -1;  // a hybrid's layers differ (Mamba, attention-only, MLP-only): not modelled here
  if (c.multi_latent_attention.is_object())
    return -1;  // multi-latent attention's latents and head dims: not modelled here

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
  const double v = static_cast<double>(c.padded_vocab_size);  // the logits' columns
  const double layers = static_cast<double>(c.layer_end - c.layer_begin);
  const double hl = h / p, gl = std::max(1.0, g / p), fl = f / p, vl = v / p;
  // Layer-boundary tensors are sequence shards with sequence parallelism.
  const double edge = tp_.sequence_parallel() ? n * cc * s / p : n * cc * s;
  auto stats = [&](const std::string& impl) { return (impl == "layernorm" ? 8.0 : 4.0) * n; };
  const double dropout = c.hidden_dropout > 0 ? n * cc * s : 0;

  // What the attention half of a layer keeps from its forward until its backward without
  // recomputation: input, residual (the norms' inputs), normalised input (whole sequence),
  // attention output, q, k, v (head-major copies: dot_product), both norms' statistics.
  double kept_attention =
      2 * edge + n * cc * s + n * hl * d * s + n * (hl + 2 * gl) * d * s + 2 * stats(norm);
  if (attention == "fused")
    kept_attention += 4 * n * hl;  // log-sum-exp
  else if (query.recompute != RecomputePolicy::kSelective)
    kept_attention += b * hl * t * t * s;  // probabilities
  // An FP8 layer keeps x^T and W^T of qkv and proj in one-byte FP8 instead of the
  // normalised input (and the attention output, unless the attention core keeps it). With
  // the weights kept across micro-batches (query.fp8 == 2) W^T is not the micro-batch's: the
  // kept copies, W and W^T of every FP8 site, are counted once below (kept_weights).
  const bool weight_copies = query.fp8 == 2;
  const double attention_weights = cc * ((hl + 2 * gl) * d + hl * d);
  const double fp8_attention = n * (cc + hl * d) + (weight_copies ? 0 : attention_weights) -
                               n * (cc + (attention == "fused" ? 0 : hl * d)) * s;
  // The end of the attention core's backward: the layer's attention half of the saves less
  // the residual and the pre-MLP norm's statistics (the MLP half's, gone), beside the
  // layer's output gradient, the residual's gradient and the core output's gradient. Fused,
  // the core adds dq, dk, dv; dot_product also its head-major d(out), dq, dk, dv and (B, Hl,
  // T, T) buffers: the probabilities' and the scores' gradients, the probabilities when
  // recomputed ("selective"), the dropped probabilities and their gradient with attention
  // dropout. It releases all of them only at its end.
  const double qkv_grads = n * (hl + 2 * gl) * d * s;
  const double square_buffers = 2 + (query.recompute == RecomputePolicy::kSelective ? 1 : 0) +
                                (c.attention_dropout > 0 ? 2 : 0);
  const double core_bwd =
      attention == "fused" ? qkv_grads
                           : 2 * qkv_grads + n * hl * d * s + square_buffers * b * hl * t * t * s;
  const double attention_bwd =
      kept_attention - edge - stats(norm) + 2 * edge + n * hl * d * s + core_bwd;
  // A layer with `node` as its MLP, or unset when its memory is not known here.
  const bool swiglu_grad_fp8 = query.fp8 != 0 && quantizes_swiglu_grad();
  auto layer_bytes = [&](const nlohmann::json& node) -> std::optional<LayerBytes> {
    const std::string impl = impl_of(node);
    if (impl == "moe") {
      const bool sp = tp_.sequence_parallel();
      std::optional<LayerBytes> l =
          moe_layer_bytes(node, MoeShapes{n, sp ? n / p : n, p, sp, static_cast<double>(ep_size_),
                                          static_cast<double>(etp_size_), cc, s, f,
                                          c.hidden_dropout > 0 ? edge : 0});
      if (!l) return l;
      l->kept += kept_attention;  // the experts have no FP8 GEMMs: only attention's change
      l->kept_fp8 = l->kept + fp8_attention;
      l->attention = attention_bwd;
      l->attention_fp8 = attention_bwd + fp8_attention;
      l->fp8_weights = attention_weights;
      return l;
    }
    if (impl != "mlp") return std::nullopt;
    const bool swiglu = node.value("activation", std::string("gelu")) == "swiglu";
    const double fc1 = swiglu ? 2 * fl : fl;
    LayerBytes l;
    // The MLP input (whole sequence), fc1 output, activation output; with FP8 the fc1 and fc2
    // sites' transposes instead of the MLP input and the activation output.
    l.kept = kept_attention + n * cc * s + n * (fc1 + fl) * s;
    l.kept_fp8 = l.kept + fp8_attention + n * (cc + fl) + (weight_copies ? 0 : cc * (fc1 + fl)) -
                 n * (cc + fl) * s;
    l.fp8_weights = attention_weights + cc * (fc1 + fl);
    // Backward's extra inside the MLP: dy, da, d(fc1 out), dx (and dropout's copy of dy);
    // an FP8 layer's fc1 backward also holds d(fc1 out) quantized and its transpose, one
    // byte an element each (nn::Linear::backward).
    l.top_mlp = n * (2 * cc + fl + fc1) * s + dropout;
    // With swiglu_fp8_bwd (Mlp::quantizes_swiglu_grad) that gradient exists only quantised.
    l.top_mlp_fp8 = l.top_mlp + 2 * n * fc1 - (swiglu_grad_fp8 ? n * fc1 * s : 0);
    l.attention = attention_bwd;
    l.attention_fp8 = attention_bwd + fp8_attention;
    return l;
  };
  // This stage's layers (num_layers_at_{start,end}_in_bf16 stay in the parameter dtype in an
  // FP8 run), and its top layer's bytes.
  std::optional<LayerBytes> sparse, dense;
  const bool full = query.recompute == RecomputePolicy::kFull;
  double saved = 0, top_kept = 0, top_mlp = 0, top_attention = 0, kept_weights = 0;
  for (int64_t i = c.layer_begin; i < c.layer_end; ++i) {
    const bool moe_node = c.moe_layers[static_cast<size_t>(i)];
    std::optional<LayerBytes>& l = moe_node ? sparse : dense;
    if (!l) l = layer_bytes(moe_node ? mlp : dense_mlp);
    if (!l) return -1;  // a child from elsewhere
    const bool fp8 = query.fp8 != 0 && i >= c.layers_at_start_in_bf16 &&
                     i < c.num_layers - c.layers_at_end_in_bf16;
    top_kept = fp8 ? l->kept_fp8 : l->kept;
    top_mlp = fp8 ? l->top_mlp_fp8 : l->top_mlp;
    top_attention = fp8 ? l->attention_fp8 : l->attention;
    saved += full ? edge : top_kept;
    if (fp8 && weight_copies) kept_weights += 2 * l->fp8_weights;  // W and W^T, one byte each
  }
  // The top layer's backward, beside the other layers' saves: all it holds inside its MLP's
  // backward or at the end of its attention core's (the larger), in place of what it keeps
  // until then (under full recomputation: its input, which its rerun's saves include).
  const double top_layer =
      layers > 0 ? std::max(top_kept + top_mlp, top_attention) - (full ? edge : top_kept) : 0;
  if (!c.last_stage()) {
    // The stage's output (kept until its gradient comes back) beside the saves; backward
    // starts with that gradient beside them.
    return kept_weights + saved + edge + std::max(edge, top_layer);
  }
  // The final norm's input and statistics, the output layer's input, the logits and their
  // log-sum-exp: kept until the loss's, the output layer's and the final norm's backward.
  const double head = edge + n * cc * s + stats(final_norm) + n * vl * s + 4 * n;
  // Backward starts with the logits' gradient beside everything saved; in the top layer's
  // backward the head's saves are gone. With the loss in one pass (fuses_loss) the gradient
  // is in the logits' memory, and the peak comes in the output layer's backward: its input's
  // gradient beside it, the log-sum-exp dropped.
  const double loss_peak = fuses_loss() ? head + n * cc * s - 4 * n : head + n * vl * s;
  return kept_weights + std::max(saved + loss_peak, saved + top_layer);
}

bool GptModel::quantizes_swiglu_grad() const {
  for (const auto& [name, module] : modules_of(*this)) {
    const auto* mlp = dynamic_cast<const Mlp*>(module);
    if (mlp != nullptr && mlp->quantizes_swiglu_grad()) return true;
  }
  return false;
}

}  // namespace loom::transformer
