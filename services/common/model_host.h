// What the draft and target services share: a GGUF model with its tokenizer, backend, paged
// KV cache, and the committed-token history of every sequence the router has placed here.
//
// Tensor parallelism: with world_size N > 1 the host is rank 0 of N ranks, each holding its
// slice of the heads and FFN columns and its own KV cache: threads of this process sharing an
// engine::ThreadGroup, or (with `rendezvous`) processes joined by an engine::GlooCommunicator,
// where ranks 1..N-1 run ServeRank. Both give bitwise the same results. Rank 0 serves gRPC and drives the others through the Communicator: every call that
// changes model state (Forward, AddSequence, Release, Truncate, and the prefix cache's
// AdoptPrefix, Publish and drop) is broadcast first, so all ranks run
// the same operations in the same order and their caches stay identical in shape. After every
// operation each rank's status is gathered (GatherStatus): a failure on any rank fails the call
// on rank 0 with that rank's message, and a forward is checked on every rank before any rank
// enters a collective, so a rank that would fail cannot leave the others in an all-reduce.
#ifndef SPECD_SERVICES_COMMON_MODEL_HOST_H_
#define SPECD_SERVICES_COMMON_MODEL_HOST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/gloo_communicator.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "engine/paged_kv_cache.h"
#include "engine/thread_communicator.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/tokenizer.h"
#include "specd/internal/v1/common.pb.h"

namespace specd::services {

struct ModelHostOptions {
  std::string model_path;
  // Tensors the model file lacks come from this file (a distilled draft borrows its target's
  // token embeddings); its vocabulary must match the model's. Empty = none.
  std::string borrow_path;
  int32_t threads = 0;            // 0 = all cores
  std::string device = "cpu";     // where the model runs: cpu, cuda, cuda:N (--device)
  int32_t kv_blocks = 1024;
  int32_t kv_block_size = 16;
  int32_t max_batch_tokens = 512;
  int32_t num_layers = 0;         // 0 = all (fewer: self-speculation drafts)
  int32_t world_size = 1;         // tensor-parallel ranks; thread ranks share `threads`
  // Rank processes (empty rendezvous: thread ranks): this process is rank `rank`; rank 0
  // serves the rendezvous store at host:port, and every rank's Gloo pairs bind
  // `tp_bind_address` (an address the other ranks reach: 127.0.0.1 within one pod).
  int32_t rank = 0;
  std::string rendezvous;
  std::string tp_bind_address = "127.0.0.1";
  double tp_timeout_s = 10;           // a collective slower than this fails the group
  double tp_connect_timeout_s = 120;  // how long ranks wait for each other at start
  // Rank processes: the group broke (a rank's process ended, or a collective failed or timed
  // out); see engine::GlooOptions::on_broken. The services log it and exit non-zero: a group
  // cannot go on without a rank.
  std::function<void(const std::string& reason)> on_group_broken;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;
  // Content-addressed KV blocks shared by sequences with the same prompt prefix
  // (engine::PagedKvCache prefix caching), on every rank.
  bool prefix_caching = true;
  // Tests only: every forward fails on this rank (a rank whose state went wrong); -1 = none.
  int32_t inject_forward_fault_on_rank = -1;
  // Tests only: the backend to run on instead of `device`'s (e.g. testing::FencedBackend, the
  // CPU's stand-in for a device whose memory the host cannot address); world size 1.
  std::function<std::unique_ptr<engine::Backend>()> make_backend;
};

class ModelHost final : public engine::ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelHost>> Load(const ModelHostOptions& options);
  // A rank process 1..N-1 (options.rank, options.rendezvous): joins rank 0, loads its shard
  // and does what rank 0 broadcasts until rank 0 stops the group (OK) or the group breaks.
  static absl::Status ServeRank(const ModelHostOptions& options);
  ~ModelHost() override;

  // One forward on every rank (logits from rank 0): the only way to run the model. A failure
  // on any rank comes back here, named "rank r: ...".
  absl::Status Forward(const engine::ForwardBatch& batch, float* logits, float* hidden) override;
  // Sampling where the logits are (engine::ModelRunner): at world size 1 on a device backend;
  // tensor-parallel ranks still send rank 0's logits to the host.
  bool samples_on_device() const override;
  absl::StatusOr<std::vector<sampling::VerifyResult>> ForwardAndVerify(
      const engine::ForwardBatch& batch, const sampling::BlockwisePlan& plan,
      float* hidden) override;
  absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ForwardAndPropose(
      const engine::ForwardBatch& batch, const sampling::BlockwisePlan& plan, int32_t top_n,
      float* hidden) override;
  const engine::LlamaModel& model() const override { return *model_; }
  const engine::PagedKvCache& kv() const override { return *kv_; }
  int32_t world_size() const { return options_.world_size; }
  const tok::Tokenizer& tokenizer() const { return *tokenizer_; }
  absl::Span<const int32_t> eos_ids() const { return eos_ids_; }
  const ModelHostOptions& options() const { return options_; }
  int32_t vocab_size() const { return model_->vocab_size(); }
  int32_t context_length() const { return model_->config().context_length; }
  uint64_t instance_id() const { return instance_id_; }

  // The committed tokens of `seq` (nullptr if unknown).
  std::vector<int32_t>* History(engine::SeqId seq);
  // Adds `seq` with an empty history and KV.
  absl::Status AddSequence(engine::SeqId seq) override;
  void Release(engine::SeqId seq);
  void FreeSequence(engine::SeqId seq) override { Release(seq); }
  // Shortens the KV of `seq` on every rank (the history is the caller's to fix).
  absl::Status Truncate(engine::SeqId seq, int64_t length) override;
  absl::StatusOr<int64_t> AdoptPrefix(engine::SeqId seq,
                                      absl::Span<const int32_t> prompt) override;
  absl::Status Publish(engine::SeqId seq, absl::Span<const int32_t> committed) override;
  void DropPrefixCache() override;

  specd::internal::v1::ServiceInfo Info() const;
  specd::internal::v1::KvUsage Usage() const;

 private:
  ModelHost() = default;
  struct Rank;           // a rank > 0: its shard, cache and thread
  struct Command;        // what rank 0 broadcasts before each state change
  // Rank 0 side: hands `c` (and for a forward, the batch) to the other ranks.
  absl::Status Broadcast(Command& c, const engine::ForwardBatch* batch);
  static absl::Status RankLoop(Rank* rank, int32_t fault_rank);
  static engine::GlooOptions MakeGlooOptions(const ModelHostOptions& options);
  bool Single() const { return options_.world_size == 1; }
  // Ranks 1..N-1 run (threads started, or rank processes joined): the destructor stops them.
  bool group_running_ = false;
  // Every operation that goes to the group holds group_mu_ (the heartbeat must not interleave
  // with one): a scoped guard at the top of each public operation.
  class GroupOp {
   public:
    explicit GroupOp(ModelHost* host) ABSL_EXCLUSIVE_LOCK_FUNCTION(host->group_mu_);
    ~GroupOp() ABSL_UNLOCK_FUNCTION();
   private:
    ModelHost* host_;
  };
  void HeartbeatLoop();
  absl::Mutex group_mu_;
  absl::Time last_group_op_ ABSL_GUARDED_BY(group_mu_);
  bool stopping_ ABSL_GUARDED_BY(group_mu_) = false;
  std::thread heartbeat_;  // rank processes only
  // Rank 0 side of a command that carries a token list (AdoptPrefix, Publish).
  absl::Status BroadcastTokens(Command& c, absl::Span<const int32_t> tokens);

  ModelHostOptions options_;
  engine::LocalCommunicator local_comm_;
  std::unique_ptr<engine::ThreadGroup> group_;
  std::unique_ptr<engine::Communicator> comm_;  // rank 0's, with world_size > 1
  std::vector<std::unique_ptr<Rank>> ranks_;    // ranks 1 .. N-1
  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<gguf::GgufFile> borrow_file_;  // options_.borrow_path, if set
  std::unique_ptr<tok::Tokenizer> tokenizer_;
  std::unique_ptr<engine::Backend> backend_;
  std::unique_ptr<engine::LlamaModel> model_;
  std::unique_ptr<engine::PagedKvCache> kv_;
  std::vector<int32_t> eos_ids_;
  uint64_t instance_id_ = 0;
  // node_hash_map: History() pointers stay valid while other sequences are added.
  absl::node_hash_map<engine::SeqId, std::vector<int32_t>> history_;
};

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_MODEL_HOST_H_
