#include "plugins/transformer/mla_attention.h"

#include <cmath>
#include <string>

namespace loom::transformer {
namespace {

enum Slot : int32_t { kInput, kPositions, kQLatent, kKvLatent, kCoreOut };

std::string str(int64_t v) { return std::to_string(v); }

// dW (out, in) (+)= dY^T X, overwritten by the step's first write (beta 0, grad_write_beta);
// dX (N, in) (+)= dY W (the forward GEMMs go through Linear).
ops::GemmAttrs weight_grad(float beta) { return ops::GemmAttrs{1, 0, 1.f, beta}; }
constexpr ops::GemmAttrs kInputGrad{0, 0, 1.f, 0.f};
constexpr ops::GemmAttrs kInputGradAdd{0, 0, 1.f, 1.f};

}  // namespace

MlaDims MlaDims::from_json(const nlohmann::json& node) {
  MlaDims d;
  auto get = [&](const char* key, int64_t min) {
    if (!node.contains(key) || !node[key].is_number_integer())
      invalid(std::string("/multi_latent_attention/") + key + ": an integer is required");
    int64_t v = node[key].get<int64_t>();
    if (v < min)
      invalid(std::string("/multi_latent_attention/") + key + ": must be >= " + str(min) +
              ", got " + str(v));
    return v;
  };
  if (node.contains("q_lora_rank") && !node["q_lora_rank"].is_null())
    d.q_lora_rank = get("q_lora_rank", 1);
  d.kv_lora_rank = get("kv_lora_rank", 1);
  d.nope_dim = get("qk_head_dim", 1);
  d.rope_dim = get("qk_pos_emb_head_dim", 2);
  d.v_dim = get("v_head_dim", 1);
  if (d.rope_dim % 2 != 0)
    invalid("/multi_latent_attention/qk_pos_emb_head_dim: " + str(d.rope_dim) +
            " must be even (rope rotates pairs)");
  if (d.v_dim > d.qk_dim())
    invalid("/multi_latent_attention/v_head_dim: " + str(d.v_dim) +
            " exceeds qk_head_dim + qk_pos_emb_head_dim = " + str(d.qk_dim()) +
            " (v is padded to the query/key head dim for the attention core)");
  return d;
}

MlaSelfAttention::MlaSelfAttention(const nlohmann::json& options, IBuildContext& ctx,
                                   const TensorParallel& tp)
    : host_(ctx.host()),
      dims_(MlaDims::from_json(options.at("multi_latent_attention"))),
      hidden_(inherited<int64_t>(options, "hidden_size", "mla")),
      heads_(inherited<int64_t>(options, "num_attention_heads", "mla")),
      local_heads_(tp.split(heads_, "/num_attention_heads")),
      dtype_(params_dtype(options)),
      device_(device_of(options)),
      linear_(*ctx.host(), device_, dtype_) {
  IHost& host = *ctx.host();
  const MlaDims& d = dims_;
  const int32_t p = tp.size();
  const double init_std = inherited<double>(options, "init_std", "mla");
  const int64_t layers = inherited<int64_t>(options, "num_layers", "mla");
  const float std_in = static_cast<float>(init_std);
  const float std_out = static_cast<float>(init_std / std::sqrt(2.0 * static_cast<double>(layers)));
  // Replicated over tp, gradients partial per rank (each rank's heads): summed over the group.
  const uint32_t summed = kParamSequenceParallel;
  // Every projection's weight gradient is written whole by this module's backward, which
  // asks the context first whether it is the step's first write (kParamGradOverwrite).
  constexpr uint32_t kOverwrite = kParamGradOverwrite;
  if (d.q_lora_rank > 0) {
    q_down_ = add_param(
        "linear_q_down_proj.weight", dtype_,
        ParamSpec{{d.q_lora_rank, hidden_}, -1, summed | kOverwrite, ParamInit::kNormal, std_in});
    q_up_ = add_param(
        "linear_q_up_proj.weight", dtype_,
        ParamSpec{
            {heads_ * d.qk_dim(), d.q_lora_rank}, 0, kOverwrite, ParamInit::kNormal, std_in, p});
  } else {
    q_proj_ = add_param(
        "linear_q_proj.weight", dtype_,
        ParamSpec{{heads_ * d.qk_dim(), hidden_}, 0, kOverwrite, ParamInit::kNormal, std_in, p});
  }
  kv_down_ = add_param("linear_kv_down_proj.weight", dtype_,
                       ParamSpec{{d.kv_lora_rank + d.rope_dim, hidden_},
                                 -1,
                                 summed | kOverwrite,
                                 ParamInit::kNormal,
                                 std_in});
  kv_up_ = add_param("linear_kv_up_proj.weight", dtype_,
                     ParamSpec{{heads_ * (d.nope_dim + d.v_dim), d.kv_lora_rank},
                               0,
                               kOverwrite,
                               ParamInit::kNormal,
                               std_in,
                               p});
  out_proj_ = add_param(
      "linear_proj.weight", dtype_,
      ParamSpec{{hidden_, heads_ * d.v_dim}, 1, kOverwrite, ParamInit::kScaledNormal, std_out, p});

  nlohmann::json common = {{"params_dtype", dtype_name(dtype_)},
                           {"device", device_name(device_)},
                           {"sequence_parallel", true}};  // the summed flag on their weights
  nlohmann::json core = common;
  core["sequence_parallel"] = tp.sequence_parallel();
  core["num_attention_heads"] = local_heads_;
  core["num_query_groups"] = local_heads_;
  core["kv_channels"] = d.qk_dim();
  core["attention_dropout"] = inherited_or<double>(options, "attention_dropout", 0.0);
  core["cp_comm_type"] = inherited_or<std::string>(options, "cp_comm_type", "p2p");
  add_child("core_attention", core_ = build_child<IAttention>(ctx, "attention", core));
  if (d.q_lora_rank > 0) {
    nlohmann::json norm = common;
    norm["hidden_size"] = d.q_lora_rank;
    add_child("q_layernorm", q_norm_ = build_child<INorm>(ctx, "norm", norm));
  }
  nlohmann::json kv_norm = common;
  kv_norm["hidden_size"] = d.kv_lora_rank;
  add_child("kv_layernorm", kv_norm_ = build_child<INorm>(ctx, "norm", kv_norm));

  if (inherited_or<std::string>(options, "position_embedding", "learned") != "rope")
    invalid("/multi_latent_attention: needs position_embedding rope (its decoupled rotary "
            "query and key parts); set /position_embedding to rope");
  {
    nlohmann::json rotary = inherited_or(options, "rotary", nlohmann::json::object());
    inv_freq_ = std::make_unique<RotaryTable>(
        host, device_, rotary_inv_freq(rotary, static_cast<int32_t>(d.rope_dim)));
    rope_fwd_ = Kernel(host, ops::kRopeFwd, device_, dtype_);
    rope_bwd_ = Kernel(host, ops::kRopeBwd, device_, dtype_);
    // YaRN's factor on all of Q and K: m^2 on the logits (DeepSeek's softmax scale).
    rope_mscale_ = static_cast<float>(rotary_attention_factor(
        rotary, static_cast<int32_t>(d.qk_dim()), d.qk_dim()));
    if (rope_mscale_ != 1.0f) scale_ = Kernel(host, ops::kScale, device_, dtype_);
  }
  gemm_ = Kernel(host, ops::kGemm, device_, dtype_);
  qkv_ = Kernel(host, ops::kMlaQkv, device_, dtype_);
  qkv_bwd_ = Kernel(host, ops::kMlaQkvBwd, device_, dtype_);
  out_ = Kernel(host, ops::kMlaOut, device_, dtype_);
  out_bwd_ = Kernel(host, ops::kMlaOutBwd, device_, dtype_);
}

ops::MlaAttrs MlaSelfAttention::attrs() const {
  return ops::MlaAttrs{static_cast<int32_t>(dims_.nope_dim), static_cast<int32_t>(dims_.rope_dim),
                       static_cast<int32_t>(dims_.v_dim)};
}

void MlaSelfAttention::run_forward(IForwardContext& ctx, const TensorView* inputs,
                                   int32_t num_inputs, TensorView* outputs, int32_t num_outputs) {
  expect_count("mla forward inputs", num_inputs, 1);
  expect_count("mla forward outputs", num_outputs, 1);
  const TensorView& x = inputs[0];  // (B, T, C), the whole sequence
  expect(x, {-1, -1, hidden_}, dtype_, "mla input");
  const TensorView positions = num_inputs > 1 ? inputs[1] : empty_view();
  const TensorView segments = num_inputs > 2 ? inputs[2] : empty_view();
  const MlaDims& d = dims_;
  const int64_t b = x.shape[0], t = x.shape[1], h = local_heads_, n = b * t;
  const TensorView xr = rows(x, hidden_);

  // Queries (B, T, H, dn + dr).
  TensorView q = allocate(ctx, dtype_, {b, t, h, d.qk_dim()}, device_);
  TensorView q_latent = empty_view();
  if (d.q_lora_rank > 0) {
    TensorView cq = allocate(ctx, dtype_, {n, d.q_lora_rank}, device_);
    linear_.forward(xr, value(q_down_), empty_view(), cq);
    q_latent = call_forward(*q_norm_, ctx, {cq}, 1, "q_layernorm")[0];
    release(ctx, cq);
    linear_.forward(q_latent, value(q_up_), empty_view(), rows(q, h * d.qk_dim()));
  } else {
    linear_.forward(xr, value(q_proj_), empty_view(), rows(q, h * d.qk_dim()));
  }
  // The latent c_kv and the shared rotary key k_pe: two row blocks of linear_kv_down_proj.
  const TensorView w_down = value(kv_down_);
  const TensorView w_ckv = make_view(w_down.data, dtype_, {d.kv_lora_rank, hidden_}, device_);
  TensorView ckv = allocate(ctx, dtype_, {n, d.kv_lora_rank}, device_);
  linear_.forward(xr, w_ckv, empty_view(), ckv);
  TensorView kpe = allocate(ctx, dtype_, {b, t, d.rope_dim}, device_);
  const TensorView w_kpe =
      make_view(static_cast<char*>(w_down.data) +
                    d.kv_lora_rank * hidden_ * static_cast<int64_t>(dtype_size(dtype_)),
                dtype_, {d.rope_dim, hidden_}, device_);
  linear_.forward(xr, w_kpe, empty_view(), rows(kpe, d.rope_dim));
  TensorView kv_latent = call_forward(*kv_norm_, ctx, {ckv}, 1, "kv_layernorm")[0];
  release(ctx, ckv);
  TensorView kv = allocate(ctx, dtype_, {b, t, h, d.nope_dim + d.v_dim}, device_);
  linear_.forward(kv_latent, value(kv_up_), empty_view(), rows(kv, h * (d.nope_dim + d.v_dim)));

  const int64_t dq = d.qk_dim();
  const ops::RopeAttrs rope{static_cast<int32_t>(d.rope_dim)};
  const TensorView kpe4 = reshape(kpe, {b, t, 1, d.rope_dim});  // one rotary key per token
  rope_fwd_({kpe4, positions, inv_freq_->view()}, {kpe4}, rope);
  TensorView qh = allocate(ctx, dtype_, {b, t, h, dq}, device_);
  TensorView kh = allocate(ctx, dtype_, {b, t, h, dq}, device_);
  TensorView vh = allocate(ctx, dtype_, {b, t, h, dq}, device_);
  qkv_({q, kv, kpe}, {qh, kh, vh}, attrs());
  release_all(ctx, {q, kv});
  rope_fwd_({qh, positions, inv_freq_->view()}, {qh}, rope);  // the rotary part comes first
  TensorView k_all = kh, v_all = vh;
  if (IKvCache* cache = kv_cache_of(ctx)) {
    // Decoding caches the two latents of each position (kv_lora_rank + qk_pos_emb_head_dim
    // values, shared by the heads) and expands every cached position's keys and values again.
    if (ctx.training())
      fail(Code::kFailedPrecondition, "mla: a kv cache is for inference; this pass is training");
    if (present(segments))
      fail(Code::kInvalidArgument,
           "mla: segment ids (packed documents) cannot be combined with a kv cache");
    if (!present(positions) && cache->past_length() > 0)
      fail(Code::kInvalidArgument,
           "mla: decoding after cached positions needs position ids for the new tokens");
    TensorView latent_all{}, kpe_all{};
    const TensorView latent4 = reshape(kv_latent, {b, t, 1, d.kv_lora_rank});
    throw_if_error(cache->append(this, &latent4, &kpe4, &latent_all, &kpe_all), "mla kv cache");
    const int64_t s_len = latent_all.shape[1];
    TensorView kv_all = allocate(ctx, dtype_, {b, s_len, h, d.nope_dim + d.v_dim}, device_);
    linear_.forward(rows(latent_all, d.kv_lora_rank), value(kv_up_), empty_view(),
                    rows(kv_all, h * (d.nope_dim + d.v_dim)));
    TensorView q_unused = allocate(ctx, dtype_, {b, s_len, h, dq}, device_);
    throw_if_error(host_->fill_zero(device_, q_unused.data, nbytes(q_unused)), "mla");
    TensorView q_out = allocate(ctx, dtype_, {b, s_len, h, dq}, device_);
    k_all = allocate(ctx, dtype_, {b, s_len, h, dq}, device_);
    v_all = allocate(ctx, dtype_, {b, s_len, h, dq}, device_);
    qkv_({q_unused, kv_all, reshape(kpe_all, {b, s_len, d.rope_dim})}, {q_out, k_all, v_all},
         attrs());
    release_all(ctx, {kv_all, q_unused, q_out});
  }
  release(ctx, kpe);
  if (rope_mscale_ != 1.0f) {  // YaRN's factor on all of q and k
    scale_({qh}, {qh}, ops::ScaleAttrs{rope_mscale_});
    scale_({k_all}, {k_all}, ops::ScaleAttrs{rope_mscale_});
  }
  TensorView core_out =
      call_forward(*core_, ctx, {qh, k_all, v_all, segments, empty_view()}, 1, "attention")[0];
  TensorView ov = allocate(ctx, dtype_, {b, t, h, d.v_dim}, device_);
  out_({core_out}, {ov}, attrs());
  release(ctx, core_out);
  TensorView y = allocate(ctx, dtype_, {b, t, hidden_}, device_);
  linear_.forward(rows(ov, h * d.v_dim), value(out_proj_), empty_view(), rows(y, hidden_));
  if (ctx.training()) {
    save(ctx, this, kInput, x);
    save(ctx, this, kPositions, positions);
    save(ctx, this, kQLatent, q_latent);
    save(ctx, this, kKvLatent, kv_latent);
    save(ctx, this, kCoreOut, ov);
  }
  release_all(ctx, {q_latent, kv_latent, qh, kh, vh, k_all, v_all, ov}, {x});
  outputs[0] = y;
}

void MlaSelfAttention::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                                    int32_t num_grad_outputs, TensorView* grad_inputs,
                                    int32_t num_grad_inputs) {
  expect_count("mla backward grad outputs", num_grad_outputs, 1);
  expect_count("mla backward grad inputs", num_grad_inputs, 1);
  const MlaDims& d = dims_;
  TensorView x = load(ctx, this, kInput), positions = load(ctx, this, kPositions);
  TensorView q_latent = load(ctx, this, kQLatent), kv_latent = load(ctx, this, kKvLatent);
  TensorView ov = load(ctx, this, kCoreOut);
  const int64_t b = x.shape[0], t = x.shape[1], h = local_heads_, n = b * t, dq = d.qk_dim();
  const TensorView& dy = grad_outputs[0];
  expect(dy, {b, t, hidden_}, dtype_, "mla grad output");
  const TensorView xr = rows(x, hidden_);

  // out = ov Wo^T
  TensorView dov = allocate(ctx, dtype_, {b, t, h, d.v_dim}, device_);
  linear_.backward(rows(dy, hidden_), rows(ov, h * d.v_dim), value(out_proj_), grad(out_proj_),
                   empty_view(), rows(dov, h * d.v_dim), grad_write_beta(ctx, grad(out_proj_)));
  TensorView dcore = allocate(ctx, dtype_, {b, t, h, dq}, device_);
  out_bwd_({dov}, {dcore}, attrs());
  release(ctx, dov);
  std::vector<TensorView> dqkv = call_backward(*core_, ctx, {dcore}, 3, "attention");
  release(ctx, dcore);
  const ops::RopeAttrs rope{static_cast<int32_t>(d.rope_dim)};
  if (rope_mscale_ != 1.0f) {
    scale_({dqkv[0]}, {dqkv[0]}, ops::ScaleAttrs{rope_mscale_});
    scale_({dqkv[1]}, {dqkv[1]}, ops::ScaleAttrs{rope_mscale_});
  }
  rope_bwd_({dqkv[0], positions, inv_freq_->view()}, {dqkv[0]}, rope);
  TensorView dq_t = allocate(ctx, dtype_, {b, t, h, dq}, device_);
  TensorView dkv = allocate(ctx, dtype_, {b, t, h, d.nope_dim + d.v_dim}, device_);
  TensorView dkpe = allocate(ctx, dtype_, {b, t, d.rope_dim}, device_);
  qkv_bwd_({dqkv[0], dqkv[1], dqkv[2]}, {dq_t, dkv, dkpe}, attrs());
  const TensorView dkpe4 = reshape(dkpe, {b, t, 1, d.rope_dim});  // before the rotation
  rope_bwd_({dkpe4, positions, inv_freq_->view()}, {dkpe4}, rope);
  release_all(ctx, {dqkv[0], dqkv[1], dqkv[2]});

  // kv = RMSNorm_kv(c_kv) Wukv^T; [c_kv ; k_pe] = x Wdkv^T
  TensorView dkv_latent = allocate(ctx, dtype_, {n, d.kv_lora_rank}, device_);
  linear_.backward(rows(dkv, h * (d.nope_dim + d.v_dim)), kv_latent, value(kv_up_), grad(kv_up_),
                   empty_view(), dkv_latent, grad_write_beta(ctx, grad(kv_up_)));
  TensorView dckv = call_backward(*kv_norm_, ctx, {dkv_latent}, 1, "kv_layernorm")[0];
  const TensorView w_down = value(kv_down_), g_down = grad(kv_down_);
  const size_t elem = dtype_size(dtype_);
  const TensorView w_ckv = make_view(w_down.data, dtype_, {d.kv_lora_rank, hidden_}, device_);
  const TensorView g_ckv = make_view(g_down.data, DType::kF32, {d.kv_lora_rank, hidden_}, device_);
  TensorView dx = allocate(ctx, dtype_, {b, t, hidden_}, device_);
  const TensorView dxr = rows(dx, hidden_);
  // Two GEMMs write the two row blocks of Wdkv's gradient: one answer for both.
  const float down_beta = grad_write_beta(ctx, g_down);
  gemm_({dckv, xr}, {g_ckv}, weight_grad(down_beta));
  gemm_({dckv, w_ckv}, {dxr}, kInputGrad);
  const int64_t offset = d.kv_lora_rank * hidden_;
  const TensorView w_kpe = make_view(static_cast<char*>(w_down.data) + offset * elem, dtype_,
                                     {d.rope_dim, hidden_}, device_);
  const TensorView g_kpe = make_view(static_cast<float*>(g_down.data) + offset, DType::kF32,
                                     {d.rope_dim, hidden_}, device_);
  gemm_({rows(dkpe, d.rope_dim), xr}, {g_kpe}, weight_grad(down_beta));
  gemm_({rows(dkpe, d.rope_dim), w_kpe}, {dxr}, kInputGradAdd);
  release_all(ctx, {dkv, dkpe, dkv_latent, dckv});

  // q = (RMSNorm_q(x Wdq^T)) Wuq^T, or x Wq^T
  const TensorView dqr = rows(dq_t, h * dq);
  if (d.q_lora_rank > 0) {
    TensorView dq_latent = allocate(ctx, dtype_, {n, d.q_lora_rank}, device_);
    linear_.backward(dqr, q_latent, value(q_up_), grad(q_up_), empty_view(), dq_latent,
                     grad_write_beta(ctx, grad(q_up_)));
    TensorView dcq = call_backward(*q_norm_, ctx, {dq_latent}, 1, "q_layernorm")[0];
    gemm_({dcq, xr}, {grad(q_down_)}, weight_grad(grad_write_beta(ctx, grad(q_down_))));
    gemm_({dcq, value(q_down_)}, {dxr}, kInputGradAdd);
    release_all(ctx, {dq_latent, dcq});
  } else {
    gemm_({dqr, xr}, {grad(q_proj_)}, weight_grad(grad_write_beta(ctx, grad(q_proj_))));
    gemm_({dqr, value(q_proj_)}, {dxr}, kInputGradAdd);
  }
  release(ctx, dq_t);
  grad_inputs[0] = dx;
  for (int32_t i = 1; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
}

}  // namespace loom::transformer
