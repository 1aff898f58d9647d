#include "core/optim/bucket_readiness.h"

#include <utility>

#include "loom/cpp/error.h"

namespace loom::core {

BucketReadiness::BucketReadiness(std::vector<const void*> owners,
                                 std::vector<std::vector<size_t>> buckets, std::vector<bool> final)
    : buckets_(std::move(buckets)), bucket_of_(owners.size(), -1), final_(std::move(final)) {
  if (final_.empty()) final_.assign(owners.size(), false);
  LOOM_CHECK(final_.size() == owners.size(), "final ", final_.size(), ", owners ", owners.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t p : buckets_[b]) {
      LOOM_CHECK(p < owners.size() && bucket_of_[p] < 0, "parameter ", p, " in bucket ", b, " (of ",
                 owners.size(), ", or in two buckets)");
      bucket_of_[p] = static_cast<int64_t>(b);
    }
  for (size_t p = 0; p < owners.size(); ++p) params_of_[owners[p]].push_back(p);
  reset();
}

namespace {

std::vector<const void*> owners_of(const ParameterSet& params, bool hold_tied) {
  std::vector<const void*> owners;
  for (const Parameter& p : params.all()) {
    const bool held = hold_tied && (p.info.flags & kParamTiedEmbedding) != 0;
    owners.push_back(held ? nullptr : static_cast<const IModule*>(p.module));  // never signalled
  }
  return owners;
}

std::vector<std::vector<size_t>> buckets_of(const ParameterSet& params) {
  std::vector<std::vector<size_t>> buckets;
  for (const Bucket& b : params.buckets()) buckets.push_back(b.params);
  return buckets;
}

std::vector<bool> frozen_of(const ParameterSet& params) {
  std::vector<bool> frozen;
  for (const Parameter& p : params.all()) frozen.push_back((p.info.flags & kParamFrozen) != 0);
  return frozen;
}

}  // namespace

BucketReadiness::BucketReadiness(const ParameterSet& params, bool hold_tied)
    : BucketReadiness(owners_of(params, hold_tied), buckets_of(params), frozen_of(params)) {}

void BucketReadiness::reset() {
  done_ = final_;
  pending_.assign(buckets_.size(), 0);
  for (size_t p = 0; p < done_.size(); ++p)
    if (!done_[p] && bucket_of_[p] >= 0) ++pending_[bucket_of_[p]];
  next_ = 0;
}

std::vector<size_t> BucketReadiness::mark(const void* owner) {
  auto it = params_of_.find(owner);
  if (it != params_of_.end())
    for (size_t p : it->second) {
      if (done_[p]) continue;
      done_[p] = true;
      if (bucket_of_[p] >= 0) --pending_[bucket_of_[p]];
    }
  return release_final();
}

std::vector<size_t> BucketReadiness::release_final() {
  std::vector<size_t> out;
  while (next_ < buckets_.size() && pending_[next_] == 0) out.push_back(next_++);
  return out;
}

std::vector<size_t> BucketReadiness::release_rest() {
  std::vector<size_t> out;
  while (next_ < buckets_.size()) out.push_back(next_++);
  return out;
}

}  // namespace loom::core
