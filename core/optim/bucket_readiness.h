// BucketReadiness: which gradient buckets are final during the last backward pass of a
// step, so that their reduction can start while backward goes on (DESIGN.md section 5).
//
// Modules signal IForwardContext::grads_ready(owner) when the gradients of the parameters
// they declare are final. Each bucket counts its parameters not yet final; a signal marks
// the owner's parameters final (each once) and releases buckets whose count reached zero.
// Buckets are released strictly in index order (backward order): a bucket that is final
// before an earlier one waits for it. Collectives on one communicator must be issued in
// the same order on every rank, and the order of the signals depends on the model's code
// (a module whose backward is skipped on one rank, say an expert that got no tokens, never
// signals there); in index order, every rank hands the buckets over in the same order
// whatever the signals did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/runtime/parameters.h"

namespace loom::core {

class BucketReadiness {
 public:
  /// \param owners   per parameter, the id its module signals with (any pointer)
  /// \param buckets  per bucket, the indices into `owners` of its parameters; every
  ///                 parameter in at most one bucket
  /// \param final    per parameter, true when its gradient never changes (a frozen
  ///                 parameter): final from the start; empty means none
  BucketReadiness(std::vector<const void*> owners, std::vector<std::vector<size_t>> buckets,
                  std::vector<bool> final = {});
  /// The buckets of `params`; owners are the declaring modules, frozen parameters final.
  /// \param hold_tied  the tied embedding table's bucket waits for release_rest: its
  ///                   gradient is summed over the embedding group (first and last pipeline
  ///                   stage) after every stage's backward, before its data reduction
  explicit BucketReadiness(const ParameterSet& params, bool hold_tied = false);

  /// Starts a new backward pass: every parameter not final again, nothing released.
  void reset();
  /// The gradients of every parameter `owner` declares are final. Returns the buckets
  /// released by it, in index order (often none). An unknown owner or a second signal of
  /// one owner marks nothing (but releases leading buckets that were final from the
  /// start).
  std::vector<size_t> mark(const void* owner);
  /// Releases every bucket not released yet, final or not (backward is over), in index
  /// order.
  std::vector<size_t> release_rest();
  /// Buckets released since the last reset.
  size_t released() const { return next_; }
  size_t bucket_count() const { return buckets_.size(); }

 private:
  std::vector<size_t> release_final();
  std::vector<std::vector<size_t>> buckets_;
  std::vector<int64_t> bucket_of_;  // per parameter, -1 when in none
  std::vector<bool> final_;         // per parameter, final from the start
  std::unordered_map<const void*, std::vector<size_t>> params_of_;
  std::vector<bool> done_;        // per parameter, final in this pass
  std::vector<int64_t> pending_;  // per bucket, parameters not final yet
  size_t next_ = 0;               // first bucket not released
};

}  // namespace loom::core
