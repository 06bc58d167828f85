#include "engine/gloo_communicator.h"

#include <cstdint>
#include <exception>

#include "absl/strings/str_cat.h"
#include "gloo/broadcast.h"
#include "gloo/gather.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"

namespace specd::engine {

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    const GlooOptions& options) {
  std::unique_ptr<GlooCommunicator> c(new GlooCommunicator(options));
  absl::StatusOr<std::unique_ptr<Rendezvous>> rendezvous =
      Rendezvous::Join(options.rank, options.world_size, options.rendezvous,
                       options.bind_address, options.connect_timeout, options.on_broken);
  if (!rendezvous.ok()) return rendezvous.status();
  c->rendezvous_ = std::move(*rendezvous);
  try {
    gloo::transport::tcp::attr attr(options.bind_address.c_str());
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(options.connect_timeout);
    context->connectFullMesh(c->rendezvous_->store(), device);
    context->setTimeout(options.timeout);
    c->context_ = std::move(context);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", options.rank, " of ", options.world_size,
                                               ": joining the group: ", e.what()));
  }
  c->rendezvous_->Arm("Gloo");  // from now on a peer process that ends is reported
  return c;
}

GlooCommunicator::~GlooCommunicator() {
  Disarm();
  context_.reset();  // closes the pairs
  rendezvous_.reset();
}

void GlooCommunicator::Disarm() {
  if (rendezvous_ != nullptr) rendezvous_->Disarm();
}

absl::Status GlooCommunicator::Failed(const char* op, const std::exception& e) {
  failed_ = true;
  failure_ = absl::StrCat(op, " on rank ", options_.rank, " of ", options_.world_size, ": ",
                          e.what());
  rendezvous_->ReportBroken("Gloo", failure_);
  return absl::UnavailableError(failure_);
}

absl::Status GlooCommunicator::AllReduceSum(float* data, int64_t n) {
  if (options_.world_size == 1 || n == 0) return absl::OkStatus();
  if (failed_) return absl::UnavailableError(failure_);
  try {
    // data: [n] partial sums -> rank 0's gathered_: [world_size, n]
    gloo::GatherOptions gather(context_);
    gather.setInput(data, static_cast<size_t>(n));
    if (options_.rank == 0) {
      gathered_.resize(static_cast<size_t>(n) * options_.world_size);
      gather.setOutput(gathered_.data(), gathered_.size());
    }
    gather.setRoot(0);
    gloo::gather(gather);
  } catch (const std::exception& e) {
    return Failed("AllReduceSum (gather)", e);
  }
  if (options_.rank == 0) {
    // The thread ranks' order: 0 + rank 0 + rank 1 + ... (bitwise the same results).
    for (int64_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < options_.world_size; ++r) sum += gathered_[r * n + i];
      data[i] = sum;
    }
  }
  return Broadcast(data, n * static_cast<int64_t>(sizeof(float)), 0);
}

absl::Status GlooCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  return BroadcastWithTimeout(data, bytes, root, options_.timeout);
}

absl::Status GlooCommunicator::BroadcastWithTimeout(void* data, int64_t bytes, int root,
                                                    std::chrono::milliseconds timeout) {
  if (root < 0 || root >= options_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " of ", options_.world_size));
  }
  if (options_.world_size == 1 || bytes == 0) return absl::OkStatus();
  if (failed_) return absl::UnavailableError(failure_);
  try {
    gloo::BroadcastOptions b(context_);
    b.setOutput(static_cast<uint8_t*>(data), static_cast<size_t>(bytes));
    b.setRoot(root);
    b.setTimeout(timeout);
    gloo::broadcast(b);
  } catch (const std::exception& e) {
    return Failed("Broadcast", e);
  }
  return absl::OkStatus();
}

}  // namespace specd::engine
