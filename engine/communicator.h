// Collectives for tensor parallelism. One rank uses LocalCommunicator; ranks that are threads
// of one process use thread_communicator.h; NCCL (GPU) and cross-host ranks implement the same
// interface.
#ifndef SPECD_ENGINE_COMMUNICATOR_H_
#define SPECD_ENGINE_COMMUNICATOR_H_

#include <cstdint>

#include "absl/status/status.h"

namespace specd::engine {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sums `data` element-wise across ranks, in place, identically on every rank.
  virtual absl::Status AllReduceSum(float* data, int64_t n) = 0;
  // Copies `bytes` bytes at `data` on rank `root` to `data` on every other rank (how rank 0
  // hands the others each step's batch).
  virtual absl::Status Broadcast(void* data, int64_t bytes, int root) = 0;
  // True when AllReduceSum may be handed a pointer into a device backend's memory (NCCL, or
  // one rank, which touches nothing); host collectives read host memory only.
  virtual bool reduces_device_memory() const { return false; }
  // True when AllReduceSum only enqueues work on the backend's stream, so a recorded step
  // (a CUDA graph) may hold it: one rank, or NCCL on that stream with enqueue_only.
  virtual bool works_in_step_graphs() const { return false; }
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduceSum(float*, int64_t) override { return absl::OkStatus(); }
  absl::Status Broadcast(void*, int64_t, int) override { return absl::OkStatus(); }
  bool reduces_device_memory() const override { return true; }
  bool works_in_step_graphs() const override { return true; }
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_COMMUNICATOR_H_
