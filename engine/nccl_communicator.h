// Tensor-parallel ranks on GPUs: the Communicator over NCCL, one process per rank and GPU.
// Buffers are device pointers (the GPU forward's activations). The ranks exchange NCCL's
// unique id through the rendezvous store rank 0 serves (engine/tcp_store.h), the same as the
// Gloo ranks', which stays their liveness line: a rank process that dies breaks the group at
// once (on_broken), idle or not.
//
// Collectives are enqueued on `stream` (so a captured CUDA graph can hold them) and, unless
// `enqueue_only`, waited for up to `timeout`: a collective that does not finish aborts the
// communicator (ncclCommAbort) and fails UNAVAILABLE, never a silent hang. NCCL chooses its own
// reduction order: results agree across ranks, not bit for bit with the CPU ranks.
#ifndef SPECD_ENGINE_NCCL_COMMUNICATOR_H_
#define SPECD_ENGINE_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/communicator.h"
#include "engine/tcp_store.h"

namespace specd::engine {

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;                          // CUDA device of this rank
  std::string rendezvous;                  // rank 0's store, host:port
  std::string bind_address = "127.0.0.1";  // rank 0's store listens here
  void* stream = nullptr;                  // cudaStream_t; nullptr: the legacy default stream
  bool enqueue_only = false;               // true: the caller synchronises (graph capture)
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds connect_timeout{120000};
  std::function<void(const std::string& reason)> on_broken;
};

class NcclCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(const NcclOptions& options);
  ~NcclCommunicator() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  // `data`: a device pointer to n floats.
  absl::Status AllReduceSum(float* data, int64_t n) override;
  // `data`: a device pointer to `bytes` bytes.
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  bool reduces_device_memory() const override { return true; }
  // The caller's stream holds the collective and waits for it (the step's Sync): capturable.
  bool works_in_step_graphs() const override { return options_.enqueue_only; }
  void Disarm();

 private:
  explicit NcclCommunicator(const NcclOptions& options) : options_(options) {}
  absl::Status Finish(const char* op);  // waits (or not) and turns NCCL/CUDA errors into Status

  NcclOptions options_;
  std::unique_ptr<Rendezvous> rendezvous_;
  void* comm_ = nullptr;  // ncclComm_t
  std::atomic<bool> failed_{false};
  std::string failure_;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_NCCL_COMMUNICATOR_H_
