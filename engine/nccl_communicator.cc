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
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, world size ", options.world_size, ")"));
  }
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(options.rendezvous, &host, &port); !s.ok()) return s;
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(options));
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.device, ": ", cudaGetErrorString(e)));
  }
  if (options.rank == 0) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::Start(options.bind_address, port);
    if (!server.ok()) return server.status();
    c->server_ = std::move(*server);
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> store =
      TcpStore::Connect(options.rank == 0 ? options.bind_address : host, port, options.rank,
                        options.connect_timeout);
  if (!store.ok()) return store.status();
  c->store_ = std::move(*store);
  ncclUniqueId id;
  try {
    // Rank 0 makes the group's id; the others read it from the store.
    if (options.rank == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        return absl::InternalError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
      }
      c->store_->set(kUniqueIdKey, std::vector<char>(reinterpret_cast<char*>(&id),
                                                     reinterpret_cast<char*>(&id) + sizeof id));
    } else {
      const std::vector<char> got = c->store_->get(kUniqueIdKey);
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
  NcclCommunicator* self = c.get();
  PeerLostHandler lost = [self](int rank) {
    self->Broken(absl::StrCat("rank ", rank, "'s process is gone (its connection closed)"));
  };
  if (c->server_ != nullptr) {
    c->server_->Arm(lost);
  } else {
    c->store_->WatchServer(lost);
  }
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  Disarm();
  if (comm_ != nullptr) {
    // A failed communicator was aborted already; a healthy one is destroyed (collective-free).
    if (!failed_) ncclCommDestroy(Comm(comm_));
  }
  store_.reset();
  server_.reset();
}

void NcclCommunicator::Disarm() {
  armed_ = false;
  if (server_ != nullptr) server_->Disarm();
  if (store_ != nullptr) store_->Disarm();
}

void NcclCommunicator::Broken(const std::string& reason) {
  if (!armed_ || reported_.exchange(true) || !options_.on_broken) return;
  options_.on_broken(absl::StrCat("tensor-parallel group (rank ", options_.rank, " of ",
                                  options_.world_size, ", NCCL): ", reason));
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
      Broken(failure_);
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
