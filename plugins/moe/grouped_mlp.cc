#include "plugins/moe/grouped_mlp.h"

#include <cmath>

namespace loom::moe {
namespace {

enum Slot : int32_t { kInput, kFc1Out, kActOut, kCounts };

// expect() of the toolkit, but an expert group may receive no rows at all: (0, cols) with
// no memory is fine.
void expect_rows(const TensorView& v, int64_t rows, int64_t cols, DType dtype, const char* what) {
  if (v.ndim == 2 && v.shape[0] == 0 && v.shape[1] == cols && v.dtype == dtype &&
      (rows < 0 || rows == 0))
    return;
  expect(v, {rows, cols}, dtype, what);
}

TensorView row_slice(const TensorView& v, int64_t r, int64_t m) {
  char* base = static_cast<char*>(v.data) +
               r * v.shape[1] * static_cast<int64_t>(dtype_size(v.dtype));
  return make_view(base, v.dtype, {m, v.shape[1]}, v.device);
}

}  // namespace

GroupedMlp::GroupedMlp(const nlohmann::json& options, IHost& host)
    : host_(host),
      swiglu_(options.at("activation").get<std::string>() == "swiglu"),
      gelu_tanh_(options.at("activation").get<std::string>() == "gelu_tanh"),
      grouped_(options.value("grouped", true)),
      hidden_(options.at("hidden_size").get<int64_t>()),
      ffn_(options.at("ffn_hidden_size").get<int64_t>()),
      dtype_(params_dtype(options)),
      device_(device_of(options)),
      etp_(&group(host_, ParallelRole::kExpertTensor)) {
  ICommunicator& ep = group(host_, ParallelRole::kExpert);
  const int64_t experts = options.at("num_experts").get<int64_t>();
  local_ = experts / ep.size();
  first_ = ep.rank() * local_;
  const float init_std = options.at("init_std").get<float>();
  const int64_t layers = options.at("num_layers").get<int64_t>();
  const float out_std = static_cast<float>(init_std / std::sqrt(2.0 * static_cast<double>(layers)));
  const int32_t etp = etp_->size();
  if (ffn_ % etp != 0)
    invalid(detail::concat("/moe_ffn_hidden_size: ", ffn_, " is not divisible by the expert "
                           "tensor-parallel size ", etp, " (parallel.etp, which defaults to "
                           "parallel.tp); choose an etp that divides it"));
  std::vector<int64_t> fc1 = swiglu_ ? std::vector<int64_t>{2, ffn_, hidden_}
                                     : std::vector<int64_t>{ffn_, hidden_};
  for (int64_t i = 0; i < local_; ++i) {
    const int32_t g = static_cast<int32_t>(first_ + i);
    // Every write into an expert's gradient is this module's and asks the context first
    // (gemm_wgrad): kParamGradOverwrite.
    constexpr uint32_t kFlags = kParamExpert | kParamGradOverwrite;
    ParamSpec s1{fc1, swiglu_ ? 1 : 0, kFlags, ParamInit::kNormal, init_std, etp};
    s1.expert_index = g;
    fc1_.push_back(add_param("linear_fc1.weight" + std::to_string(g), dtype_, s1));
    ParamSpec s2{{hidden_, ffn_}, 1, kFlags, ParamInit::kScaledNormal, out_std, etp};
    s2.expert_index = g;
    fc2_.push_back(add_param("linear_fc2.weight" + std::to_string(g), dtype_, s2));
  }
  if (grouped_) {
    grouped_gemm_ = Kernel(host_, ops::kGroupedGemm, device_, dtype_);
    grouped_wgrad_ = Kernel(host_, ops::kGroupedGemmWgrad, device_, dtype_);
  }
  ffn_ /= etp;
  gemm_ = Kernel(host_, ops::kGemm, device_, dtype_);
  if (etp > 1) add_ = Kernel(host_, ops::kAdd, device_, dtype_);
  act_fwd_ = Kernel(host_, swiglu_ ? ops::kSwigluFwd : ops::kGeluFwd, device_, dtype_);
  act_bwd_ = Kernel(host_, swiglu_ ? ops::kSwigluBwd : ops::kGeluBwd, device_, dtype_);
}

std::vector<int64_t> GroupedMlp::counts_of(const TensorView& t, int64_t rows) const {
  if (t.dtype != DType::kI64 || t.device.type != DeviceType::kCpu || numel(t) != local_)
    fail(Code::kInvalidArgument,
         detail::concat("moe experts: rows per expert must be (", local_, ") i64 on the host, got ",
                        dtype_name(t.dtype), shape_string(t)));
  const int64_t* p = static_cast<const int64_t*>(t.data);
  std::vector<int64_t> counts(p, p + local_);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total != rows)
    fail(Code::kInvalidArgument,
         detail::concat("moe experts: rows per expert sum to ", total, ", the input has ", rows));
  return counts;
}

void GroupedMlp::gemm_rows(const TensorView& x, const std::vector<int32_t>& weights, bool trans_b,
                           const std::vector<int64_t>& counts, const TensorView& y) const {
  const int64_t cols = x.shape[1], groups = static_cast<int64_t>(counts.size());
  if (grouped_) {
    std::vector<void*> ptrs;
    for (int64_t g = 0; g < groups; ++g) ptrs.push_back(value(weights[g % local_]).data);
    TensorView w0 = rows(value(weights[0]), trans_b ? cols : numel(value(weights[0])) / cols);
    grouped_gemm_({x, w0}, {y},
                  ops::GroupedGemmAttrs{static_cast<int32_t>(groups), counts.data(), ptrs.data(),
                                        trans_b ? 1 : 0, 1.0f, 0.0f});
    return;
  }
  int64_t r = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (counts[g] > 0) {
      const TensorView& w = value(weights[g % local_]);
      TensorView w2 = rows(w, trans_b ? cols : numel(w) / cols);
      gemm_({row_slice(x, r, counts[g]), w2}, {row_slice(y, r, counts[g])},
            ops::GemmAttrs{0, trans_b ? 1 : 0, 1.0f, 0.0f});
    }
    r += counts[g];
  }
}

float GroupedMlp::grouped_write_beta(IForwardContext& ctx,
                                     const std::vector<int32_t>& weights) const {
  std::vector<int32_t> first;
  for (int32_t w : weights)
    if (grad_write_beta(ctx, grad(w)) == 0.f) first.push_back(w);
  if (first.size() == weights.size()) return 0.f;
  for (int32_t w : first)
    throw_if_error(host_.fill_zero(device_, grad(w).data, nbytes(grad(w))),
                   "moe experts: zeroing a weight gradient");
  return 1.f;
}

void GroupedMlp::gemm_wgrad(IForwardContext& ctx, const TensorView& dy, const TensorView& x,
                            const std::vector<int32_t>& weights,
                            const std::vector<int64_t>& counts) const {
  const int64_t in = x.shape[1];
  if (grouped_) {
    // One grouped call per etp rank's run of rows: a call's groups own distinct gradients.
    std::vector<void*> ptrs;
    for (int32_t w : weights) ptrs.push_back(grad(w).data);
    int64_t r = 0;
    for (size_t at = 0; at < counts.size(); at += static_cast<size_t>(local_)) {
      int64_t m = 0;
      for (int64_t g = 0; g < local_; ++g) m += counts[at + static_cast<size_t>(g)];
      if (m > 0)
        grouped_wgrad_(
            {row_slice(dy, r, m), row_slice(x, r, m)}, {rows(grad(weights[0]), in)},
            ops::GroupedGemmAttrs{static_cast<int32_t>(local_), counts.data() + at, ptrs.data(), 0,
                                  1.0f, grouped_write_beta(ctx, weights)});
      r += m;
    }
    return;
  }
  int64_t r = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) {
      const TensorView dw = grad(weights[g % static_cast<size_t>(local_)]);
      gemm_({row_slice(dy, r, counts[g]), row_slice(x, r, counts[g])}, {rows(dw, in)},
            ops::GemmAttrs{1, 0, 1.0f, grad_write_beta(ctx, dw)});
    }
    r += counts[g];
  }
}

std::vector<int64_t> GroupedMlp::gather_counts(const std::vector<int64_t>& counts) const {
  const int64_t p = etp_->size();
  if (p == 1) return counts;
  // Every rank sends its E_local counts to each rank (an all-to-all of host values, as the
  // alltoall dispatcher exchanges its counts).
  std::vector<int64_t> out(static_cast<size_t>(p * local_)), in(out.size());
  std::vector<int64_t> n(p, local_), offsets(p);
  for (int64_t q = 0; q < p; ++q) {
    std::copy(counts.begin(), counts.end(), out.begin() + q * local_);
    offsets[q] = q * local_;
  }
  TensorView a = make_view(out.data(), DType::kI64, {p * local_});
  TensorView b = make_view(in.data(), DType::kI64, {p * local_});
  throw_if_error(etp_->all_to_all(&a, n.data(), offsets.data(), &b, n.data(), offsets.data(),
                                  nullptr),
                 "moe experts: exchanging the rows per expert over the expert-tensor group");
  return in;
}

namespace {

// Rows of each etp rank: sums of its E_local counts.
std::vector<int64_t> rank_rows(const std::vector<int64_t>& all_counts, int64_t ranks) {
  std::vector<int64_t> out(static_cast<size_t>(ranks), 0);
  const size_t per = all_counts.size() / static_cast<size_t>(ranks);
  for (size_t i = 0; i < all_counts.size(); ++i) out[i / per] += all_counts[i];
  return out;
}

}  // namespace

TensorView GroupedMlp::gather_rows(IForwardContext& ctx, const TensorView& x,
                                   const std::vector<int64_t>& all_counts, const char* what) const {
  const int64_t p = etp_->size(), c = x.shape[1];
  if (p == 1) return x;
  std::vector<int64_t> m = rank_rows(all_counts, p);
  std::vector<int64_t> sc(p, m[etp_->rank()] * c), so(p, 0), rc(p), ro(p);
  int64_t total = 0;
  for (int64_t q = 0; q < p; ++q) {
    rc[q] = m[q] * c;
    ro[q] = total * c;
    total += m[q];
  }
  TensorView out = allocate(ctx, x.dtype, {total, c}, x.device);  // (sum M_r, C)
  throw_if_error(etp_->all_to_all(&x, sc.data(), so.data(), &out, rc.data(), ro.data(), nullptr),
                 std::string("moe experts: gathering ") + what + " over the expert-tensor group");
  return out;
}

TensorView GroupedMlp::sum_rows(IForwardContext& ctx, const TensorView& x,
                                const std::vector<int64_t>& all_counts, const char* what) const {
  const int64_t p = etp_->size(), c = x.shape[1];
  if (p == 1) return x;
  std::vector<int64_t> m = rank_rows(all_counts, p);
  const int64_t mine = m[etp_->rank()];
  std::vector<int64_t> sc(p), so(p), rc(p, mine * c), ro(p);
  for (int64_t q = 0, at = 0; q < p; ++q) {
    sc[q] = m[q] * c;
    so[q] = at * c;
    at += m[q];
    ro[q] = q * mine * c;
  }
  TensorView parts = allocate(ctx, x.dtype, {p, mine, c}, x.device);  // (etp, M, C)
  throw_if_error(etp_->all_to_all(&x, sc.data(), so.data(), &parts, rc.data(), ro.data(), nullptr),
                 std::string("moe experts: summing ") + what + " over the expert-tensor group");
  TensorView out = allocate(ctx, x.dtype, {mine, c}, x.device);  // (M, C)
  if (mine > 0) {
    add_({row_slice(rows(parts, c), 0, mine), row_slice(rows(parts, c), mine, mine)}, {out});
    for (int64_t q = 2; q < p; ++q) add_({out, row_slice(rows(parts, c), q * mine, mine)}, {out});
  }
  release(ctx, parts);
  return out;
}

void GroupedMlp::run_forward(IForwardContext& ctx, const TensorView* inputs, int32_t num_inputs,
                             TensorView* outputs, int32_t num_outputs) {
  expect_count("moe experts forward inputs", num_inputs, 2);
  expect_count("moe experts forward outputs", num_outputs, 1);
  const TensorView& x_mine = inputs[0];
  expect_rows(x_mine, -1, hidden_, dtype_, "moe experts input");
  // Every etp rank's rows (etp x E_local groups): M rows over all of them.
  std::vector<int64_t> counts = gather_counts(counts_of(inputs[1], x_mine.shape[0]));
  TensorView x = gather_rows(ctx, x_mine, counts, "the rows");  // (M, C)
  const int64_t m = x.shape[0], f1 = swiglu_ ? 2 * ffn_ : ffn_;
  TensorView h1 = allocate(ctx, dtype_, {m, f1}, device_);  // (M, F | 2F)
  gemm_rows(x, fc1_, true, counts, h1);
  TensorView a = allocate(ctx, dtype_, {m, ffn_}, device_);  // (M, F)
  if (swiglu_)
    act_fwd_({h1}, {a});
  else
    act_fwd_({h1}, {a}, ops::GeluAttrs{gelu_tanh_ ? 1 : 0});
  TensorView y = allocate(ctx, dtype_, {m, hidden_}, device_);  // (M, C), partial over etp
  gemm_rows(a, fc2_, true, counts, y);
  if (ctx.training()) {
    save(ctx, this, kInput, x);
    save(ctx, this, kFc1Out, h1);
    save(ctx, this, kActOut, a);
    TensorView kept = allocate(ctx, DType::kI64, {static_cast<int64_t>(counts.size())}, kCpu);
    std::memcpy(kept.data, counts.data(), counts.size() * sizeof(int64_t));
    save(ctx, this, kCounts, kept);
  }
  release_all(ctx, {h1, a});
  TensorView y_mine = sum_rows(ctx, y, counts, "the outputs");  // (M_mine, C)
  if (etp_->size() > 1) release_all(ctx, {x, y});
  outputs[0] = y_mine;
}

void GroupedMlp::run_backward(IForwardContext& ctx, const TensorView* grad_outputs,
                              int32_t num_grad_outputs, TensorView* grad_inputs,
                              int32_t num_grad_inputs) {
  expect_count("moe experts backward grad outputs", num_grad_outputs, 1);
  expect_count("moe experts backward grad inputs", num_grad_inputs, 1);
  TensorView x = load(ctx, this, kInput), h1 = load(ctx, this, kFc1Out);
  TensorView a = load(ctx, this, kActOut);
  const int64_t m = x.shape[0];
  TensorView kept = load(ctx, this, kCounts);
  const int64_t* kc = static_cast<const int64_t*>(kept.data);
  std::vector<int64_t> counts(kc, kc + numel(kept));
  const int64_t mine = rank_rows(counts, etp_->size())[etp_->rank()];
  expect_rows(grad_outputs[0], mine, hidden_, dtype_, "moe experts grad output");
  TensorView dy = gather_rows(ctx, grad_outputs[0], counts, "the output gradient");  // (M, C)
  TensorView da = allocate(ctx, dtype_, {m, ffn_}, device_);  // dy @ W2: (M, F)
  gemm_rows(dy, fc2_, false, counts, da);
  gemm_wgrad(ctx, dy, a, fc2_, counts);
  TensorView dh1 = allocate_like(ctx, h1);
  if (swiglu_)
    act_bwd_({da, h1}, {dh1});
  else
    act_bwd_({da, h1}, {dh1}, ops::GeluAttrs{gelu_tanh_ ? 1 : 0});
  TensorView dx = allocate_like(ctx, x);  // dh1 @ W1: (M, C), partial over etp
  gemm_rows(dh1, fc1_, false, counts, dx);
  gemm_wgrad(ctx, dh1, x, fc1_, counts);
  release_all(ctx, {da, dh1});
  TensorView dx_mine = sum_rows(ctx, dx, counts, "the input gradient");  // (M_mine, C)
  if (etp_->size() > 1) release_all(ctx, {dy, dx});
  grad_inputs[0] = dx_mine;
}

}  // namespace loom::moe
