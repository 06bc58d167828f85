#include "services/common/model_host.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"

namespace specd::services {

enum class Op : int32_t { kForward, kAddSequence, kRelease, kStop };

struct ModelHost::Command {
  Op op = Op::kStop;
  engine::SeqId seq = 0;
  int32_t tokens = 0, slices = 0, rows = 0;  // kForward: sizes of the batch that follows
};

struct ModelHost::Rank {
  std::unique_ptr<engine::Communicator> comm;
  std::unique_ptr<engine::Backend> backend;
  std::unique_ptr<engine::LlamaModel> model;
  std::unique_ptr<engine::PagedKvCache> kv;
  std::vector<float> logits;  // [max_logit_rows, vocab], discarded
  std::thread thread;
};

namespace {

struct Shard {
  std::unique_ptr<engine::Backend> backend;
  std::unique_ptr<engine::LlamaModel> model;
  std::unique_ptr<engine::PagedKvCache> kv;
};

absl::StatusOr<Shard> LoadShard(const gguf::GgufFile& file, const ModelHostOptions& options,
                                engine::Communicator* comm, int32_t threads) {
  Shard s;
  s.backend = engine::MakeCpuBackend(threads);
  engine::ModelOptions mo;
  mo.max_batch_tokens = options.max_batch_tokens;
  mo.max_logit_rows = options.max_batch_tokens;
  mo.num_layers = options.num_layers;
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> model =
      engine::LlamaModel::Load(file, s.backend.get(), comm, mo);
  if (!model.ok()) return model.status();
  s.model = std::move(*model);
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(
      s.model->MakeKvCacheConfig(options.kv_blocks, options.kv_block_size, options.kv_dtype));
  if (!kv.ok()) return kv.status();
  s.kv = std::move(*kv);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelHost>> ModelHost::Load(const ModelHostOptions& options) {
  if (options.model_path.empty()) return absl::InvalidArgumentError("model path is required");
  if (options.kv_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_blocks must be > 0, got ", options.kv_blocks));
  }
  if (options.max_batch_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_tokens must be > 0, got ", options.max_batch_tokens));
  }
  if (options.world_size < 1 || options.world_size > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be in [1, 64], got ", options.world_size));
  }
  std::unique_ptr<ModelHost> h(new ModelHost());
  h->options_ = options;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(options.model_path);
  if (!file.ok()) return file.status();
  h->file_ = std::move(*file);
  absl::StatusOr<std::unique_ptr<tok::Tokenizer>> tk = tok::Tokenizer::FromGguf(*h->file_);
  if (!tk.ok()) return tk.status();
  h->tokenizer_ = std::move(*tk);
  const int32_t N = options.world_size;
  const int32_t cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int32_t threads = std::max(1, (options.threads > 0 ? options.threads : cores) / N);
  engine::Communicator* comm0 = &h->local_comm_;
  if (N > 1) {
    h->group_ = std::make_unique<engine::ThreadGroup>(N);
    h->comm_ = h->group_->Rank(0);
    comm0 = h->comm_.get();
  }
  // Loading is local to each rank (it only slices the mmap'd weights): no collectives yet.
  absl::StatusOr<Shard> shard = LoadShard(*h->file_, options, comm0, threads);
  if (!shard.ok()) return shard.status();
  h->backend_ = std::move(shard->backend);
  h->model_ = std::move(shard->model);
  h->kv_ = std::move(shard->kv);
  for (int32_t r = 1; r < N; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->comm = h->group_->Rank(r);
    absl::StatusOr<Shard> s = LoadShard(*h->file_, options, rank->comm.get(), threads);
    if (!s.ok()) return s.status();  // threads start only once every rank has loaded
    rank->backend = std::move(s->backend);
    rank->model = std::move(s->model);
    rank->kv = std::move(s->kv);
    rank->logits.resize(static_cast<size_t>(options.max_batch_tokens) * rank->model->vocab_size());
    h->ranks_.push_back(std::move(rank));
  }
  for (auto& rank : h->ranks_) rank->thread = std::thread(&ModelHost::RankLoop, rank.get());
  for (int32_t id = 0; id < h->tokenizer_->vocab_size(); ++id) {
    if (h->tokenizer_->IsEndOfGeneration(id)) h->eos_ids_.push_back(id);
  }
  std::random_device rd;
  h->instance_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return h;
}

ModelHost::~ModelHost() {
  if (ranks_.empty()) return;
  Command stop;
  stop.op = Op::kStop;
  (void)Broadcast(stop, nullptr);
  for (auto& rank : ranks_) rank->thread.join();
}

absl::Status ModelHost::Broadcast(Command& c, const engine::ForwardBatch* batch) {
  if (ranks_.empty()) return absl::OkStatus();
  if (absl::Status s = comm_->Broadcast(&c, sizeof(c), 0); !s.ok()) return s;
  if (c.op != Op::kForward) return absl::OkStatus();
  // The other ranks read from rank 0's buffers: const_cast only for the collective's signature.
  auto* b = const_cast<engine::ForwardBatch*>(batch);
  if (absl::Status s = comm_->Broadcast(b->tokens.data(), c.tokens * sizeof(int32_t), 0); !s.ok()) {
    return s;
  }
  if (absl::Status s = comm_->Broadcast(b->slices.data(),
                                        c.slices * sizeof(engine::SequenceSlice), 0);
      !s.ok()) {
    return s;
  }
  return comm_->Broadcast(b->logit_rows.data(), c.rows * sizeof(int32_t), 0);
}

// Ranks > 0: wait for rank 0's command, do the same on this shard. A failing Forward fails
// identically on every rank (same inputs, same cache state), before any collective.
void ModelHost::RankLoop(Rank* rank) {
  engine::ForwardBatch batch;
  for (;;) {
    Command c;
    if (!rank->comm->Broadcast(&c, sizeof(c), 0).ok()) return;
    switch (c.op) {
      case Op::kStop:
        return;
      case Op::kAddSequence:
        (void)rank->kv->AddSequence(c.seq);
        break;
      case Op::kRelease:
        rank->kv->FreeSequence(c.seq);
        break;
      case Op::kForward:
        batch.tokens.resize(c.tokens);
        batch.slices.resize(c.slices);
        batch.logit_rows.resize(c.rows);
        (void)rank->comm->Broadcast(batch.tokens.data(), c.tokens * sizeof(int32_t), 0);
        (void)rank->comm->Broadcast(batch.slices.data(), c.slices * sizeof(engine::SequenceSlice), 0);
        (void)rank->comm->Broadcast(batch.logit_rows.data(), c.rows * sizeof(int32_t), 0);
        (void)rank->model->Forward(batch, *rank->kv, rank->logits.data());
        break;
    }
  }
}

absl::Status ModelHost::Forward(const engine::ForwardBatch& batch, float* logits) {
  Command c;
  c.op = Op::kForward;
  c.tokens = static_cast<int32_t>(batch.tokens.size());
  c.slices = static_cast<int32_t>(batch.slices.size());
  c.rows = static_cast<int32_t>(batch.logit_rows.size());
  if (absl::Status s = Broadcast(c, &batch); !s.ok()) return s;
  return model_->Forward(batch, *kv_, logits);
}

std::vector<int32_t>* ModelHost::History(engine::SeqId seq) {
  auto it = history_.find(seq);
  return it == history_.end() ? nullptr : &it->second;
}

absl::Status ModelHost::AddSequence(engine::SeqId seq) {
  Command c;
  c.op = Op::kAddSequence;
  c.seq = seq;
  if (absl::Status s = Broadcast(c, nullptr); !s.ok()) return s;
  if (absl::Status s = kv_->AddSequence(seq); !s.ok()) return s;
  history_[seq].clear();
  return absl::OkStatus();
}

void ModelHost::Release(engine::SeqId seq) {
  Command c;
  c.op = Op::kRelease;
  c.seq = seq;
  (void)Broadcast(c, nullptr);
  kv_->FreeSequence(seq);
  history_.erase(seq);
}

specd::internal::v1::ServiceInfo ModelHost::Info() const {
  specd::internal::v1::ServiceInfo info;
  info.set_model(std::filesystem::path(options_.model_path).filename().string());
  info.set_architecture(model_->config().architecture);
  info.set_vocab_size(model_->vocab_size());
  info.set_vocab_fingerprint(tokenizer_->Fingerprint());
  info.set_context_length(model_->config().context_length);
  info.set_kv_block_size(kv_->config().block_size);
  info.set_kv_num_blocks(kv_->num_blocks());
  info.set_kv_used_blocks(kv_->num_used_blocks());
  info.set_max_batch_tokens(options_.max_batch_tokens);
  info.set_num_sequences(static_cast<int32_t>(kv_->num_sequences()));
  info.set_instance_id(instance_id_);
  info.set_world_size(options_.world_size);
  info.set_num_layers(model_->num_layers());
  info.set_model_layers(model_->config().num_layers);
  return info;
}

specd::internal::v1::KvUsage ModelHost::Usage() const {
  specd::internal::v1::KvUsage u;
  u.set_used_blocks(kv_->num_used_blocks());
  u.set_free_blocks(kv_->num_free_blocks());
  u.set_num_sequences(static_cast<int32_t>(kv_->num_sequences()));
  return u;
}

}  // namespace specd::services
