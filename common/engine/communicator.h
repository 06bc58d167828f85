// Collectives for tensor parallelism. NCCL (GPU) and Gloo (CPU) implementations come with
// the tensor-parallel work; a single rank uses LocalCommunicator.
#ifndef SPECD_COMMON_ENGINE_COMMUNICATOR_H_
#define SPECD_COMMON_ENGINE_COMMUNICATOR_H_

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
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduceSum(float*, int64_t) override { return absl::OkStatus(); }
};

}  // namespace specd::engine

#endif  // SPECD_COMMON_ENGINE_COMMUNICATOR_H_
