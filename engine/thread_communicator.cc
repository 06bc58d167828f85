#include "engine/thread_communicator.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "common/util/check.h"

namespace specd::engine {

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }

  absl::Status AllReduceSum(float* data, int64_t n) override {
    ThreadGroup& g = *group_;
    g.buffers_[rank_] = data;
    g.sizes_[rank_] = n;
    g.Barrier();  // every buffer published
    absl::Status st = SameSizes("AllReduceSum");
    if (st.ok()) {
      // Each rank sums all buffers in rank order: bit-identical results everywhere.
      sum_.assign(n, 0.0f);
      for (int r = 0; r < g.world_size(); ++r) {
        const float* src = static_cast<const float*>(g.buffers_[r]);
        for (int64_t i = 0; i < n; ++i) sum_[i] += src[i];
      }
    }
    g.Barrier();  // nobody still reads the inputs
    if (st.ok()) std::memcpy(data, sum_.data(), n * sizeof(float));
    return st;
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    ThreadGroup& g = *group_;
    if (root < 0 || root >= g.world_size()) {
      return absl::InvalidArgumentError(absl::StrFormat("Broadcast: root %d of %d", root,
                                                        g.world_size()));
    }
    g.buffers_[rank_] = data;
    g.sizes_[rank_] = bytes;
    g.Barrier();
    absl::Status st = SameSizes("Broadcast");
    if (st.ok() && rank_ != root) std::memcpy(data, g.buffers_[root], bytes);
    g.Barrier();
    return st;
  }

 private:
  // All ranks see the same sizes, so all return the same status (no rank is left waiting).
  absl::Status SameSizes(const char* op) const {
    for (int r = 1; r < group_->world_size(); ++r) {
      if (group_->sizes_[r] != group_->sizes_[0]) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: rank %d passed %d elements, rank 0 passed %d", op, r, group_->sizes_[r],
            group_->sizes_[0]));
      }
    }
    return absl::OkStatus();
  }

  ThreadGroup* group_;
  int rank_;
  std::vector<float> sum_;
};

ThreadGroup::ThreadGroup(int world_size)
    : world_size_(world_size), buffers_(world_size, nullptr), sizes_(world_size, 0) {
  SPECD_CHECK(world_size >= 1, "world_size %d", world_size);
}

std::unique_ptr<Communicator> ThreadGroup::Rank(int rank) {
  SPECD_CHECK(rank >= 0 && rank < world_size_, "rank %d of %d", rank, world_size_);
  return std::make_unique<ThreadCommunicator>(this, rank);
}

void ThreadGroup::Barrier() {
  absl::MutexLock l(&mu_);
  const int64_t gen = generation_;
  if (++arrived_ == world_size_) {
    arrived_ = 0;
    ++generation_;
    return;
  }
  auto next = [this, gen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return generation_ != gen; };
  mu_.Await(absl::Condition(&next));
}

}  // namespace specd::engine
