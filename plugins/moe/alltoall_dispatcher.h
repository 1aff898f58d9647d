// AllToAllDispatcher (kinds::kMoeDispatcher "alltoall"): Megatron-Core's
// MoEAlltoAllTokenDispatcher. Each rank orders its (token, choice) pairs expert-major, which
// is also by the rank owning the expert, sends each rank its rows in one all-to-all (the
// per-expert counts go first, so every receiver knows its splits), and regroups what it
// received from (source rank, local expert) to (local expert, source rank) order. Combine
// runs the exact reverse and sums each token's rows weighted by its probs. Ranks may hold
// different numbers of tokens; a rank or an expert may receive none.
//   dispatch:  hidden (N, C), experts (N, K) -> rows (M, C) of the local experts, grouped by
//              expert, by source rank within an expert; tokens_per_expert (E / ep) i64 on
//              the host
//   combine:   rows (M, C), probs (N, K) -> hidden (N, C)
#pragma once

#include <string>

#include "plugins/moe/dispatcher_base.h"

namespace loom::moe {

class AllToAllDispatcher final : public DispatcherBase {
 public:
  using DispatcherBase::DispatcherBase;

  Status dispatch(IForwardContext* ctx, const TensorView* hidden, const TensorView* experts,
                  TensorView* dispatched, TensorView* tokens_per_expert) noexcept override {
    return run([&] {
      const int64_t k = experts->shape[1], c = hidden->shape[1], p = ep_->size();
      std::vector<int32_t> ids;
      to_host(host_, *experts, ids);
      RowPlan plan = plan_rows(ids, k, 0, static_cast<int32_t>(experts_));
      const int64_t sent = static_cast<int64_t>(plan.src.size());
      TensorView src = upload(*ctx, host_, DType::kI32, {sent}, plan.src, device_);
      TensorView permuted = allocate(*ctx, hidden->dtype, {sent, c}, device_);  // (Ms, C)
      permute_({*hidden, src}, {permuted});
      release(*ctx, src);
      // counts[q][e]: rows this rank sends to local expert e of rank q; received[q][e]: rows
      // rank q sends to this rank's local expert e.
      std::vector<int64_t> received(static_cast<size_t>(p * local_));
      exchange<int64_t>(plan.counts, local_, received, local_, DType::kI64, "the token counts");
      std::vector<int64_t> send_rows(static_cast<size_t>(p), 0), recv_rows(send_rows);
      for (int64_t q = 0; q < p; ++q)
        for (int64_t e = 0; e < local_; ++e) {
          send_rows[q] += plan.counts[q * local_ + e];
          recv_rows[q] += received[q * local_ + e];
        }
      TensorView arrived = move_rows(*ctx, permuted, send_rows, recv_rows, "the tokens");
      if (arrived.data != permuted.data) release(*ctx, permuted);
      // Regroup (source rank, expert) -> (expert, source rank): by_expert[j] is the arrived
      // row that lands at row j; by_source its inverse.
      std::vector<int64_t> start(static_cast<size_t>(p * local_), 0), counts(local_, 0);
      for (int64_t i = 1; i < p * local_; ++i) start[i] = start[i - 1] + received[i - 1];
      std::vector<int32_t> by_expert, by_source(static_cast<size_t>(arrived.shape[0]));
      for (int64_t e = 0; e < local_; ++e)
        for (int64_t q = 0; q < p; ++q) {
          counts[e] += received[q * local_ + e];
          for (int64_t r = 0; r < received[q * local_ + e]; ++r) {
            by_source[start[q * local_ + e] + r] = static_cast<int32_t>(by_expert.size());
            by_expert.push_back(static_cast<int32_t>(start[q * local_ + e] + r));
          }
        }
      const int64_t m = static_cast<int64_t>(by_expert.size());
      if (ctx->training() && ctx->micro_batch() == 0) {
        // One line per layer and step at log level debug: what this rank's experts got.
        std::string rows = detail::concat("moe alltoall dispatcher: rank ", ep_->rank(),
                                          " of the expert group received ", m, " rows (");
        for (int64_t e = 0; e < local_; ++e) rows += (e ? " " : "") + std::to_string(counts[e]);
        rows += " per local expert)";
        host_.log(LogLevel::kDebug, make_string_view("moe"),
                  StringView{rows.data(), rows.size()});
      }
      TensorView to_expert = upload(*ctx, host_, DType::kI32, {m}, by_expert, device_);
      *dispatched = allocate(*ctx, hidden->dtype, {m, c}, device_);
      permute_({arrived, to_expert}, {*dispatched});
      release(*ctx, arrived);
      const int64_t n = experts->shape[0];
      stash(*ctx, kSlotRows, upload(*ctx, host_, DType::kI32, {n, k}, plan.slot_rows, device_));
      stash(*ctx, kRowSlots, upload(*ctx, host_, DType::kI32, {sent}, plan.row_slots, device_));
      stash(*ctx, kToExpert, to_expert);
      stash(*ctx, kToSource, upload(*ctx, host_, DType::kI32, {m}, by_source, device_));
      keep(*ctx, kSendRows, DType::kI64, send_rows);
      keep(*ctx, kRecvRows, DType::kI64, recv_rows);
      *tokens_per_expert = counts_tensor(*ctx, counts);
    });
  }

  Status combine(IForwardContext* ctx, const TensorView* expert_out, const TensorView* probs,
                 TensorView* hidden) noexcept override {
    return run([&] {
      TensorView back = to_owners(*ctx, *expert_out, "the expert outputs");  // (Ms, C)
      TensorView slot_rows = fetch(*ctx, kSlotRows);
      *hidden = allocate(*ctx, expert_out->dtype, {slot_rows.shape[0], expert_out->shape[1]},
                         device_);
      unpermute_({back, slot_rows, *probs}, {*hidden});
      if (ctx->training()) {
        save(*ctx, this, kReturned, back);
        save(*ctx, this, kProbs, *probs);
      }
      release(*ctx, back);
      end_pass(*ctx);
    });
  }

  Status combine_backward(IForwardContext* ctx, const TensorView* grad_hidden,
                          TensorView* grad_expert_out, TensorView* grad_probs) noexcept override {
    return run([&] {
      TensorView back = fetch(*ctx, kReturned), probs = fetch(*ctx, kProbs);
      TensorView slot_rows = fetch(*ctx, kSlotRows), row_slots = fetch(*ctx, kRowSlots);
      TensorView dback = allocate_like(*ctx, back);
      *grad_probs = allocate(*ctx, DType::kF32, {probs.shape[0], probs.shape[1]}, device_);
      unpermute_bwd_({*grad_hidden, back, slot_rows, probs, row_slots}, {dback, *grad_probs});
      *grad_expert_out = to_experts(*ctx, dback, "the expert outputs' gradient");
      release(*ctx, dback);
    });
  }

  Status dispatch_backward(IForwardContext* ctx, const TensorView* grad_dispatched,
                           TensorView* grad_hidden) noexcept override {
    return run([&] {
      TensorView dsent = to_owners(*ctx, *grad_dispatched, "the token gradient");  // (Ms, C)
      TensorView slot_rows = fetch(*ctx, kSlotRows);
      *grad_hidden = allocate(*ctx, grad_dispatched->dtype,
                              {slot_rows.shape[0], grad_dispatched->shape[1]}, device_);
      unpermute_({dsent, slot_rows, empty_view()}, {*grad_hidden});
      release(*ctx, dsent);
      drop_saved(*ctx, this);
    });
  }

 private:
  enum Slot : int32_t {
    kSlotRows,
    kRowSlots,
    kToExpert,
    kToSource,
    kSendRows,
    kRecvRows,
    kReturned,
    kProbs
  };

  // Every rank sends `per` values of `out` to each rank and receives `per_in` from each.
  template <class T>
  void exchange(const std::vector<T>& out, int64_t per, std::vector<T>& in, int64_t per_in,
                DType dtype, const char* what) {
    const int64_t p = ep_->size();
    if (p == 1) {
      in = out;
      return;
    }
    std::vector<int64_t> sc(p, per), so(p), rc(p, per_in), ro(p);
    for (int64_t q = 0; q < p; ++q) {
      so[q] = q * per;
      ro[q] = q * per_in;
    }
    TensorView a = make_view(const_cast<T*>(out.data()), dtype, {p * per});
    TensorView b = make_view(in.data(), dtype, {p * per_in});
    throw_if_error(ep_->all_to_all(&a, sc.data(), so.data(), &b, rc.data(), ro.data(), nullptr),
                   std::string("moe alltoall dispatcher: exchanging ") + what);
  }

  // An all-to-all of rows (R, C): `send[q]` rows to rank q, `recv[q]` rows from it.
  TensorView move_rows(IForwardContext& ctx, const TensorView& x, const std::vector<int64_t>& send,
                       const std::vector<int64_t>& recv, const char* what) {
    const int64_t p = ep_->size(), c = x.shape[1];
    if (p == 1) return x;
    std::vector<int64_t> sc(p), so(p), rc(p), ro(p);
    int64_t total = 0;
    for (int64_t q = 0, s = 0; q < p; ++q) {
      sc[q] = send[q] * c;
      so[q] = s;
      s += sc[q];
      rc[q] = recv[q] * c;
      ro[q] = total * c;
      total += recv[q];
    }
    TensorView out = allocate(ctx, x.dtype, {total, c}, x.device);
    throw_if_error(ep_->all_to_all(&x, sc.data(), so.data(), &out, rc.data(), ro.data(), nullptr),
                   std::string("moe alltoall dispatcher: the all-to-all of ") + what);
    return out;
  }

  // Rows in expert order (M, C) back to the ranks that sent them: (Ms, C) in their plan's
  // order.
  TensorView to_owners(IForwardContext& ctx, const TensorView& rows, const char* what) {
    TensorView to_source = fetch(ctx, kToSource);
    TensorView by_source = allocate_like(ctx, rows);
    permute_({rows, to_source}, {by_source});
    TensorView out =
        move_rows(ctx, by_source, kept<int64_t>(ctx, kRecvRows), kept<int64_t>(ctx, kSendRows),
                  what);
    if (out.data != by_source.data) release(ctx, by_source);
    return out;
  }

  // The reverse: (Ms, C) in this rank's plan order -> (M, C) in expert order.
  TensorView to_experts(IForwardContext& ctx, const TensorView& rows, const char* what) {
    TensorView arrived =
        move_rows(ctx, rows, kept<int64_t>(ctx, kSendRows), kept<int64_t>(ctx, kRecvRows), what);
    TensorView to_expert = fetch(ctx, kToExpert);
    TensorView out = allocate(ctx, rows.dtype, {to_expert.shape[0], rows.shape[1]}, device_);
    permute_({arrived, to_expert}, {out});
    if (arrived.data != rows.data) release(ctx, arrived);
    return out;
  }
};

}  // namespace loom::moe
