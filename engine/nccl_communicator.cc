#include "engine/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace specd::engine {

namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";

ncclComm_t Comm(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    const NcclOptions& options) {
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(options));
  // Options are checked (by Join) before the GPU is touched.
  absl::StatusOr<std::unique_ptr<Rendezvous>> rendezvous =
      Rendezvous::Join(options.rank, options.world_size, options.rendezvous,
                       options.bind_address, options.connect_timeout, options.on_broken);
  if (!rendezvous.ok()) return rendezvous.status();
  c->rendezvous_ = std::move(*rendezvous);
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.device, ": ", cudaGetErrorString(e)));
  }
  ncclUniqueId id;
  try {
    // Rank 0 makes the group's id; the others read it from the store.
    TcpStore& store = c->rendezvous_->store();
    if (options.rank == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        return absl::InternalError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
      }
      store.set(kUniqueIdKey, std::vector<char>(reinterpret_cast<char*>(&id),
                                                reinterpret_cast<char*>(&id) + sizeof id));
    } else {
      const std::vector<char> got = store.get(kUniqueIdKey);
      if (got.size() != sizeof id) return absl::InternalError("rendezvous: bad NCCL unique id");
      std::memcpy(&id, got.data(), sizeof id);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", options.rank, ": ", e.what()));
  }
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, options.world_size, id, options.rank);
      r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("rank ", options.rank, " of ", options.world_size,
                                               ": ncclCommInitRank: ", ncclGetErrorString(r)));
  }
  c->comm_ = comm;
  c->rendezvous_->Arm("NCCL");
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  Disarm();
  // A failed communicator was aborted already; a healthy one is destroyed (collective-free).
  if (comm_ != nullptr && !failed_) ncclCommDestroy(Comm(comm_));
  rendezvous_.reset();
}

void NcclCommunicator::Disarm() {
  if (rendezvous_ != nullptr) rendezvous_->Disarm();
}

absl::Status NcclCommunicator::Finish(const char* op) {
  if (options_.enqueue_only) return absl::OkStatus();
  // Poll rather than block, so that a peer that never arrives is a timeout, not a hang.
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(Stream(options_.stream));
    if (q == cudaSuccess) return absl::OkStatus();
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(Comm(comm_), &async);
    std::string why;
    if (q != cudaErrorNotReady) {
      why = cudaGetErrorString(q);
    } else if (async != ncclSuccess && async != ncclInProgress) {
      why = ncclGetErrorString(async);
    } else if (std::chrono::steady_clock::now() > deadline) {
      why = "timed out";
    }
    if (!why.empty()) {
      failed_ = true;
      ncclCommAbort(Comm(comm_));
      failure_ = absl::StrCat(op, " on rank ", options_.rank, " of ", options_.world_size, ": ",
                              why);
      rendezvous_->ReportBroken("NCCL", failure_);
      return absl::UnavailableError(failure_);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t n) {
  // One rank still runs NCCL (a world of one is how the path is checked on one GPU).
  if (n == 0) return absl::OkStatus();
  if (failed_) return absl::UnavailableError(failure_);
  if (ncclResult_t r = ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum,
                                     Comm(comm_), Stream(options_.stream));
      r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclAllReduce: ", ncclGetErrorString(r)));
  }
  return Finish("AllReduceSum");
}

absl::Status NcclCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  if (root < 0 || root >= options_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " of ", options_.world_size));
  }
  if (bytes == 0) return absl::OkStatus();
  if (failed_) return absl::UnavailableError(failure_);
  if (ncclResult_t r = ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root,
                                     Comm(comm_), Stream(options_.stream));
      r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclBroadcast: ", ncclGetErrorString(r)));
  }
  return Finish("Broadcast");
}

}  // namespace specd::engine
