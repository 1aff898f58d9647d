// loom's rendezvous store (IRendezvousStore) seen as gloo's rendezvous::Store, with every
// key prefixed by the group, so the groups of a grid (and the NCCL backend) share one store.
#pragma once

#include <gloo/rendezvous/store.h>
#include <loom/sdk.h>

#include <chrono>
#include <string>
#include <vector>

namespace loom::comm_gloo {

/// Adapts `store` for one group's rendezvous. Keys become "<group_key>/gloo/<key>".
/// Failures throw loom::Error with the store's code (kDeadlineExceeded when a key did not
/// appear in time), which create_communicator turns into its status.
///
/// The store's get() is assumed to report the value's full size in `*size` even when it
/// copied only `capacity` bytes; a larger value is then read again with a larger buffer.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  /// \param store      the shared store (not owned; outlives this adapter)
  /// \param group_key  unique name of the group ("tp/3"), the prefix of every key
  /// \param timeout    how long get() and wait() wait for a key to appear
  StoreAdapter(IRendezvousStore* store, std::string group_key, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  /// Waits (up to the timeout) for `key`, then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<char> read(const std::string& key, std::chrono::milliseconds timeout);
  std::string full_key(const std::string& key) const;

  IRendezvousStore* store_;
  std::string group_key_;
  std::chrono::milliseconds timeout_;
};

}  // namespace loom::comm_gloo
