// AllGatherDispatcher (kinds::kMoeDispatcher "allgather"): Megatron-Core's
// MoEAllGatherTokenDispatcher. Every expert-parallel rank gathers all the group's tokens
// and routing, runs its own experts' rows, and the outputs, weighted by the routers' probs,
// are reduce-scattered back to their owners. Every rank of the group holds the same number
// of tokens N (they are micro-batches of one shape).
//   dispatch:  hidden (N, C), experts (N, K) -> rows (M, C) of the local experts, grouped
//              by expert, tokens in group order; tokens_per_expert (E / ep) i64 on the host
//   combine:   rows (M, C), probs (N, K) -> hidden (N, C)
#pragma once

#include "plugins/moe/dispatcher_base.h"

namespace loom::moe {

class AllGatherDispatcher final : public DispatcherBase {
 public:
  using DispatcherBase::DispatcherBase;

 private:
  enum Slot : int32_t { kSlotRows, kRowSlots, kRows, kProbs };

 public:

  Status dispatch(IForwardContext* ctx, const TensorView* hidden, const TensorView* experts,
                  TensorView* dispatched, TensorView* tokens_per_expert) noexcept override {
    return run([&] {
      const int64_t k = experts->shape[1];
      TensorView all_hidden = gather(*ctx, *hidden, "the tokens");     // (P N, C)
      TensorView all_experts = gather(*ctx, *experts, "the routing");  // (P N, K)
      std::vector<int32_t> ids;
      to_host(host_, all_experts, ids);
      RowPlan plan = plan_rows(ids, k, static_cast<int32_t>(ep_->rank() * local_),
                               static_cast<int32_t>(local_));
      const int64_t m = static_cast<int64_t>(plan.src.size()), c = hidden->shape[1];
      TensorView src = upload(*ctx, host_, DType::kI32, {m}, plan.src, device_);
      *dispatched = allocate(*ctx, hidden->dtype, {m, c}, device_);
      permute_({all_hidden, src}, {*dispatched});
      stash(*ctx, kSlotRows,
           upload(*ctx, host_, DType::kI32, {all_experts.shape[0], k}, plan.slot_rows, device_));
      stash(*ctx, kRowSlots, upload(*ctx, host_, DType::kI32, {m}, plan.row_slots, device_));
      *tokens_per_expert = counts_tensor(*ctx, plan.counts);
      release_all(*ctx, {all_hidden, all_experts, src}, {*hidden, *experts});
    });
  }

  Status combine(IForwardContext* ctx, const TensorView* expert_out, const TensorView* probs,
                 TensorView* hidden) noexcept override {
    return run([&] {
      TensorView slot_rows = fetch(*ctx, kSlotRows);
      TensorView all_probs = gather(*ctx, *probs, "the probs");  // (P N, K)
      TensorView all_out = allocate(*ctx, expert_out->dtype,
                                    {slot_rows.shape[0], expert_out->shape[1]}, device_);
      unpermute_({*expert_out, slot_rows, all_probs}, {all_out});  // zeros for other experts'
      *hidden = scatter_sum(*ctx, all_out, "the expert outputs");
      if (ctx->training()) {
        save(*ctx, this, kRows, *expert_out);
        save(*ctx, this, kProbs, all_probs);
      }
      release_all(*ctx, {all_probs, all_out}, {*probs, *hidden});
      end_pass(*ctx);
    });
  }

  Status combine_backward(IForwardContext* ctx, const TensorView* grad_hidden,
                          TensorView* grad_expert_out, TensorView* grad_probs) noexcept override {
    return run([&] {
      TensorView slot_rows = fetch(*ctx, kSlotRows), row_slots = fetch(*ctx, kRowSlots);
      TensorView rows = fetch(*ctx, kRows), all_probs = fetch(*ctx, kProbs);
      TensorView all_dy = gather(*ctx, *grad_hidden, "the output gradient");  // (P N, C)
      *grad_expert_out = allocate_like(*ctx, rows);
      TensorView all_dprobs = allocate(*ctx, DType::kF32, {all_probs.shape[0], all_probs.shape[1]},
                                       device_);
      unpermute_bwd_({all_dy, rows, slot_rows, all_probs, row_slots},
                     {*grad_expert_out, all_dprobs});
      // Each choice's expert lives on one rank: the others contribute zeros.
      *grad_probs = scatter_sum(*ctx, all_dprobs, "the probs' gradient");
      release_all(*ctx, {all_dy, all_dprobs}, {*grad_hidden, *grad_probs});
    });
  }

  Status dispatch_backward(IForwardContext* ctx, const TensorView* grad_dispatched,
                           TensorView* grad_hidden) noexcept override {
    return run([&] {
      TensorView slot_rows = fetch(*ctx, kSlotRows);
      TensorView all_dx = allocate(*ctx, grad_dispatched->dtype,
                                   {slot_rows.shape[0], grad_dispatched->shape[1]}, device_);
      unpermute_({*grad_dispatched, slot_rows, empty_view()}, {all_dx});
      *grad_hidden = scatter_sum(*ctx, all_dx, "the token gradient");
      release_all(*ctx, {all_dx}, {*grad_hidden});
      drop_saved(*ctx, this);
    });
  }
};

}  // namespace loom::moe
