#include "plugins/transformer/transformer_layer.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {

enum Slot : int32_t {
  kInput,
  kPositions,
  kSegments,
  kNormed,
  kCoreOut,
  kQkvFp8 = 16,  // Linear's FP8 operands of the QKV and output projections
  kProjFp8 = kQkvFp8 + Linear::kSiteSlots,
};
enum Stream : uint64_t { kAttentionOutDropout = 1, kMlpOutDropout = 2 };

}  // namespace

TransformerLayer::TransformerLayer(const nlohmann::json& options, IBuildContext& ctx)
    : hidden_(inherited<int64_t>(options, "hidden_size", "transformer_layer")),
      heads_(inherited<int64_t>(options, "num_attention_heads", "transformer_layer")),
      groups_(inherited_or<int64_t>(options, "num_query_groups", heads_)),
      head_dim_(inherited_or<int64_t>(options, "kv_channels", heads_ > 0 ? hidden_ / heads_ : 0)),
      tp_(*ctx.host(), device_of(options), params_dtype(options),
          inherited_or<bool>(options, "sequence_parallel", false)),
      local_heads_(0),
      local_groups_(0),
      qkv_bias_(
          inherited_or<bool>(options, "add_qkv_bias",
                             inherited<bool>(options, "add_bias_linear", "transformer_layer"))),
      proj_bias_(inherited<bool>(options, "add_bias_linear", "transformer_layer")),
      qk_layernorm_(inherited_or<bool>(options, "qk_layernorm", false)),
      has_attention_(inherited_or<bool>(options, "has_attention", true)),
      has_mlp_(inherited_or<bool>(options, "has_mlp", true)),
      hidden_dropout_(inherited_or<float>(options, "hidden_dropout", 0.f)),
      dtype_(params_dtype(options)),
      device_(device_of(options)),
      linear_(*ctx.host(), device_, dtype_) {
  // The model validates all of this first with spec pointers; a layer built on its own
  // (tests, other models) still gets a clear message.
  if (hidden_ < 1) invalid("/hidden_size: must be >= 1");
  if (heads_ < 1) invalid("/num_attention_heads: must be >= 1");
  if (groups_ < 1 || heads_ % groups_ != 0)
    invalid("/num_query_groups: " + std::to_string(groups_) +
            " does not divide num_attention_heads " + std::to_string(heads_));
  if (head_dim_ < 1)
    invalid(
        "/kv_channels: the head dimension must be >= 1 (hidden_size / num_attention_heads "
        "when not set)");
  if (!(hidden_dropout_ >= 0.f && hidden_dropout_ < 1.f))
    invalid("/hidden_dropout: must be in [0, 1)");
  if (!has_attention_ && !has_mlp_)
    invalid("/has_attention: a transformer layer needs its attention, its MLP or both");
  const nlohmann::json mla = inherited_or(options, "multi_latent_attention", nlohmann::json());
  const bool use_mla = has_attention_ && mla.is_object();
  if (use_mla) {
    if (qk_layernorm_)
      invalid("/qk_layernorm: multi-latent attention normalises its latents instead; turn it off");
    if (qkv_bias_)
      invalid("/add_qkv_bias: multi-latent attention has no q/k/v biases; set it false");
    if (groups_ != heads_)
      invalid(
          "/num_query_groups: multi-latent attention has one key and value per head; "
          "leave num_query_groups unset (it cannot be combined with grouped-query attention)");
  }
  // Each tensor-parallel rank holds whole query groups (with their heads).
  local_groups_ = tp_.split(groups_, "/num_query_groups");
  local_heads_ = tp_.split(heads_, "/num_attention_heads");
  double init_std = inherited<double>(options, "init_std", "transformer_layer");
  int64_t layers = inherited<int64_t>(options, "num_layers", "transformer_layer");
  if (layers < 1) invalid("/num_layers: must be >= 1");
  float out_std = static_cast<float>(init_std / std::sqrt(2.0 * static_cast<double>(layers)));

  IHost& host = *ctx.host();
  cp_rank_ = group(host, ParallelRole::kContext).rank();
  cp_size_ = group(host, ParallelRole::kContext).size();
  if (!use_mla && inherited_or<std::string>(options, "position_embedding", "learned") == "rope") {
    nlohmann::json rotary = inherited_or(options, "rotary", nlohmann::json::object());
    rotary_dim_ = rotary_dim(rotary, head_dim_);
    inv_freq_ = std::make_unique<RotaryTable>(host, device_, rotary_inv_freq(rotary, rotary_dim_));
    rope_fwd_ = Kernel(host, ops::kRopeFwd, device_, dtype_);
    rope_bwd_ = Kernel(host, ops::kRopeBwd, device_, dtype_);
    rope_mscale_ = static_cast<float>(rotary_attention_factor(rotary, rotary_dim_, head_dim_));
    if (rope_mscale_ != 1.0f) rope_scale_ = Kernel(host, ops::kScale, device_, dtype_);
  }

  int64_t qkv_out = (heads_ + 2 * groups_) * head_dim_;
  int32_t p = tp_.size();
  uint32_t sp_flag = tp_.sequence_parallel() ? kParamSequenceParallel : kParamNone;
  if (has_attention_ && use_mla) {
    if (proj_bias_)
      proj_bias_index_ = add_param(
          "self_attention.linear_proj.bias", dtype_,
          ParamSpec{{hidden_}, -1, kParamNoWeightDecay | sp_flag, ParamInit::kZeros, 0.f});
  } else if (has_attention_) {
    // The projections' weight gradients are written by their Linear sites alone, which ask
    // the context before each write (kParamGradOverwrite).
    qkv_weight_ = add_param("self_attention.linear_qkv.weight", dtype_,
                            ParamSpec{{qkv_out, hidden_},
                                      0,
                                      kParamGradOverwrite,
                                      ParamInit::kNormal,
                                      static_cast<float>(init_std),
                                      p});
    if (qkv_bias_)
      qkv_bias_index_ =
          add_param("self_attention.linear_qkv.bias", dtype_,
                    ParamSpec{{qkv_out}, 0, kParamNoWeightDecay, ParamInit::kZeros, 0.f, p});
    proj_weight_ = add_param("self_attention.linear_proj.weight", dtype_,
                             ParamSpec{{hidden_, heads_ * head_dim_},
                                       1,
                                       kParamGradOverwrite,
                                       ParamInit::kScaledNormal,
                                       out_std,
                                       p});
    if (proj_bias_)
      proj_bias_index_ = add_param(
          "self_attention.linear_proj.bias", dtype_,
          ParamSpec{{hidden_}, -1, kParamNoWeightDecay | sp_flag, ParamInit::kZeros, 0.f});
  }

  // What each child needs of the model's configuration.
  nlohmann::json common = {{"params_dtype", dtype_name(dtype_)}, {"device", device_name(device_)}};
  common["sequence_parallel"] = tp_.sequence_parallel();
  nlohmann::json norm = common;
  norm["hidden_size"] = hidden_;
  nlohmann::json core = common;
  core["num_attention_heads"] = local_heads_;  // the core sees this rank's heads only
  core["num_query_groups"] = local_groups_;
  core["kv_channels"] = head_dim_;
  core["attention_dropout"] = inherited_or<double>(options, "attention_dropout", 0.0);
  core["cp_comm_type"] = inherited_or<std::string>(options, "cp_comm_type", "p2p");
  nlohmann::json mlp = common;
  mlp["hidden_size"] = hidden_;
  mlp["ffn_hidden_size"] = inherited_or<int64_t>(options, "ffn_hidden_size", 4 * hidden_);
  mlp["add_bias_linear"] = proj_bias_;
  mlp["init_std"] = init_std;
  mlp["num_layers"] = layers;
  mlp["fp8"] = inherited_or<bool>(options, "fp8", true);
  mlp["layer_number"] = inherited_or<int64_t>(options, "layer_number", 1);
  if (has_attention_) {
    add_child("input_layernorm", input_norm_ = build_child<INorm>(ctx, "norm", norm));
    if (use_mla) {
      mla_ = new MlaSelfAttention(options, ctx, tp_);
      add_child("self_attention", mla_);
    } else {
      add_child("self_attention.core_attention",
                core_ = build_child<IAttention>(ctx, "attention", core));
    }
  }
  if (has_attention_ && !use_mla && qk_layernorm_) {
    // Rows of D: one norm per head, one weight for all heads. Each tp rank sees only its
    // heads, so the weight's gradient is partial there: the sequence-parallel flag makes the
    // core sum it over the tp group (as it does a norm's on sequence shards).
    nlohmann::json head_norm = norm;
    head_norm["hidden_size"] = head_dim_;
    head_norm["sequence_parallel"] = true;
    add_child("self_attention.q_layernorm", q_norm_ = build_child<INorm>(ctx, "norm", head_norm));
    add_child("self_attention.k_layernorm", k_norm_ = build_child<INorm>(ctx, "norm", head_norm));
  }
  if (has_mlp_) {
    add_child("pre_mlp_layernorm", pre_mlp_norm_ = build_child<INorm>(ctx, "norm", norm));
    // The model's moe_layer_freq picks the node's "mlp" or its "dense_mlp" for this layer.
    const bool moe_layer = inherited_or<bool>(options, "moe_layer", true);
    add_child("mlp", mlp_ = build_child<IMlp>(ctx, moe_layer ? "mlp" : "dense_mlp", mlp));
  }

  // norm 1.2 takes the residual add (loom/kinds/model.h); an older norm would ignore it.
  auto fuses = [](IModule* norm) { return norm != nullptr && norm->interface_info().minor >= 2; };
  fused_input_norm_ = fuses(input_norm_);
  fused_pre_mlp_norm_ = fuses(pre_mlp_norm_);
  // attention 1.2 reads q, k, v as views of the QKV projection's output (MHA): no split
  // copy before it, and its gradients come back as views of one tensor, no merge after.
  // rope turns the views in place (its rows may be strided); the per-head q/k norms and
  // YaRN's scale take packed tensors, so those layers split. LOOM_QKV_VIEWS=split forces
  // the copies, to measure one against the other (tools/gpu_bundle_run.sh).
  const char* views_env = std::getenv("LOOM_QKV_VIEWS");
  const bool split_forced = views_env != nullptr && std::string(views_env) == "split";
  fused_qkv_ = core_ != nullptr && core_->interface_info().minor >= 2 &&
               local_groups_ == local_heads_ && !qk_layernorm_ && rope_mscale_ == 1.0f &&
               !split_forced;
  split_ = Kernel(host, ops::kSplitQkv, device_, dtype_);
  merge_ = Kernel(host, ops::kMergeQkv, device_, dtype_);
  add_ = Kernel(host, ops::kAdd, device_, dtype_);
  dropout_fwd_ = Kernel(host, ops::kDropoutFwd, device_, dtype_);
  dropout_bwd_ = Kernel(host, ops::kDropoutBwd, device_, dtype_);
  if (inherited_or<bool>(options, "fp8", true)) {  // FP8 GEMMs when the run has a recipe
    linear_.enable_fp8(ctx, {this, kQkvFp8});
    linear_.enable_fp8(ctx, {this, kProjFp8});
  }
  // rope_fp8_bwd turns q and k back straight from the core's gradients: no q/k norms or YaRN
  // scale in between, and no QKV bias (its gradient needs the tensor in the module's dtype).
  if (inv_freq_ && !qk_layernorm_ && rope_mscale_ == 1.0f && !qkv_bias_ &&
      linear_.fp8({this, kQkvFp8}))
    rope_fp8_bwd_ = Kernel::optional(host, ops::kRopeFp8Bwd, device_, dtype_);
}

bool TransformerLayer::quantizes_rope_grad() const {
  return rope_fp8_bwd_ && linear_.fp8_produces({this, kQkvFp8});
}

void TransformerLayer::dropout_forward(IForwardContext& ctx, const TensorView& x,
                                       uint64_t purpose) const {
  if (!ctx.training() || hidden_dropout_ == 0.f) return;
  ops::DropoutAttrs attrs{hidden_dropout_, 0, 0};
  ctx.rng(this, purpose, &attrs.key, &attrs.counter);
  dropout_sequence(dropout_fwd_, attrs, x, x, tp_, cp_rank_, cp_size_);
}

TensorView TransformerLayer::dropout_backward(IForwardContext& ctx, const TensorView& dy,
                                              uint64_t purpose) const {
  if (!ctx.training() || hidden_dropout_ == 0.f) return dy;
  ops::DropoutAttrs attrs{hidden_dropout_, 0, 0};
  ctx.rng(this, purpose, &attrs.key, &attrs.counter);
  TensorView dx = allocate_like(ctx, dy);
  dropout_sequence(dropout_bwd_, attrs, dy, dx, tp_, cp_rank_, cp_size_);
  return dx;
}

void TransformerLayer::run_forward(IForwardContext& ctx, const TensorView* inputs,
                                   int32_t num_inputs, TensorView* outputs, int32_t num_outputs) {
  expect_count("transformer_layer forward inputs", num_inputs, 1);
  expect_count("transformer_layer forward outputs", num_outputs, 1);
  const TensorView& x = inputs[0];  // (B, T, C), or the sequence shard (B, T/P, C)
  expect(x, {-1, -1, hidden_}, dtype_, "transformer_layer hidden");
  int64_t t_full = tp_.full_length(x.shape[1]);
  TensorView positions = num_inputs > 1 ? inputs[1] : empty_view();
  if (present(positions))
    expect(positions, {x.shape[0], t_full}, DType::kI32, "transformer_layer position ids");
  TensorView segments = num_inputs > 2 ? inputs[2] : empty_view();
  if (present(segments))
    expect(segments, {x.shape[0], t_full}, DType::kI32, "transformer_layer segment ids");
  if (ctx.training() && ctx.recompute() == RecomputePolicy::kFull) {
    save(ctx, this, kInput, x);
    save(ctx, this, kPositions, positions);
    save(ctx, this, kSegments, segments);
    ForwardOnlyContext forward_only(ctx);
    outputs[0] = forward_impl(forward_only, x, positions, segments);
  } else {
    outputs[0] = forward_impl(ctx, x, positions, segments);
  }
}

TensorView TransformerLayer::forward_impl(IForwardContext& ctx, const TensorView& x,
                                          const TensorView& positions, const TensorView& segments) {
  TensorView residual = x, normed2 = empty_view();
  if (has_attention_) {
    TensorView attn = attention_forward(ctx, x, positions, segments);
    if (has_mlp_ && fused_pre_mlp_norm_) {  // residual = x + attn, normed2 = norm2(residual)
      std::vector<TensorView> out =
          call_forward(*pre_mlp_norm_, ctx, {x, attn}, 2, "pre_mlp_layernorm");
      normed2 = out[0];
      residual = out[1];
    } else {
      residual = allocate_like(ctx, x);  // (B, T, C)
      add_({x, attn}, {residual});
    }
    release(ctx, attn);
  }
  if (!has_mlp_) return residual;  // an attention-only layer of a hybrid pattern (*)
  if (!present(normed2))
    normed2 = call_forward(*pre_mlp_norm_, ctx, {residual}, 1, "pre_mlp_layernorm")[0];
  TensorView mlp_out = call_forward(*mlp_, ctx, {normed2}, 1, "mlp")[0];
  release(ctx, normed2);
  dropout_forward(ctx, mlp_out, kMlpOutDropout);
  TensorView y = allocate_like(ctx, x);
  add_({residual, mlp_out}, {y});
  release_all(ctx, {residual, mlp_out}, {x});
  return y;
}

TensorView TransformerLayer::attention_output(IForwardContext& ctx,
                                              const TensorView& attn_partial) {
  TensorView attn = tp_.exit(ctx, attn_partial);  // summed over the group: like x
  release_all(ctx, {attn_partial}, {attn});
  if (proj_bias_ && !proj_bias_on_gemm())
    linear_.add_bias(value(proj_bias_index_), rows(attn, hidden_));
  dropout_forward(ctx, attn, kAttentionOutDropout);
  return attn;
}

TensorView TransformerLayer::attention_forward(IForwardContext& ctx, const TensorView& x,
                                               const TensorView& positions,
                                               const TensorView& segments) {
  if (mla_ != nullptr) {  // multi-latent attention: the child holds q, k, v and the projection
    TensorView normed_shard = call_forward(*input_norm_, ctx, {x}, 1, "input_layernorm")[0];
    TensorView normed = tp_.enter(ctx, normed_shard);  // (B, T, C) on every rank
    TensorView attn_partial =
        call_forward(*mla_, ctx, {normed, positions, segments}, 1, "self_attention")[0];
    release_all(ctx, {normed_shard, normed}, {x});
    return attention_output(ctx, attn_partial);
  }
  int64_t b = x.shape[0], t = tp_.full_length(x.shape[1]);
  int64_t h = local_heads_, g = local_groups_, d = head_dim_;
  TensorView normed_shard = call_forward(*input_norm_, ctx, {x}, 1, "input_layernorm")[0];
  TensorView normed = tp_.enter(ctx, normed_shard);  // (B, T, C) on every rank
  TensorView qkv = allocate(ctx, dtype_, {b, t, g, (h / g + 2) * d}, device_);
  linear_.forward(ctx, {this, kQkvFp8}, rows(normed, hidden_), value(qkv_weight_),
                  qkv_bias_ ? value(qkv_bias_index_) : empty_view(), rows(qkv, (h + 2 * g) * d));
  IKvCache* cache = kv_cache_of(ctx);
  // q, k, v: views of qkv (fused_qkv_views), or packed copies (split_qkv).
  QkvViews views;
  const bool fused = fused_qkv_ && cache == nullptr && fused_qkv_views(qkv, &views);
  TensorView q = fused ? views.q : allocate(ctx, dtype_, {b, t, h, d}, device_);
  TensorView k = fused ? views.k : allocate(ctx, dtype_, {b, t, g, d}, device_);
  TensorView v = fused ? views.v : allocate(ctx, dtype_, {b, t, g, d}, device_);
  if (!fused) {
    split_({qkv}, {q, k, v});
    release(ctx, qkv);
  }
  if (qk_layernorm_) {  // per head over D, before rope (the norms save their inputs)
    TensorView qn = call_forward(*q_norm_, ctx, {q}, 1, "q_layernorm")[0];
    TensorView kn = call_forward(*k_norm_, ctx, {k}, 1, "k_layernorm")[0];
    release_all(ctx, {q, k});
    q = qn;
    k = kn;
  }
  if (inv_freq_) {
    ops::RopeAttrs attrs{rotary_dim_};
    rope_fwd_({q, positions, inv_freq_->view()}, {q}, attrs);
    rope_fwd_({k, positions, inv_freq_->view()}, {k}, attrs);
    if (rope_mscale_ != 1.0f) {  // m * cos, m * sin on every channel (rotary_dim == D)
      rope_scale_({q}, {q}, ops::ScaleAttrs{rope_mscale_});
      rope_scale_({k}, {k}, ops::ScaleAttrs{rope_mscale_});
    }
  }
  // Incremental decoding: attend over the cached positions plus these T (B, S, G, D).
  TensorView k_all = k, v_all = v;
  if (cache != nullptr) {
    if (ctx.training())
      fail(Code::kFailedPrecondition,
           "transformer_layer: a kv cache is for inference; this forward pass is training");
    if (present(segments))
      fail(Code::kInvalidArgument,
           "transformer_layer: segment ids (packed documents) cannot be combined with a kv "
           "cache; decode one document per sequence and pass no segment ids");
    if (!present(positions) && cache->past_length() > 0)
      fail(Code::kInvalidArgument,
           detail::concat("transformer_layer: decoding after ", cache->past_length(),
                          " cached positions needs position ids for the new tokens (",
                          cache->past_length(), " ..); pass them as the model's input [3]"));
    throw_if_error(cache->append(this, &k, &v, &k_all, &v_all), "transformer_layer kv cache");
  }
  TensorView core_out =
      call_forward(*core_, ctx, {q, k_all, v_all, segments, empty_view()}, 1, "attention")[0];
  TensorView attn_partial = allocate(ctx, dtype_, {b, t, hidden_}, device_);
  linear_.forward(ctx, {this, kProjFp8}, rows(core_out, h * d), value(proj_weight_),
                  proj_bias_on_gemm() ? value(proj_bias_index_) : empty_view(),
                  rows(attn_partial, hidden_));
  TensorView attn = attention_output(ctx, attn_partial);
  if (ctx.training()) {
    save(ctx, this, kPositions, positions);
    // An FP8 projection keeps its input's FP8 transpose instead (Linear).
    if (!linear_.fp8({this, kQkvFp8})) save(ctx, this, kNormed, normed);
    if (!linear_.fp8({this, kProjFp8})) save(ctx, this, kCoreOut, core_out);
  }
  // The saves (this layer's and its children's) keep what backward needs: normed, q, k, v,
  // core_out (in bf16 or as FP8 transposes).
  release_all(ctx, {normed_shard, normed, core_out}, {x});
  if (fused)
    release(ctx, qkv);  // the core's saves of its views keep it
  else
    release_all(ctx, {q, k, v});
  return attn;
}

void TransformerLayer::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                                    int32_t num_grad_outputs, TensorView* grad_inputs,
                                    int32_t num_grad_inputs) {
  expect_count("transformer_layer backward grad outputs", num_grad_outputs, 1);
  expect_count("transformer_layer backward grad inputs", num_grad_inputs, 1);
  if (ctx.recompute() == RecomputePolicy::kFull) {  // rerun forward, saving this time
    RerunContext rerun(ctx);
    release(ctx, forward_impl(rerun, load(ctx, this, kInput), load(ctx, this, kPositions),
                              load(ctx, this, kSegments)));
  }
  const TensorView& dy = grad_outputs[0];
  expect(dy, {-1, -1, hidden_}, dtype_, "transformer_layer grad output");
  // y = residual + dropout(mlp(norm2(residual)))   (y = residual without the MLP)
  TensorView dresidual = dy;
  if (has_mlp_) {
    TensorView dmlp_out = dropout_backward(ctx, dy, kMlpOutDropout);
    TensorView dnormed2 = call_backward(*mlp_, ctx, {dmlp_out}, 1, "mlp")[0];
    if (fused_pre_mlp_norm_) {  // dresidual = dy + d norm2 / dresidual, in the norm
      dresidual = call_backward(*pre_mlp_norm_, ctx, {dnormed2, dy}, 1, "pre_mlp_layernorm")[0];
      release_all(ctx, {dmlp_out, dnormed2}, {dy});
    } else {
      TensorView dres_norm =
          call_backward(*pre_mlp_norm_, ctx, {dnormed2}, 1, "pre_mlp_layernorm")[0];
      dresidual = allocate_like(ctx, dy);
      add_({dy, dres_norm}, {dresidual});
      release_all(ctx, {dmlp_out, dnormed2, dres_norm}, {dy});
    }
  }
  // residual = x + dropout(proj(core(q, k, v)))   (residual = x without attention)
  grad_inputs[0] = has_attention_ ? attention_backward(ctx, dresidual) : dresidual;
  if (dresidual.data != dy.data && grad_inputs[0].data != dresidual.data) release(ctx, dresidual);
  for (int32_t i = 1; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
}

TensorView TransformerLayer::attention_backward(IForwardContext& ctx, const TensorView& dresidual) {
  if (mla_ != nullptr) {
    TensorView dattn = dropout_backward(ctx, dresidual, kAttentionOutDropout);
    if (proj_bias_) linear_.bias_grad(rows(dattn, hidden_), grad(proj_bias_index_));
    TensorView dattn_full = tp_.exit_backward(ctx, dattn);  // (B, T, C)
    TensorView dnormed_partial = call_backward(*mla_, ctx, {dattn_full}, 1, "self_attention")[0];
    release_all(ctx, {dattn, dattn_full}, {dresidual});
    TensorView dnormed = tp_.enter_backward(ctx, dnormed_partial);  // like dy
    TensorView dx = input_norm_backward(ctx, dresidual, dnormed);
    release_all(ctx, {dnormed_partial, dnormed});
    return dx;
  }
  // Zero-bubble schedules: the projections' weight gradients wait for backward_weight.
  const void* deferred = weight_grads_deferred(ctx) ? deferred_owner() : nullptr;
  TensorView positions = load(ctx, this, kPositions);
  const bool qkv_fp8 = linear_.fp8({this, kQkvFp8}), proj_fp8 = linear_.fp8({this, kProjFp8});
  TensorView normed = qkv_fp8 ? empty_view() : load(ctx, this, kNormed);
  TensorView core_out = proj_fp8 ? empty_view() : load(ctx, this, kCoreOut);
  const TensorView& dy = dresidual;
  int64_t b = dy.shape[0], t = tp_.full_length(dy.shape[1]);
  int64_t h = local_heads_, g = local_groups_, d = head_dim_;
  if (present(normed)) {
    int64_t t_local = tp_.sequence_parallel() ? normed.shape[1] / tp_.size() : normed.shape[1];
    expect(dy, {normed.shape[0], t_local, hidden_}, dtype_, "transformer_layer grad output");
  }
  TensorView dattn = dropout_backward(ctx, dresidual, kAttentionOutDropout);
  if (proj_bias_ && !proj_bias_on_gemm())
    linear_.bias_grad(rows(dattn, hidden_), grad(proj_bias_index_));
  TensorView dattn_full = tp_.exit_backward(ctx, dattn);  // (B, T, C)
  TensorView dcore_out = allocate(ctx, dtype_, {b, t, h, d}, device_);
  linear_.backward(ctx, {this, kProjFp8}, rows(dattn_full, hidden_),
                   present(core_out) ? rows(core_out, h * d) : empty_view(), value(proj_weight_),
                   grad(proj_weight_), proj_bias_grad(), rows(dcore_out, h * d), deferred);
  release_all(ctx, {dattn, dattn_full}, {dresidual});
  std::vector<TensorView> dqkv3 = call_backward(*core_, ctx, {dcore_out}, 3, "attention");
  release(ctx, dcore_out);
  const bool dqkv_fp8 = quantizes_rope_grad();  // rope turned back inside the quantisation
  if (inv_freq_ && !dqkv_fp8) {
    ops::RopeAttrs attrs{rotary_dim_};
    if (rope_mscale_ != 1.0f) {  // the transpose of m * R is R^T * m
      rope_scale_({dqkv3[0]}, {dqkv3[0]}, ops::ScaleAttrs{rope_mscale_});
      rope_scale_({dqkv3[1]}, {dqkv3[1]}, ops::ScaleAttrs{rope_mscale_});
    }
    rope_bwd_({dqkv3[0], positions, inv_freq_->view()}, {dqkv3[0]}, attrs);
    rope_bwd_({dqkv3[1], positions, inv_freq_->view()}, {dqkv3[1]}, attrs);
  }
  if (qk_layernorm_) {
    TensorView dq = call_backward(*q_norm_, ctx, {dqkv3[0]}, 1, "q_layernorm")[0];
    TensorView dk = call_backward(*k_norm_, ctx, {dqkv3[1]}, 1, "k_layernorm")[0];
    release_all(ctx, {dqkv3[0], dqkv3[1]});
    dqkv3[0] = dq;
    dqkv3[1] = dk;
  }
  // The core's gradients as views of one tensor (attention 1.2) are the merged layout
  // already; else merge_qkv copies them into it.
  TensorView dqkv = fused_qkv_of(dqkv3[0], dqkv3[1], dqkv3[2]);
  if (!present(dqkv)) {
    dqkv = allocate(ctx, dtype_, {b, t, g, (h / g + 2) * d}, device_);
    merge_({dqkv3[0], dqkv3[1], dqkv3[2]}, {dqkv});
    release_all(ctx, {dqkv3[0], dqkv3[1], dqkv3[2]});
  }
  TensorView dnormed_partial =
      allocate(ctx, dtype_, {b, t, hidden_}, device_);  // this rank's heads
  if (dqkv_fp8) {
    // dqkv (B, T, G, (H/G + 2) D), q and k not yet turned back -> its FP8 codes (B T, (H + 2G) D)
    // and their transpose, as rope_bwd then the quantisation would write them.
    const Linear::Fp8Producer q = linear_.fp8_producer_or_fail(
        ctx, {this, kQkvFp8}, Fp8Role::kGradOutput, b * t, (h + 2 * g) * d, "transformer_layer");
    rope_fp8_bwd_({dqkv, positions, inv_freq_->view(), q.scale},
                  {q.operand.q, q.operand.t, q.amax, q.operand.scale_inv},
                  ops::RopeFp8Attrs{rotary_dim_, static_cast<int32_t>(d)});
    release(ctx, dqkv);  // only the codes are read from here on
    dqkv = empty_view();
    linear_.backward_fp8(ctx, {this, kQkvFp8}, q.operand, grad(qkv_weight_),
                         rows(dnormed_partial, hidden_), deferred);
  } else {
    linear_.backward(ctx, {this, kQkvFp8}, rows(dqkv, (h + 2 * g) * d),
                     present(normed) ? rows(normed, hidden_) : empty_view(), value(qkv_weight_),
                     grad(qkv_weight_), qkv_bias_ ? grad(qkv_bias_index_) : empty_view(),
                     rows(dnormed_partial, hidden_), deferred);
  }
  TensorView dnormed = tp_.enter_backward(ctx, dnormed_partial);  // like dy
  TensorView dx = input_norm_backward(ctx, dresidual, dnormed);
  release_all(ctx, {dqkv, dnormed_partial, dnormed});  // the caller's dresidual stays
  return dx;
}

TensorView TransformerLayer::input_norm_backward(IForwardContext& ctx, const TensorView& dresidual,
                                                 const TensorView& dnormed) {
  if (fused_input_norm_)  // the norm adds dresidual into its input gradient
    return call_backward(*input_norm_, ctx, {dnormed, dresidual}, 1, "input_layernorm")[0];
  TensorView dx_norm = call_backward(*input_norm_, ctx, {dnormed}, 1, "input_layernorm")[0];
  TensorView dx = allocate_like(ctx, dresidual);
  add_({dresidual, dx_norm}, {dx});
  release(ctx, dx_norm);
  return dx;
}

void TransformerLayer::run_backward_weight(IForwardContext& ctx) {
  ModuleBase::run_backward_weight(ctx);            // the children's (the MLP's GEMMs)
  if (!has_attention_ || mla_ != nullptr) return;  // MLA computes its weight gradients in backward
  linear_.backward_weight(ctx, {this, kProjFp8}, deferred_owner(), grad(proj_weight_),
                          proj_bias_grad());
  linear_.backward_weight(ctx, {this, kQkvFp8}, deferred_owner(), grad(qkv_weight_),
                          qkv_bias_ ? grad(qkv_bias_index_) : empty_view());
}

bool TransformerLayer::proj_bias_on_gemm() const {
  return proj_bias_ && tp_.size() == 1 && mla_ == nullptr;
}

TensorView TransformerLayer::proj_bias_grad() const {
  return proj_bias_on_gemm() ? grad(proj_bias_index_) : empty_view();
}

}  // namespace loom::transformer
