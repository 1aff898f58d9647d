#include "plugins/transformer/gpt_model.h"

#include <set>
#include <string>

#include "plugins/transformer/mla_attention.h"
#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {

// kLogits: the logits (two-op loss) or empty; kDlogits: their gradient, computed in the
// forward in the logits' memory (fused loss), or empty.
enum Slot : int32_t { kLogits, kLabels, kMask, kLse, kDlogits };

}  // namespace

GptModel::GptModel(const nlohmann::json& options, IBuildContext& ctx)
    : config_(GptConfig::from_options(options)),
      options_(options),
      tp_(*ctx.host(), config_.device, config_.params_dtype, config_.sequence_parallel) {
  IHost& host = *ctx.host();
  const GptConfig& c = config_;
  cp_size_ = group(host, ParallelRole::kContext).size();
  if (c.mtp_num_layers > 0 && cp_size_ > 1)
    invalid(
        "/mtp_num_layers: multi-token prediction with parallel.cp > 1 is not supported yet "
        "(its rolls would cross the context-parallel chunks); run with parallel.cp 1 or set "
        "mtp_num_layers to 0");
  const nlohmann::json layer = options.value("layer", nlohmann::json::object());
  for (const char* slot : {"mlp", "dense_mlp"})
    if (layer.is_object() && layer.contains(slot) && layer[slot].is_object() &&
        layer[slot].value("impl", std::string()) == "moe") {
      ep_size_ = group(host, ParallelRole::kExpert).size();
      etp_size_ = group(host, ParallelRole::kExpertTensor).size();
    }
  // What tensor parallelism splits, checked here so that the message names the model's keys.
  tp_.split(c.num_attention_heads, "/num_attention_heads");
  tp_.split(c.num_query_groups, "/num_query_groups");
  tp_.split(c.ffn_hidden_size, "/ffn_hidden_size");
  // Megatron's vocabulary padding: a multiple of make_vocab_size_divisible_by x tp rows, so
  // that every rank's share of the output layer is aligned (ParamInfo::valid_rows).
  const int64_t multiple = c.make_vocab_size_divisible_by * tp_.size();
  config_.padded_vocab_size = (c.vocab_size + multiple - 1) / multiple * multiple;
  if (c.return_logits && tp_.size() > 1)
    invalid(
        "/return_logits: the logits are split over the tensor-parallel ranks (parallel.tp > 1) "
        "and not returned; run with parallel.tp 1 to get them");
  EmbeddingConfig embedding{c.vocab_size,
                            c.hidden_size,
                            c.position_embedding == "learned" ? c.max_position_embeddings : 0,
                            c.padded_vocab_size,
                            static_cast<float>(c.init_std),
                            static_cast<float>(c.hidden_dropout),
                            c.tie_embeddings,
                            c.params_dtype,
                            c.device,
                            tp_.sequence_parallel()};
  if (c.first_stage()) {
    embedding_ = new Embedding(host, embedding);
    add_child("embedding", embedding_);
  } else if (c.last_stage() && c.tie_embeddings) {
    EmbeddingConfig table = embedding;
    table.max_positions = 0;
    table.table_only = true;
    embedding_ = new Embedding(host, table);
    add_child("embedding", embedding_);
  }
  if (c.layer_kinds.find('M') != std::string::npos &&
      !(options.contains("mamba_layer") && options["mamba_layer"].is_object()))
    invalid(
        "/mamba_layer: /hybrid_layer_pattern has Mamba layers (M) but the model names no "
        "mamba_layer node; add \"mamba_layer\": {\"impl\": \"mamba_layer\"} (plugin mamba)");
  const size_t expert_layer = c.layer_kinds.find('E');
  if (expert_layer != std::string::npos &&
      !(layer.is_object() && layer.contains("mlp") && layer["mlp"].is_object() &&
        layer["mlp"].value("impl", std::string()) == "moe"))
    invalid("/hybrid_layer_pattern: layer " + std::to_string(expert_layer) +
            " is a mixture of experts (E) but /layer/mlp is not {\"impl\": \"moe\"}; make it "
            "one (the dense layers, -, take /layer/dense_mlp)");
  for (int64_t i = c.layer_begin; i < c.layer_end; ++i) {
    const char* node = c.layer_kinds[static_cast<size_t>(i)] == 'M' ? "mamba_layer" : "layer";
    IModule* layer = build_child<ILayer>(ctx, node, c.layer_options(i + 1));
    add_child("decoder.layers." + std::to_string(i), layer);
    layers_.push_back(layer);
  }
  if (!c.last_stage()) return;
  nlohmann::json norm = {{"hidden_size", c.hidden_size},
                         {"params_dtype", dtype_name(c.params_dtype)},
                         {"device", device_name(c.device)},
                         {"sequence_parallel", tp_.sequence_parallel()}};
  add_child("decoder.final_layernorm", final_norm_ = build_child<INorm>(ctx, "final_norm", norm));
  output_layer_ = new OutputLayer(host, embedding, c.tie_embeddings ? embedding_ : nullptr);
  add_child("output_layer", output_layer_);
  if (c.mtp_num_layers > 0) {
    mtp_ = new MultiTokenPrediction(ctx, c, *embedding_, *output_layer_);
    add_child("mtp", mtp_);
  }
  loss_fwd_ = Kernel(host, ops::kCrossEntropyFwd, c.device, c.params_dtype);
  loss_bwd_ = Kernel(host, ops::kCrossEntropyBwd, c.device, c.params_dtype);
  if (tp_.size() == 1)
    loss_fwd_bwd_ = Kernel::optional(host, ops::kCrossEntropyFwdBwd, c.device, c.params_dtype);
  add_ = Kernel(host, ops::kAdd, c.device, c.params_dtype);
  masked_sum_ = Kernel(host, ops::kMaskedSum, c.device, DType::kF32);
  if (tp_.size() > 1) {
    shard_stats_ = Kernel(host, ops::kCrossEntropyShardStats, c.device, c.params_dtype);
    combine_ = Kernel(host, ops::kCrossEntropyCombine, c.device, DType::kF32);
  }
}

bool GptModel::fuses_loss() const {
  return tp_.size() == 1 && cp_size_ == 1 && !config_.return_logits &&
         static_cast<bool>(loss_fwd_bwd_);
}

Status GptModel::info(ModelInfo* out) const noexcept {
  return guard([&] {
    const GptConfig& c = config_;
    ModelInfo m{};
    m.struct_size = sizeof(ModelInfo);
    m.vocab_size = c.vocab_size;
    m.num_layers = c.num_layers;
    m.max_sequence = c.max_position_embeddings;
    m.positions_bounded = c.position_embedding == "learned" ? 1 : 0;
    m.layer_begin = c.layer_begin;
    m.layer_end = c.layer_end;
    m.pp_rank = c.pp_rank;
    m.pp_size = c.pp_size;
    m.chunk = c.chunk;
    m.chunks = c.chunks;
    m.first_stage = c.first_stage() ? 1 : 0;
    m.last_stage = c.last_stage() ? 1 : 0;
    int64_t t = c.seq_length / cp_size_;  // this rank's share of each sequence
    if (tp_.sequence_parallel()) t /= tp_.size();
    m.hidden = make_view(nullptr, c.params_dtype, {c.micro_batch_size, t, c.hidden_size}, c.device);
    copy_struct(m, out);
  });
}

Status GptModel::cost(const CostQuery* query, ModelCost* out) const noexcept {
  return guard([&] {
    const GptConfig& c = config_;
    // Megatron's and llm.c's count: 6 FLOPs per parameter and token (forward 2, backward 4)
    // plus attention's 6 L T (H D) per token (QK^T and AV, causal), for this stage's share;
    // tensor-parallel slices count whole. A token passes through K of a mixture's experts
    // (the layer node's mlp.router.topk): the experts' parameters count as the active ones,
    // K experts' worth per layer (this rank holds some of them; each has the same size).
    const nlohmann::json& mlp =
        options_.value("layer", nlohmann::json::object()).value("mlp", nlohmann::json::object());
    const double topk =
        mlp.contains("router") && mlp["router"].is_object() ? mlp["router"].value("topk", 2) : 2;
    double params = 0;
    for (const auto& [name, module] : modules_of(*this)) {
      ParamInfo p{};
      double expert_params = 0;
      std::set<int32_t> experts;
      for (int32_t i = 0; i < module->param_count(); ++i) {
        p.struct_size = sizeof(ParamInfo);
        throw_if_error(module->param_info(i, &p), "gpt cost: " + name);
        double n = 1;
        for (int32_t d = 0; d < p.ndim; ++d) n *= static_cast<double>(p.global_shape[d]);
        if ((p.flags & kParamExpert) != 0) {
          expert_params += n;
          experts.insert(p.expert_index);
        } else {
          params += n;
        }
      }
      if (!experts.empty()) params += expert_params / static_cast<double>(experts.size()) * topk;
    }
    double width = static_cast<double>(c.kv_channels * c.num_attention_heads);
    if (c.multi_latent_attention.is_object()) {  // QK^T over dn + dr, AV over dv
      const MlaDims mla = MlaDims::from_json(c.multi_latent_attention);
      width = 0.5 * static_cast<double>(c.num_attention_heads * (mla.qk_dim() + mla.v_dim));
    }
    // Attention's term for the layers that attend; a Mamba layer's scan adds 12 H P N per
    // token (the recurrence's state update and readout, 2 H P N FLOPs each, forward and
    // backward), its projections being parameters.
    double attending = 0, mamba = 0;
    for (int64_t i = c.layer_begin; i < c.layer_end; ++i) {
      const char kind = c.layer_kinds[static_cast<size_t>(i)];
      attending += kind == 'T' || kind == '*' ? 1 : 0;
      mamba += kind == 'M' ? 1 : 0;
    }
    // Multi-token prediction (its parameters counted above): each depth's layer attends,
    // and its logits are one more pass through the shared output weight (V C).
    double mtp_head = 0;
    if (c.mtp_num_layers > 0 && c.last_stage()) {
      attending += static_cast<double>(c.mtp_num_layers);
      mtp_head = 6.0 * static_cast<double>(c.mtp_num_layers) *
                 static_cast<double>(c.padded_vocab_size * c.hidden_size);
    }
    double scan = 0;
    if (mamba > 0) {
      const nlohmann::json mixer = options_.value("mamba_layer", nlohmann::json::object())
                                       .value("mixer", nlohmann::json::object());
      const double p = mixer.value("head_dim", 64.0), n = mixer.value("state_dim", 128.0);
      const nlohmann::json heads = mixer.value("num_heads", nlohmann::json());
      const double inner = heads.is_number()
                               ? heads.get<double>() * p
                               : mixer.value("expand", 2.0) * static_cast<double>(c.hidden_size);
      scan = 12.0 * inner * n * mamba;
    }
    ModelCost m{};
    m.struct_size = sizeof(ModelCost);
    m.flops_per_token = 6.0 * params + mtp_head +
                        6.0 * attending * static_cast<double>(query->seq_length) * width + scan;
    m.activation_bytes = activation_bytes(*query);
    copy_struct(m, out);
  });
}

void GptModel::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                           TensorView* outputs, int32_t num_outputs) {
  const GptConfig& c = config_;
  expect_count("gpt forward inputs", num_inputs, c.first_stage() ? 2 : 6);
  expect_count("gpt forward outputs", num_outputs, c.last_stage() ? 1 : 3);
  for (int32_t i = 0; i < num_outputs; ++i) outputs[i] = empty_view();
  const TensorView& tokens = inputs[0];
  expect(tokens, {-1, -1}, DType::kI32, "gpt tokens");
  int64_t b = tokens.shape[0], t = tokens.shape[1];
  TensorView positions = num_inputs > 3 ? inputs[3] : empty_view();
  TensorView segments = num_inputs > 4 ? inputs[4] : empty_view();
  if (present(segments)) expect(segments, {b, t}, DType::kI32, "gpt segment ids");
  if (cp_size_ > 1 && !present(positions) && c.position_embedding != "none")
    fail(Code::kInvalidArgument,
         "gpt: with context parallelism (parallel.cp > 1) each rank holds two chunks of every "
         "sequence, whose positions are not 0..T-1: pass their position ids (input [3]); the "
         "core's trainer does");

  // Each hidden state is handed back once the next module has run: what a module's
  // backward needs of it, that module saved. A stage's input is the caller's.
  TensorView hidden;
  if (c.first_stage()) {
    hidden = call_forward(*embedding_, ctx, {tokens, positions}, 1, "embedding")[0];
  } else {
    hidden = inputs[5];
    int64_t t_local = tp_.sequence_parallel() ? t / tp_.size() : t;
    expect(hidden, {b, t_local, c.hidden_size}, c.params_dtype, "gpt stage input (hidden)");
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    TensorView next =
        call_forward(*layers_[i], ctx, {hidden, positions, segments}, 1, "decoder layer")[0];
    if (c.first_stage() || i > 0) release(ctx, hidden);
    hidden = next;
  }
  if (!c.last_stage()) {
    outputs[2] = hidden;
    return;
  }
  const TensorView& labels = inputs[1];
  expect(labels, {b, t}, DType::kI32, "gpt labels");
  TensorView mask = num_inputs > 2 ? inputs[2] : empty_view();
  if (present(mask)) expect(mask, {b, t}, DType::kF32, "gpt loss mask");
  TensorView normed = call_forward(*final_norm_, ctx, {hidden}, 1, "final_layernorm")[0];
  if (c.first_stage() || !layers_.empty()) release(ctx, hidden);
  TensorView logits = call_forward(*output_layer_, ctx, {normed}, 1, "output_layer")[0];
  if (mtp_ != nullptr && ctx.training()) {  // its loss reported, its gradient its own
    TensorView mtp_loss =
        call_forward(*mtp_, ctx, {tokens, labels, mask, positions, segments, normed}, 1, "mtp")[0];
    release(ctx, mtp_loss);
  }
  release(ctx, normed);

  int64_t n = b * t, v = c.padded_vocab_size / tp_.size();  // this rank's logits
  TensorView loss = allocate(ctx, DType::kF32, {n}, c.device);
  TensorView lse = allocate(ctx, DType::kF32, {n}, c.device);
  TensorView mean = allocate(ctx, DType::kF32, {1}, c.device);
  TensorView totals = allocate(ctx, DType::kF32, {2}, c.device);  // loss sum, token count
  TensorView flat_mask = present(mask) ? reshape(mask, {n}) : empty_view();
  const bool logits_out = num_outputs > 1 && c.return_logits;
  const TensorView* seed = fuses_loss() && !logits_out ? loss_grad_of(ctx) : nullptr;
  if (seed != nullptr) {  // the gradient too, in place: the logits become d loss / d logits
    loss_fwd_bwd_({rows(logits, v), reshape(labels, {n}), flat_mask,
                   make_view(seed->data, DType::kF32, {1}, seed->device)},
                  {loss, lse, mean, rows(logits, v)}, ops::CrossEntropyShardAttrs{0, c.vocab_size});
  } else if (tp_.size() == 1) {  // the vocabulary's columns (a padded one's padding: no part)
    loss_fwd_({rows(logits, v), reshape(labels, {n}), flat_mask}, {loss, lse, mean},
              ops::CrossEntropyShardAttrs{0, c.vocab_size});
  } else {  // vocab-parallel: per-row statistics of each shard, gathered and combined
    int64_t p = tp_.size();
    ops::CrossEntropyShardAttrs attrs{tp_.rank() * v, c.vocab_size};
    TensorView stats = allocate(ctx, DType::kF32, {n, 3}, c.device);
    shard_stats_({rows(logits, v), reshape(labels, {n}), flat_mask}, {stats}, attrs);
    TensorView all = allocate(ctx, DType::kF32, {p, n, 3}, c.device);
    tp_.all_gather(stats, all, "the loss statistics");
    combine_({all, reshape(labels, {n}), flat_mask}, {loss, lse, mean}, attrs);
    release_all(ctx, {stats, all});
  }
  masked_sum_({loss, flat_mask}, {totals});
  if (ctx.training()) {
    save(ctx, this, kLogits, seed != nullptr ? empty_view() : logits);
    save(ctx, this, kDlogits, seed != nullptr ? logits : empty_view());
    save(ctx, this, kLabels, labels);
    save(ctx, this, kMask, mask);
    save(ctx, this, kLse, lse);
  }
  outputs[0] = make_view(mean.data, DType::kF32, nullptr, 0, c.device);  // scalar
  if (logits_out) outputs[1] = logits;
  if (num_outputs > 3) outputs[3] = make_view(totals.data, DType::kF32, nullptr, 0, c.device);
  if (num_outputs > 4)
    outputs[4] = make_view(static_cast<float*>(totals.data) + 1, DType::kF32, nullptr, 0, c.device);
  // The saves keep theirs; mean and totals are the caller's. The logits' gradient stays
  // unreleased: backward hands it to the output layer after dropping the saves.
  release_all(ctx, {loss, lse, logits_out || seed != nullptr ? empty_view() : logits});
}

void GptModel::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                            int32_t num_grad_outputs, TensorView* grad_inputs,
                            int32_t num_grad_inputs) {
  const GptConfig& c = config_;
  for (int32_t i = 0; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
  TensorView dhidden;
  if (c.last_stage()) {
    expect_count("gpt backward grad outputs", num_grad_outputs, 1);
    dhidden = loss_backward(ctx, grad_outputs, num_grad_outputs);
  } else {
    expect_count("gpt backward grad outputs", num_grad_outputs, 3);
    dhidden = grad_outputs[2];
    expect(dhidden, {-1, -1, c.hidden_size}, c.params_dtype, "gpt stage output gradient");
  }
  // Each gradient is handed back once the module below has consumed it (the caller's own
  // gradient of a stage's output stays the caller's).
  bool owned = c.last_stage();
  for (size_t i = layers_.size(); i-- > 0;) {
    TensorView below = call_backward(*layers_[i], ctx, {dhidden}, 3, "decoder layer")[0];
    if (owned) release(ctx, dhidden);
    dhidden = below;
    owned = true;
  }
  if (c.first_stage()) {
    call_backward(*embedding_, ctx, {dhidden}, 0, "embedding");
    if (owned) release(ctx, dhidden);
  } else {
    expect_count("gpt backward grad inputs", num_grad_inputs, 6);
    grad_inputs[5] = dhidden;  // a stage's input gradient, the caller's to release
  }
}

TensorView GptModel::loss_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                                   int32_t num_grad_outputs) {
  TensorView logits = load(ctx, this, kLogits), dlogits = load(ctx, this, kDlogits);
  const TensorView& dloss = grad_outputs[0];
  if (dloss.data == nullptr || dloss.dtype != DType::kF32 || numel(dloss) != 1)
    fail(Code::kInvalidArgument, "gpt backward: grad_outputs[0] must be the f32 scalar d(loss)");
  if (present(dlogits)) {  // computed by the forward with the context's loss_grad
    const TensorView* seed = loss_grad_of(ctx);
    if (seed == nullptr || seed->data != dloss.data)
      fail(Code::kInvalidArgument,
           "gpt backward: the forward computed the logits' gradient from the context's "
           "loss_grad(), but grad_outputs[0] is another tensor; pass loss_grad() itself "
           "(IForwardContext::loss_grad), or pin cross_entropy_fwd_bwd to \"none\" "
           "(/kernels/pin)");
  } else {
    TensorView labels = load(ctx, this, kLabels);
    TensorView mask = load(ctx, this, kMask), lse = load(ctx, this, kLse);
    int64_t n = logits.shape[0] * logits.shape[1], v = logits.shape[2];
    dlogits = allocate_like(ctx, logits);
    std::initializer_list<TensorView> loss_inputs = {
        rows(logits, v), reshape(labels, {n}), present(mask) ? reshape(mask, {n}) : mask, lse,
        make_view(dloss.data, DType::kF32, {1}, dloss.device)};
    // This rank's columns (padding: gradient 0), with the lse of the whole vocabulary.
    loss_bwd_(loss_inputs, {rows(dlogits, v)},
              ops::CrossEntropyShardAttrs{tp_.rank() * v, config_.vocab_size});
  }
  int64_t b = dlogits.shape[0], t = dlogits.shape[1], v = dlogits.shape[2];
  if (num_grad_outputs > 1 && present(grad_outputs[1])) {
    expect(grad_outputs[1], {b, t, v}, config_.params_dtype, "gpt logits gradient");
    add_({dlogits, grad_outputs[1]}, {dlogits});
  }
  // The logits (B, T, V), often the largest activation, are not needed any more.
  drop_saved(ctx, this);
  // Multi-token prediction accumulates into the output weight's and the word table's
  // gradients: before the output layer's backward (whose grads_ready follows it).
  TensorView dmtp =
      mtp_ != nullptr && ctx.training() ? call_backward(*mtp_, ctx, {}, 1, "mtp")[0] : empty_view();
  TensorView dhidden = call_backward(*output_layer_, ctx, {dlogits}, 1, "output_layer")[0];
  release(ctx, dlogits);
  if (present(dmtp)) {  // d h^0: the final norm's output feeds the first depth too
    add_({dhidden, dmtp}, {dhidden});
    release(ctx, dmtp);
  }
  TensorView below = call_backward(*final_norm_, ctx, {dhidden}, 1, "final_layernorm")[0];
  release(ctx, dhidden);
  return below;
}

}  // namespace loom::transformer
