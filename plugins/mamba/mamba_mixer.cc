#include "plugins/mamba/mamba_mixer.h"

#include <loom/cpp/half.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace loom::mamba {
namespace {

enum Slot : int32_t { kInput, kXbc, kDt, kY, kZ, kGated, kRstd };
enum State : int32_t { kConvState, kSsmState };

std::string str(int64_t v) { return std::to_string(v); }

// splitmix64: the uniform draws of A and dt (a custom initialisation, reproducible per seed).
double uniform01(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace

MambaMixer::MambaMixer(const nlohmann::json& options, IBuildContext& ctx)
    : host_(ctx.host()),
      hidden_(inherited<int64_t>(options, "hidden_size", "mamba2")),
      heads_(0),
      head_dim_(options.at("head_dim").get<int64_t>()),
      groups_(options.at("num_groups").get<int64_t>()),
      state_dim_(options.at("state_dim").get<int64_t>()),
      conv_width_(options.at("d_conv").get<int64_t>()),
      chunk_size_(options.at("chunk_size").get<int64_t>()),
      local_heads_(0),
      local_groups_(0),
      group_width_(0),
      dt_min_(options.at("dt_min").get<double>()),
      dt_max_(options.at("dt_max").get<double>()),
      dt_floor_(options.at("dt_init_floor").get<double>()),
      a_min_(options.at("A_init_range").at(0).get<double>()),
      a_max_(options.at("A_init_range").at(1).get<double>()),
      norm_eps_(options.at("norm_eps").get<float>()),
      conv_bias_(options.at("conv_bias").get<bool>()),
      tp_(*ctx.host(), device_of(options), params_dtype(options),
          inherited_or<bool>(options, "sequence_parallel", false)),
      dtype_(params_dtype(options)),
      device_(device_of(options)) {
  if (hidden_ < 1) invalid("/hidden_size: must be >= 1, got " + str(hidden_));
  for (auto [key, v] : {std::pair{"head_dim", head_dim_}, {"num_groups", groups_},
                        {"state_dim", state_dim_}, {"chunk_size", chunk_size_}})
    if (v < 1) invalid(std::string("/") + key + ": must be >= 1, got " + str(v));
  if (conv_width_ < 1 || conv_width_ > 8)
    invalid("/d_conv: " + str(conv_width_) + " is outside [1, 8] (the convolution kernels' range)");
  // d_inner = expand * hidden_size, or num_heads * head_dim when num_heads is set.
  int64_t d_inner = 0;
  if (options.contains("num_heads") && !options["num_heads"].is_null()) {
    heads_ = options["num_heads"].get<int64_t>();
    if (heads_ < 1) invalid("/num_heads: must be >= 1, got " + str(heads_));
    d_inner = heads_ * head_dim_;
  } else {
    const double expand = options.at("expand").get<double>();
    const double inner = expand * static_cast<double>(hidden_);
    d_inner = static_cast<int64_t>(inner);
    if (!(expand > 0) || static_cast<double>(d_inner) != inner || d_inner % head_dim_ != 0)
      invalid("/expand: expand * hidden_size = " + std::to_string(inner) +
              " must be a whole multiple of head_dim " + str(head_dim_) +
              " (the SSM heads); or set num_heads");
    heads_ = d_inner / head_dim_;
  }
  if (heads_ % groups_ != 0)
    invalid("/num_groups: " + str(groups_) + " does not divide the " + str(heads_) +
            " SSM heads (d_inner / head_dim); choose a divisor");
  if (!(dt_min_ > 0 && dt_min_ <= dt_max_))
    invalid("/dt_min: need 0 < dt_min <= dt_max, got " + std::to_string(dt_min_) + " and " +
            std::to_string(dt_max_));
  if (!(dt_floor_ > 0)) invalid("/dt_init_floor: must be > 0");
  if (!(a_min_ > 0 && a_min_ <= a_max_))
    invalid("/A_init_range: need 0 < low <= high (A = -uniform(low, high))");
  local_groups_ = tp_.split(groups_, "/num_groups");
  local_heads_ = heads_ / tp_.size();
  group_width_ = heads_ / groups_ * head_dim_ + 2 * state_dim_;

  const double init_std = inherited<double>(options, "init_std", "mamba2");
  const int64_t layers = inherited<int64_t>(options, "num_layers", "mamba2");
  if (layers < 1) invalid("/num_layers: must be >= 1");
  const float std_in = static_cast<float>(init_std);
  const float std_out = static_cast<float>(init_std / std::sqrt(2.0 * static_cast<double>(layers)));
  const float conv_bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(conv_width_)));
  const int32_t p = tp_.size();
  const int64_t inner = heads_ * head_dim_;
  // The projections' weight gradients: one GEMM each writes the whole gradient, asking the
  // context first whether it is the step's first write (kParamGradOverwrite).
  constexpr uint32_t kOverwrite = kParamGradOverwrite;
  z_weight_ = add_param("in_proj_z.weight", dtype_,
                        ParamSpec{{inner, hidden_}, 0, kOverwrite, ParamInit::kNormal, std_in, p});
  xbc_weight_ = add_param(
      "in_proj_xbc.weight", dtype_,
      ParamSpec{{groups_, group_width_, hidden_}, 0, kOverwrite, ParamInit::kNormal, std_in, p});
  dt_weight_ =
      add_param("in_proj_dt.weight", dtype_,
                ParamSpec{{heads_, hidden_}, 0, kOverwrite, ParamInit::kNormal, std_in, p});
  conv_weight_ = add_param("conv1d.weight", dtype_,
                           ParamSpec{{groups_, group_width_, conv_width_}, 0, kParamNone,
                                     ParamInit::kUniform, conv_bound, p});
  if (conv_bias_)
    conv_bias_index_ = add_param("conv1d.bias", dtype_,
                                 ParamSpec{{groups_, group_width_}, 0, kParamNoWeightDecay,
                                           ParamInit::kUniform, conv_bound, p});
  a_log_ = add_param("A_log", dtype_,
                     ParamSpec{{heads_}, 0, kParamNoWeightDecay, ParamInit::kCustom, 0.f, p});
  d_ = add_param("D", dtype_, ParamSpec{{heads_}, 0, kParamNoWeightDecay, ParamInit::kOnes, 0.f, p});
  dt_bias_ = add_param("dt_bias", dtype_,
                       ParamSpec{{heads_}, 0, kParamNoWeightDecay, ParamInit::kCustom, 0.f, p});
  norm_weight_ = add_param("norm.weight", dtype_,
                           ParamSpec{{inner}, 0, kParamNoWeightDecay, ParamInit::kOnes, 0.f, p});
  out_weight_ =
      add_param("out_proj.weight", dtype_,
                ParamSpec{{hidden_, inner}, 1, kOverwrite, ParamInit::kScaledNormal, std_out, p});

  IHost& host = *ctx.host();
  gemm_ = Kernel(host, ops::kGemm, device_, dtype_);
  conv_ = Kernel(host, ops::kCausalConv1d, device_, dtype_);
  conv_bwd_ = Kernel(host, ops::kCausalConv1dBwd, device_, dtype_);
  scan_ = Kernel(host, ops::kSsdScan, device_, dtype_);
  scan_bwd_ = Kernel(host, ops::kSsdScanBwd, device_, dtype_);
  norm_ = Kernel(host, ops::kRmsNormGated, device_, dtype_);
  norm_bwd_ = Kernel(host, ops::kRmsNormGatedBwd, device_, dtype_);
}

Status MambaMixer::init_param(int32_t index, uint64_t seed) noexcept {
  return guard([&] {
    if (index != a_log_ && index != dt_bias_)
      fail(Code::kInvalidArgument, "mamba2: parameter " + str(index) + " has no custom init");
    // Every head's value is drawn for the whole tensor; this rank keeps its heads.
    std::vector<double> all(static_cast<size_t>(heads_));
    uint64_t state = seed;
    for (double& v : all) {
      const double u = uniform01(state);
      if (index == a_log_) {
        v = std::log(a_min_ + u * (a_max_ - a_min_));  // A = -exp(A_log) in [-high, -low]
      } else {
        double dt = std::exp(std::log(dt_min_) + u * (std::log(dt_max_) - std::log(dt_min_)));
        dt = std::max(dt, dt_floor_);
        v = dt + std::log(-std::expm1(-dt));  // softplus(v) = dt
      }
    }
    const TensorView& target = value(index);
    const size_t n = static_cast<size_t>(local_heads_), first = n * static_cast<size_t>(tp_.rank());
    std::vector<float> f32(n);
    std::vector<uint16_t> half(n);
    for (size_t i = 0; i < n; ++i) {
      f32[i] = static_cast<float>(all[first + i]);
      half[i] = dtype_ == DType::kBF16 ? f32_to_bf16(f32[i]) : f32_to_f16(f32[i]);
    }
    const void* src = dtype_ == DType::kF32 ? static_cast<const void*>(f32.data()) : half.data();
    throw_if_error(host_->copy(target.device, target.data, Device{DeviceType::kCpu, 0}, src,
                               n * dtype_size(dtype_)),
                   "mamba2 init");
  });
}

ops::SsdScanAttrs MambaMixer::scan_attrs() const {
  return ops::SsdScanAttrs{static_cast<int32_t>(head_dim_), static_cast<int32_t>(state_dim_),
                           static_cast<int32_t>(local_groups_), static_cast<int32_t>(chunk_size_),
                           1};
}

TensorView MambaMixer::conv_weight() const { return rows(value(conv_weight_), conv_width_); }

TensorView MambaMixer::conv_bias() const {
  return conv_bias_ ? reshape(value(conv_bias_index_), {local_groups_ * group_width_})
                    : empty_view();
}

void MambaMixer::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                             TensorView* outputs, int32_t num_outputs) {
  expect_count("mamba2 forward inputs", num_inputs, 1);
  expect_count("mamba2 forward outputs", num_outputs, 1);
  const TensorView& x_in = inputs[0];
  expect(x_in, {-1, -1, hidden_}, dtype_, "mamba2 hidden");
  TensorView x = tp_.enter(ctx, x_in);  // (B, T, C): the whole sequence on every rank
  const int64_t b = x.shape[0], t = x.shape[1];
  const int64_t h = local_heads_, g = local_groups_, inner = h * head_dim_;
  const int64_t cc = g * group_width_;
  const ops::GemmAttrs proj{0, 1, 1.f, 0.f};  // Y = X W^T
  TensorView z = allocate(ctx, dtype_, {b, t, inner}, device_);
  TensorView xbc = allocate(ctx, dtype_, {b, t, cc}, device_);
  TensorView dt = allocate(ctx, dtype_, {b, t, h}, device_);
  gemm_({rows(x, hidden_), value(z_weight_)}, {rows(z, inner)}, proj);
  gemm_({rows(x, hidden_), rows(value(xbc_weight_), hidden_)}, {rows(xbc, cc)}, proj);
  gemm_({rows(x, hidden_), value(dt_weight_)}, {rows(dt, h)}, proj);

  // Decoding: start from the cached states (after the first pass) and leave the end states.
  TensorView conv_state{}, conv_end{}, ssm_state{};
  TensorView conv_init = empty_view(), ssm_init = empty_view();
  IKvCache* cache = kv_cache_of(ctx);
  if (cache != nullptr) {
    if (ctx.training())
      fail(Code::kFailedPrecondition,
           "mamba2: a kv cache is for inference; this forward pass is training");
    if (conv_width_ > 1)  // the last W - 1 inputs of the convolution
      conv_state = kv_state_of(ctx, *cache, this, kConvState, dtype_, {b, conv_width_ - 1, cc});
    ssm_state = kv_state_of(ctx, *cache, this, kSsmState, DType::kF32,
                            {b, h, head_dim_, state_dim_});
    if (cache->past_length() > 0) {
      conv_init = conv_state;
      ssm_init = ssm_state;
    }
    if (conv_width_ > 1) conv_end = allocate(ctx, dtype_, {b, conv_width_ - 1, cc}, device_);
  }
  TensorView xbc_act = allocate(ctx, dtype_, {b, t, cc}, device_);  // silu(conv(xBC))
  conv_({xbc, conv_weight(), conv_bias(), conv_init}, {xbc_act, conv_end},
        ops::CausalConv1dAttrs{1});
  TensorView y = allocate(ctx, dtype_, {b, t, h, head_dim_}, device_);
  scan_({reshape(xbc_act, {b, t, g, group_width_}), dt, value(a_log_), value(d_), value(dt_bias_),
         ssm_init},
        {y, ssm_state}, scan_attrs());
  if (present(conv_end)) {
    throw_if_error(host_->copy(device_, conv_state.data, device_, conv_end.data, nbytes(conv_end)),
                   "mamba2 conv state");
    release(ctx, conv_end);
  }
  TensorView gated = allocate(ctx, dtype_, {b * t, inner}, device_);
  TensorView rstd = allocate(ctx, DType::kF32, {b * t, g}, device_);
  norm_({rows(y, inner), rows(z, inner), value(norm_weight_)}, {gated, rstd},
        ops::RmsNormGatedAttrs{norm_eps_, static_cast<int32_t>(inner / g)});
  TensorView out_partial = allocate(ctx, dtype_, {b, t, hidden_}, device_);
  gemm_({gated, value(out_weight_)}, {rows(out_partial, hidden_)}, proj);
  TensorView out = tp_.exit(ctx, out_partial);  // summed over the group: like x_in
  if (ctx.training()) {
    save(ctx, this, kInput, x);
    save(ctx, this, kXbc, xbc);  // the convolution is recomputed in backward
    save(ctx, this, kDt, dt);
    save(ctx, this, kY, y);
    save(ctx, this, kZ, z);
    save(ctx, this, kGated, gated);
    save(ctx, this, kRstd, rstd);
  }
  release_all(ctx, {x, z, xbc, dt, xbc_act, y, gated, rstd, out_partial}, {x_in, out});
  outputs[0] = out;
}

void MambaMixer::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                              int32_t num_grad_outputs, TensorView* grad_inputs,
                              int32_t num_grad_inputs) {
  expect_count("mamba2 backward grad outputs", num_grad_outputs, 1);
  expect_count("mamba2 backward grad inputs", num_grad_inputs, 1);
  TensorView x = load(ctx, this, kInput);
  TensorView xbc = load(ctx, this, kXbc), dt = load(ctx, this, kDt), y = load(ctx, this, kY);
  TensorView z = load(ctx, this, kZ), gated = load(ctx, this, kGated);
  TensorView rstd = load(ctx, this, kRstd);
  const int64_t b = x.shape[0], t = x.shape[1];
  const int64_t h = local_heads_, g = local_groups_, inner = h * head_dim_;
  const int64_t cc = g * group_width_;
  const TensorView& dout = grad_outputs[0];
  expect(dout, {b, tp_.sequence_parallel() ? t / tp_.size() : t, hidden_}, dtype_,
         "mamba2 grad output");
  const ops::GemmAttrs dgrad{0, 0, 1.f, 0.f}, dgrad_acc{0, 0, 1.f, 1.f};  // dX (+)= dY W
  // dW (+)= dY^T X: overwritten by the step's first write (kParamGradOverwrite).
  auto wgrad = [&ctx](const TensorView& dw) {
    return ops::GemmAttrs{1, 0, 1.f, grad_write_beta(ctx, dw)};
  };

  TensorView dfull = tp_.exit_backward(ctx, dout);  // (B, T, C)
  gemm_({rows(dfull, hidden_), gated}, {grad(out_weight_)}, wgrad(grad(out_weight_)));
  TensorView dgated = allocate(ctx, dtype_, {b * t, inner}, device_);
  gemm_({rows(dfull, hidden_), value(out_weight_)}, {dgated}, dgrad);
  TensorView dy = allocate(ctx, dtype_, {b, t, h, head_dim_}, device_);
  TensorView dz = allocate(ctx, dtype_, {b, t, inner}, device_);
  norm_bwd_({dgated, rows(y, inner), rows(z, inner), value(norm_weight_), rstd},
            {rows(dy, inner), rows(dz, inner), grad(norm_weight_)},
            ops::RmsNormGatedAttrs{norm_eps_, static_cast<int32_t>(inner / g)});
  release_all(ctx, {dfull, dgated}, {dout});

  TensorView xbc_act = allocate(ctx, dtype_, {b, t, cc}, device_);
  conv_({xbc, conv_weight(), conv_bias(), empty_view()}, {xbc_act, empty_view()},
        ops::CausalConv1dAttrs{1});
  TensorView dxbc_act = allocate(ctx, dtype_, {b, t, cc}, device_);
  TensorView ddt = allocate(ctx, dtype_, {b, t, h}, device_);
  scan_bwd_({dy, reshape(xbc_act, {b, t, g, group_width_}), dt, value(a_log_), value(d_),
             value(dt_bias_), empty_view()},
            {reshape(dxbc_act, {b, t, g, group_width_}), ddt, grad(a_log_), grad(d_),
             grad(dt_bias_)},
            scan_attrs());
  TensorView dxbc = allocate(ctx, dtype_, {b, t, cc}, device_);
  conv_bwd_({dxbc_act, xbc, conv_weight(), conv_bias(), empty_view()},
            {dxbc, rows(grad(conv_weight_), conv_width_),
             conv_bias_ ? reshape(grad(conv_bias_index_), {cc}) : empty_view()},
            ops::CausalConv1dAttrs{1});
  release_all(ctx, {dy, xbc_act, dxbc_act});

  // The three parts of in_proj: their weight gradients and the sum of their input gradients.
  TensorView dx = allocate(ctx, dtype_, {b, t, hidden_}, device_);
  const TensorView xr = rows(x, hidden_);
  gemm_({rows(dz, inner), xr}, {grad(z_weight_)}, wgrad(grad(z_weight_)));
  gemm_({rows(dxbc, cc), xr}, {rows(grad(xbc_weight_), hidden_)}, wgrad(grad(xbc_weight_)));
  gemm_({rows(ddt, h), xr}, {grad(dt_weight_)}, wgrad(grad(dt_weight_)));
  gemm_({rows(dz, inner), value(z_weight_)}, {rows(dx, hidden_)}, dgrad);
  gemm_({rows(dxbc, cc), rows(value(xbc_weight_), hidden_)}, {rows(dx, hidden_)}, dgrad_acc);
  gemm_({rows(ddt, h), value(dt_weight_)}, {rows(dx, hidden_)}, dgrad_acc);
  release_all(ctx, {dz, dxbc, ddt});
  grad_inputs[0] = tp_.enter_backward(ctx, dx);  // like the forward input
  release_all(ctx, {dx}, {grad_inputs[0]});
  for (int32_t i = 1; i < num_grad_inputs; ++i) grad_inputs[i] = empty_view();
}

}  // namespace loom::mamba
