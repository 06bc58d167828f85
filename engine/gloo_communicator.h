// Tensor-parallel ranks as processes: the Communicator over Gloo's TCP transport (CPU; the GPU
// build's NCCL communicator implements the same interface). Ranks find each other through a
// store that rank 0 serves (engine/tcp_store.h) at `rendezvous` = host:port; each rank's Gloo
// pairs bind `bind_address`.
//
// Results are bitwise those of the thread ranks (ThreadGroup): AllReduceSum gathers every
// rank's partial sums on rank 0, adds them in rank order starting from 0, and broadcasts the
// result, so every rank holds the same bits, and the same bits as one process with N threads.
//
// Failure is loud, never a silent hang: a collective that does not complete within `timeout`
// fails (UNAVAILABLE), the communicator stays failed, and a rank whose process dies is
// noticed at once (its rendezvous connection closes), idle or not: both call `on_broken`.
#ifndef SPECD_ENGINE_GLOO_COMMUNICATOR_H_
#define SPECD_ENGINE_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/communicator.h"
#include "engine/tcp_store.h"

namespace gloo {
class Context;
}

namespace specd::engine {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  std::string rendezvous;                // rank 0's store, host:port
  std::string bind_address = "127.0.0.1";  // this rank's Gloo pairs
  // A collective that takes longer fails the group.
  std::chrono::milliseconds timeout{10000};
  // How long ranks wait for each other at start.
  std::chrono::milliseconds connect_timeout{120000};
  // The group is broken: another rank's process is gone (reported from a background thread,
  // idle or not) or a collective failed (from the calling thread). Called at most once, not
  // after Disarm(). The services log the reason and exit non-zero.
  std::function<void(const std::string& reason)> on_broken;
};

class GlooCommunicator final : public Communicator {
 public:
  // Blocks until all `world_size` ranks have joined (or connect_timeout).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(const GlooOptions& options);
  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  absl::Status AllReduceSum(float* data, int64_t n) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  // Broadcast with its own timeout: ranks > 0 wait for rank 0's next command this way, idle
  // for as long as there is no traffic (rank 0's death reaches them through on_broken).
  absl::Status BroadcastWithTimeout(void* data, int64_t bytes, int root,
                                    std::chrono::milliseconds timeout);
  // A stop on purpose: the group's processes may now end without on_broken.
  void Disarm();

 private:
  explicit GlooCommunicator(const GlooOptions& options) : options_(options) {}
  absl::Status Failed(const char* op, const std::exception& e);

  GlooOptions options_;
  std::unique_ptr<Rendezvous> rendezvous_;
  std::shared_ptr<gloo::Context> context_;
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::vector<float> gathered_;  // rank 0: [world_size, n]
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_GLOO_COMMUNICATOR_H_
