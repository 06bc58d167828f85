// Tensor-parallel ranks as threads of one process, sharing memory: the CPU implementation of
// Communicator (one socket's cores split into ranks) and the stand-in for NCCL ranks in tests.
// Every collective is entered by all ranks, as with NCCL.
#ifndef SPECD_ENGINE_THREAD_COMMUNICATOR_H_
#define SPECD_ENGINE_THREAD_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/communicator.h"

namespace specd::engine {

class ThreadGroup {
 public:
  explicit ThreadGroup(int world_size);
  int world_size() const { return world_size_; }
  // The communicator of `rank`, in [0, world_size); each rank's thread uses its own.
  std::unique_ptr<Communicator> Rank(int rank);

 private:
  friend class ThreadCommunicator;
  // Blocks until every rank has arrived (reusable: generations).
  void Barrier();

  const int world_size_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Published between barriers: rank r's buffer and size for the current collective.
  std::vector<void*> buffers_;
  std::vector<int64_t> sizes_;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_THREAD_COMMUNICATOR_H_
