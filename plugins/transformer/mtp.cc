#include "plugins/transformer/mtp.h"

#include <string>

#include "plugins/transformer/toolkit.h"

namespace loom::transformer {
namespace {

// What each depth saves, at slot(depth, what).
enum Saved : int32_t { kIds, kLabels, kMask, kLogits, kLse, kOutInput, kEn, kHn, kSavedCount };
// Embedding dropout streams: kDropoutStream + depth (apart from the model's embedding's).
constexpr uint64_t kDropoutStream = 16;

// A whole tensor copied to the host (`T` of the tensor's element size).
template <class T>
std::vector<T> to_host(IHost& host, const TensorView& v) {
  std::vector<T> out(static_cast<size_t>(numel(v)));
  if (!out.empty())
    throw_if_error(host.copy(kCpu, out.data(), v.device, v.data, out.size() * sizeof(T)),
                   "mtp: reading the batch");
  return out;
}

// A new activation of ctx holding `values`, shaped `shape`.
template <class T>
TensorView upload(IForwardContext& ctx, IHost& host, DType dtype, std::vector<int64_t> shape,
                  const std::vector<T>& values, Device device) {
  TensorView v = allocate_shape(ctx, dtype, shape, device);
  if (!values.empty())
    throw_if_error(host.copy(device, v.data, kCpu, values.data(), values.size() * sizeof(T)),
                   "mtp: writing to the device");
  return v;
}

// Rows [first, first + count) of a contiguous (R, C) matrix.
TensorView row_range(const TensorView& m, int64_t first, int64_t count) {
  const int64_t c = m.shape[m.ndim - 1];
  return make_view(static_cast<char*>(m.data) + first * c * dtype_size(m.dtype), m.dtype,
                   {count, c}, m.device);
}

}  // namespace

int32_t MultiTokenPrediction::slot(int32_t j, int32_t what) { return j * kSavedCount + what; }

MultiTokenPrediction::MultiTokenPrediction(IBuildContext& ctx, const GptConfig& c,
                                           const Embedding& embedding, const OutputLayer& output)
    : config_(c),
      host_(*ctx.host()),
      embedding_(embedding),
      output_(output),
      tp_(*ctx.host(), c.device, c.params_dtype, c.sequence_parallel),
      local_vocab_(tp_.split(c.padded_vocab_size, "/vocab_size")),
      vocab_start_(tp_.rank() * local_vocab_) {
  IHost& host = *ctx.host();
  const nlohmann::json norm = {{"hidden_size", c.hidden_size},
                               {"params_dtype", dtype_name(c.params_dtype)},
                               {"device", device_name(c.device)},
                               {"sequence_parallel", tp_.sequence_parallel()}};
  for (int64_t j = 0; j < c.mtp_num_layers; ++j) {
    const std::string prefix = "layers." + std::to_string(j) + ".";
    Depth d{};
    add_child(prefix + "enorm", d.enorm = build_child<INorm>(ctx, "final_norm", norm));
    add_child(prefix + "hnorm", d.hnorm = build_child<INorm>(ctx, "final_norm", norm));
    // (2C, C) input-major: u = en @ W[0:C] + hn @ W[C:2C]. Replicated over tp; with sequence
    // parallelism each rank sees its shard of the tokens, so its gradient is partial.
    d.eh_proj = add_param(prefix + "eh_proj.weight", c.params_dtype,
                          ParamSpec{{2 * c.hidden_size, c.hidden_size},
                                    -1,
                                    tp_.sequence_parallel() ? kParamSequenceParallel : kParamNone,
                                    ParamInit::kNormal,
                                    static_cast<float>(c.init_std)});
    add_child(prefix + "transformer_layer",
              d.layer = build_child<ILayer>(ctx, "layer", c.layer_options(c.num_layers + j + 1)));
    add_child(prefix + "final_layernorm",
              d.final_norm = build_child<INorm>(ctx, "final_norm", norm));
    depths_.push_back(d);
  }
  const Device device = c.device;
  embed_fwd_ = Kernel(host, ops::kEmbeddingFwd, device, c.params_dtype);
  embed_bwd_ = Kernel(host, ops::kEmbeddingBwd, device, c.params_dtype);
  gemm_ = Kernel(host, ops::kGemm, device, c.params_dtype);
  add_ = Kernel(host, ops::kAdd, device, c.params_dtype);
  dropout_fwd_ = Kernel(host, ops::kDropoutFwd, device, c.params_dtype);
  dropout_bwd_ = Kernel(host, ops::kDropoutBwd, device, c.params_dtype);
  loss_fwd_ = Kernel(host, ops::kCrossEntropyFwd, device, c.params_dtype);
  loss_bwd_ = Kernel(host, ops::kCrossEntropyBwd, device, c.params_dtype);
  if (tp_.size() > 1) {
    shard_stats_ = Kernel(host, ops::kCrossEntropyShardStats, device, c.params_dtype);
    combine_ = Kernel(host, ops::kCrossEntropyCombine, device, DType::kF32);
  }
}

void MultiTokenPrediction::run_forward(IForwardContext& ctx, const TensorView* inputs,
                                       int32_t num_inputs, TensorView* outputs,
                                       int32_t num_outputs) {
  expect_count("mtp forward inputs", num_inputs, 6);
  expect_count("mtp forward outputs", num_outputs, 1);
  const GptConfig& c = config_;
  const TensorView &tokens = inputs[0], &labels = inputs[1], &mask = inputs[2];
  const TensorView &positions = inputs[3], &segments = inputs[4], &h0 = inputs[5];
  expect(tokens, {-1, -1}, DType::kI32, "mtp tokens");
  const int64_t b = tokens.shape[0], t = tokens.shape[1], n = b * t;
  expect(h0, {b, tp_.sequence_parallel() ? t / tp_.size() : t, c.hidden_size}, c.params_dtype,
         "mtp hidden input");
  // The batch on the host (B T ids: small), rolled there per depth.
  const std::vector<int32_t> ids = to_host<int32_t>(host_, tokens);
  const std::vector<int32_t> targets = to_host<int32_t>(host_, labels);
  const std::vector<float> weights =
      present(mask) ? to_host<float>(host_, mask) : std::vector<float>(static_cast<size_t>(n), 1.f);
  const std::vector<int32_t> docs =
      present(segments) ? to_host<int32_t>(host_, segments) : std::vector<int32_t>();
  const int32_t depths = static_cast<int32_t>(depths_.size());
  std::vector<float> losses;
  TensorView h = h0;
  for (int32_t j = 0; j < depths; ++j) {
    // Depth k = j + 1: position i takes token i + k and label i + k (t_{i+k+1}); past the
    // end (or in another document) token 0 with its loss masked.
    const int64_t k = j + 1;
    std::vector<int32_t> ids_k(static_cast<size_t>(n), 0), labels_k(static_cast<size_t>(n), 0);
    std::vector<float> mask_k(static_cast<size_t>(n), 0.f);
    for (int64_t r = 0; r < b; ++r)
      for (int64_t i = 0; i + k < t; ++i) {
        const size_t at = static_cast<size_t>(r * t + i), from = at + static_cast<size_t>(k);
        if (!docs.empty() && docs[from] != docs[at]) continue;
        ids_k[at] = ids[from];
        labels_k[at] = targets[from];
        mask_k[at] = weights[from];
      }
    TensorView ids_dev = upload(ctx, host_, DType::kI32, {b, t}, ids_k, c.device);
    TensorView labels_dev = upload(ctx, host_, DType::kI32, {b, t}, labels_k, c.device);
    TensorView mask_dev = upload(ctx, host_, DType::kF32, {b, t}, mask_k, c.device);
    TensorView next = depth_forward(ctx, j, ids_dev, positions, segments, h);
    if (j > 0) release(ctx, h);  // saved by this depth's hnorm (and the previous loss)
    h = next;
    losses.push_back(static_cast<float>(loss_forward(ctx, j, h, labels_dev, mask_dev)));
    save(ctx, this, slot(j, kIds), ids_dev);
    save(ctx, this, slot(j, kLabels), labels_dev);
    save(ctx, this, slot(j, kMask), mask_dev);
    release_all(ctx, {ids_dev, labels_dev, mask_dev});  // kept by the saves
  }
  release(ctx, h);
  double total = 0;
  for (int32_t j = 0; j < depths; ++j) {
    total += losses[static_cast<size_t>(j)];
    TensorView m = upload(ctx, host_, DType::kF32, {}, std::vector<float>{losses[j]}, c.device);
    report_metric(ctx, ("mtp/loss/depth_" + std::to_string(j + 1)).c_str(), m);
    release(ctx, m);
  }
  total *= c.mtp_loss_scaling_factor / depths;
  outputs[0] =
      upload(ctx, host_, DType::kF32, {}, std::vector<float>{static_cast<float>(total)}, c.device);
  report_metric(ctx, "mtp_loss", outputs[0], MetricReduce::kMean);
}

TensorView MultiTokenPrediction::depth_forward(IForwardContext& ctx, int32_t j,
                                               const TensorView& ids, const TensorView& positions,
                                               const TensorView& segments, const TensorView& h) {
  const GptConfig& c = config_;
  const Depth& d = depths_[static_cast<size_t>(j)];
  const int64_t b = ids.shape[0], t = ids.shape[1], cc = c.hidden_size;
  // e (B, T, C): this rank's vocabulary rows of the shared table (zeros for the others'),
  // summed over tp (reduce-scattered to the shard (B, T/P, C) with sequence parallelism).
  TensorView partial = allocate(ctx, c.params_dtype, {b, t, cc}, c.device);
  if (tp_.size() == 1 && c.padded_vocab_size == c.vocab_size)
    embed_fwd_({embedding_.word_weight(), reshape(ids, {b * t})}, {rows(partial, cc)});
  else  // this rank's rows (padding never read)
    embed_fwd_({embedding_.word_weight(), reshape(ids, {b * t})}, {rows(partial, cc)},
               ops::EmbeddingAttrs{vocab_start_, c.vocab_size});
  TensorView e = tp_.exit(ctx, partial);
  release_all(ctx, {partial}, {e});
  if (ctx.training() && c.hidden_dropout > 0) {  // the embedding's dropout, a stream per depth
    ops::DropoutAttrs attrs{static_cast<float>(c.hidden_dropout), 0, 0};
    ctx.rng(this, kDropoutStream + static_cast<uint64_t>(j), &attrs.key, &attrs.counter);
    dropout_sequence(dropout_fwd_, attrs, e, e, tp_, 0, 1);
  }
  TensorView en = call_forward(*d.enorm, ctx, {e}, 1, "mtp enorm")[0];
  release(ctx, e);
  TensorView hn = call_forward(*d.hnorm, ctx, {h}, 1, "mtp hnorm")[0];
  // u (B, Tl, C) = en @ W[0:C] + hn @ W[C:2C], W (2C, C).
  const TensorView& w = value(d.eh_proj);
  TensorView u = allocate_like(ctx, hn);
  gemm_({rows(en, cc), row_range(w, 0, cc)}, {rows(u, cc)}, ops::GemmAttrs{0, 0, 1.f, 0.f});
  gemm_({rows(hn, cc), row_range(w, cc, cc)}, {rows(u, cc)}, ops::GemmAttrs{0, 0, 1.f, 1.f});
  if (ctx.training()) {
    save(ctx, this, slot(j, kEn), en);
    save(ctx, this, slot(j, kHn), hn);
  }
  release_all(ctx, {en, hn});
  TensorView y = call_forward(*d.layer, ctx, {u, positions, segments}, 1, "mtp layer")[0];
  release(ctx, u);
  TensorView out = call_forward(*d.final_norm, ctx, {y}, 1, "mtp final_layernorm")[0];
  release(ctx, y);
  return out;
}

double MultiTokenPrediction::loss_forward(IForwardContext& ctx, int32_t j, const TensorView& h,
                                          const TensorView& labels, const TensorView& mask) {
  const GptConfig& c = config_;
  const int64_t cc = c.hidden_size, v = local_vocab_;
  TensorView x = tp_.enter(ctx, h);  // (B, T, C)
  const int64_t b = x.shape[0], t = x.shape[1], n = b * t;
  // logits (B, T, V/P) = x @ W_out^T with this rank's vocabulary rows.
  TensorView logits = allocate(ctx, c.params_dtype, {b, t, v}, c.device);
  gemm_({rows(x, cc), output_.weight()}, {rows(logits, v)}, ops::GemmAttrs{0, 1, 1.f, 0.f});
  TensorView loss = allocate(ctx, DType::kF32, {n}, c.device);
  TensorView lse = allocate(ctx, DType::kF32, {n}, c.device);
  TensorView mean = allocate(ctx, DType::kF32, {1}, c.device);
  const TensorView flat_labels = reshape(labels, {n}), flat_mask = reshape(mask, {n});
  if (tp_.size() == 1) {  // the vocabulary's columns (a padded one's padding takes no part)
    loss_fwd_({rows(logits, v), flat_labels, flat_mask}, {loss, lse, mean},
              ops::CrossEntropyShardAttrs{0, c.vocab_size});
  } else {  // vocab-parallel, as the model's loss
    const int64_t p = tp_.size();
    ops::CrossEntropyShardAttrs attrs{vocab_start_, c.vocab_size};
    TensorView stats = allocate(ctx, DType::kF32, {n, 3}, c.device);
    shard_stats_({rows(logits, v), flat_labels, flat_mask}, {stats}, attrs);
    TensorView all = allocate(ctx, DType::kF32, {p, n, 3}, c.device);
    tp_.all_gather(stats, all, "the mtp loss statistics");
    combine_({all, flat_labels, flat_mask}, {loss, lse, mean}, attrs);
    release_all(ctx, {stats, all});
  }
  const double value = to_host<float>(host_, mean)[0];
  save(ctx, this, slot(j, kLogits), logits);
  save(ctx, this, slot(j, kLse), lse);
  save(ctx, this, slot(j, kOutInput), x);
  release_all(ctx, {loss, mean, logits, lse});
  release_all(ctx, {x}, {h});  // a gathered x is kept by its save
  return value;
}

void MultiTokenPrediction::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                                        int32_t num_grad_outputs, TensorView* grad_inputs,
                                        int32_t num_grad_inputs) {
  expect_count("mtp backward grad inputs", num_grad_inputs, 1);
  for (int32_t i = 0; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
  const GptConfig& c = config_;
  const int32_t depths = static_cast<int32_t>(depths_.size());
  // d L_MTP / d L_k = lambda / D, seeded with the context's weight of the micro-batch's own
  // loss terms (as the router's aux loss; the trainer's loss weight).
  const double seed = aux_loss_weight_of(ctx, "mtp") * c.mtp_loss_scaling_factor / depths;
  TensorView dmean =
      upload(ctx, host_, DType::kF32, {1}, std::vector<float>{static_cast<float>(seed)}, c.device);
  // Deepest first: d h^k = (its loss's) + (depth k + 1's hnorm's).
  TensorView carry{};
  for (int32_t j = depths; j-- > 0;) {
    TensorView dh = loss_backward(ctx, j, dmean);
    if (present(carry)) {
      add_({dh, carry}, {dh});
      release(ctx, carry);
    }
    carry = depth_backward(ctx, j, dh);
    release(ctx, dh);
  }
  release(ctx, dmean);
  grad_inputs[0] = carry;
}

TensorView MultiTokenPrediction::loss_backward(IForwardContext& ctx, int32_t j,
                                               const TensorView& dmean) {
  const GptConfig& c = config_;
  const int64_t cc = c.hidden_size, v = local_vocab_;
  TensorView logits = load(ctx, this, slot(j, kLogits)), lse = load(ctx, this, slot(j, kLse));
  TensorView labels = load(ctx, this, slot(j, kLabels)), mask = load(ctx, this, slot(j, kMask));
  TensorView x = load(ctx, this, slot(j, kOutInput));  // (B, T, C)
  const int64_t n = logits.shape[0] * logits.shape[1];
  TensorView dlogits = allocate_like(ctx, logits);  // (B, T, V/P)
  std::initializer_list<TensorView> loss_inputs = {rows(logits, v), reshape(labels, {n}),
                                                   reshape(mask, {n}), lse, dmean};
  // This rank's columns (padding: gradient 0), with the lse of the whole vocabulary.
  loss_bwd_(loss_inputs, {rows(dlogits, v)},
            ops::CrossEntropyShardAttrs{vocab_start_, c.vocab_size});
  // dW_out (V/P, C) (+)= dlogits^T @ x (the step's first write of an untied output weight's
  // gradient overwrites it: kParamGradOverwrite); dx (N, C) = dlogits @ W_out, partial over tp.
  const TensorView& dw = output_.weight_grad();
  gemm_({rows(dlogits, v), rows(x, cc)}, {dw}, ops::GemmAttrs{1, 0, 1.f, grad_write_beta(ctx, dw)});
  TensorView dx = allocate_like(ctx, x);
  gemm_({rows(dlogits, v), output_.weight()}, {rows(dx, cc)}, ops::GemmAttrs{0, 0, 1.f, 0.f});
  release(ctx, dlogits);
  TensorView dh = tp_.enter_backward(ctx, dx);  // summed over tp (the shard with sp)
  release_all(ctx, {dx}, {dh});
  return dh;
}

TensorView MultiTokenPrediction::depth_backward(IForwardContext& ctx, int32_t j,
                                                const TensorView& dh) {
  const GptConfig& c = config_;
  const Depth& d = depths_[static_cast<size_t>(j)];
  const int64_t cc = c.hidden_size;
  TensorView dy = call_backward(*d.final_norm, ctx, {dh}, 1, "mtp final_layernorm")[0];
  TensorView du = call_backward(*d.layer, ctx, {dy}, 3, "mtp layer")[0];
  release(ctx, dy);
  TensorView en = load(ctx, this, slot(j, kEn)), hn = load(ctx, this, slot(j, kHn));
  const TensorView &w = value(d.eh_proj), &dw = grad(d.eh_proj);
  // den = du @ W[0:C]^T, dhn = du @ W[C:2C]^T; dW[0:C] += en^T du, dW[C:2C] += hn^T du.
  TensorView den = allocate_like(ctx, en), dhn = allocate_like(ctx, hn);
  gemm_({rows(du, cc), row_range(w, 0, cc)}, {rows(den, cc)}, ops::GemmAttrs{0, 1, 1.f, 0.f});
  gemm_({rows(du, cc), row_range(w, cc, cc)}, {rows(dhn, cc)}, ops::GemmAttrs{0, 1, 1.f, 0.f});
  gemm_({rows(en, cc), rows(du, cc)}, {row_range(dw, 0, cc)}, ops::GemmAttrs{1, 0, 1.f, 1.f});
  gemm_({rows(hn, cc), rows(du, cc)}, {row_range(dw, cc, cc)}, ops::GemmAttrs{1, 0, 1.f, 1.f});
  release(ctx, du);
  TensorView de = call_backward(*d.enorm, ctx, {den}, 1, "mtp enorm")[0];
  release(ctx, den);
  TensorView dprev = call_backward(*d.hnorm, ctx, {dhn}, 1, "mtp hnorm")[0];
  release(ctx, dhn);
  // The embedding's gradient: through its dropout, gathered to (B, T, C), into this rank's
  // vocabulary rows of the shared table's gradient.
  TensorView dropped{};
  if (ctx.training() && c.hidden_dropout > 0) {
    ops::DropoutAttrs attrs{static_cast<float>(c.hidden_dropout), 0, 0};
    ctx.rng(this, kDropoutStream + static_cast<uint64_t>(j), &attrs.key, &attrs.counter);
    dropped = allocate_like(ctx, de);
    dropout_sequence(dropout_bwd_, attrs, de, dropped, tp_, 0, 1);
  }
  TensorView dlocal = present(dropped) ? dropped : de;
  TensorView dfull = tp_.exit_backward(ctx, dlocal);
  TensorView ids = load(ctx, this, slot(j, kIds));
  const int64_t n = numel(ids);
  if (tp_.size() == 1 && c.padded_vocab_size == c.vocab_size)
    embed_bwd_({rows(dfull, cc), reshape(ids, {n})}, {embedding_.word_grad()});
  else
    embed_bwd_({rows(dfull, cc), reshape(ids, {n})}, {embedding_.word_grad()},
               ops::EmbeddingAttrs{vocab_start_, c.vocab_size});
  release_all(ctx, {dfull, dropped, de});
  return dprev;
}

}  // namespace loom::transformer
