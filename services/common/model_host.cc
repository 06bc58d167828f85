#include "services/common/model_host.h"

#include "engine/backend_factory.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "engine/gloo_communicator.h"

namespace specd::services {

enum class Op : int32_t {
  kForward, kAddSequence, kRelease, kTruncate, kAdoptPrefix, kPublish, kDropCache, kStop,
  kHeartbeat  // rank processes, idle: a rank that hung fails the round trip (tp_timeout_s)
};

struct ModelHost::Command {
  Op op = Op::kStop;
  engine::SeqId seq = 0;
  // kForward: sizes of the batch that follows; kAdoptPrefix / kPublish: `tokens` ids follow.
  int32_t tokens = 0, slices = 0, rows = 0;
  int64_t length = 0;                        // kTruncate
};

struct ModelHost::Rank {
  std::unique_ptr<engine::Communicator> comm;
  // Rank processes: the longest rank 0 may stay silent (heartbeat + the collective timeout).
  std::chrono::milliseconds command_wait{0};
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

// Every rank's status of the same operation, on every rank: the codes meet in one all-reduce
// (slot r holds rank r's code), then the lowest failing rank broadcasts its message. The
// caller's own failure comes back unchanged; another rank's is named "rank r: ...".
absl::Status GatherStatus(engine::Communicator& comm, const absl::Status& mine) {
  const int world = comm.world_size();
  std::vector<float> codes(world, 0.0f);
  codes[comm.rank()] = static_cast<float>(static_cast<int>(mine.code()));
  if (absl::Status s = comm.AllReduceSum(codes.data(), world); !s.ok()) return s;
  for (int r = 0; r < world; ++r) {
    if (codes[r] == 0.0f) continue;
    char message[256] = {};
    if (r == comm.rank()) {
      const absl::string_view m = mine.message();
      std::memcpy(message, m.data(), std::min(m.size(), sizeof(message) - 1));
    }
    if (absl::Status s = comm.Broadcast(message, sizeof(message), r); !s.ok()) return s;
    if (r == comm.rank()) return mine;
    return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(codes[r])),
                        absl::StrCat("rank ", r, ": ", message));
  }
  return absl::OkStatus();
}

// What every rank checks before a forward, so that none enters a collective the others skip.
absl::Status CheckForward(const engine::LlamaModel& model, const engine::ForwardBatch& batch,
                          const engine::PagedKvCache& kv, bool inject_fault) {
  if (inject_fault) return absl::InternalError("injected forward fault");
  return model.Validate(batch, kv);
}

// What a cached block's KV depends on besides its tokens: the weights (file, layers run) and
// the slice of heads this rank holds. Mixed into every block hash.
uint64_t CacheSalt(const gguf::GgufFile& file, const ModelHostOptions& options,
                   const engine::Communicator& comm) {
  const std::string id = absl::StrCat(std::filesystem::path(options.model_path).filename().string(),
                                      "|", file.tensors().size(), "|", options.num_layers, "|",
                                      static_cast<int>(options.kv_dtype), "|", comm.rank(), "/",
                                      comm.world_size());
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  return h;
}

absl::StatusOr<Shard> LoadShard(const gguf::GgufFile& file, const gguf::GgufFile* borrow,
                                const ModelHostOptions& options, engine::Communicator* comm,
                                int32_t threads) {
  Shard s;
  absl::StatusOr<std::unique_ptr<engine::Backend>> backend =
      options.make_backend ? options.make_backend() : engine::MakeBackend(options.device, threads);
  if (!backend.ok()) return backend.status();
  s.backend = std::move(*backend);
  engine::ModelOptions mo;
  mo.max_batch_tokens = options.max_batch_tokens;
  mo.max_logit_rows = options.max_batch_tokens;
  mo.num_layers = options.num_layers;
  mo.borrow_from = borrow;
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> model =
      engine::LlamaModel::Load(file, s.backend.get(), comm, mo);
  if (!model.ok()) return model.status();
  s.model = std::move(*model);
  engine::KvCacheConfig kc =
      s.model->MakeKvCacheConfig(options.kv_blocks, options.kv_block_size, options.kv_dtype);
  kc.prefix_caching = options.prefix_caching;
  kc.cache_salt = CacheSalt(file, options, *comm);
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(kc);
  if (!kv.ok()) return kv.status();
  s.kv = std::move(*kv);
  return s;
}

}  // namespace

namespace {

// What every rank of a host opens before it loads its shard: the model file, its tokenizer and
// the file a distilled draft borrows tensors from (same vocabulary, checked). Rank 0 (Load) and
// the other rank processes (ServeRank) both come through here, so a rank process refuses a
// wrong --borrow-from as rank 0 does.
struct ModelFiles {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  std::unique_ptr<gguf::GgufFile> borrow;  // options.borrow_path, if set
};

absl::StatusOr<ModelFiles> OpenModelFiles(const ModelHostOptions& options) {
  ModelFiles m;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(options.model_path);
  if (!file.ok()) return file.status();
  m.file = std::move(*file);
  absl::StatusOr<std::unique_ptr<tok::Tokenizer>> tk = tok::Tokenizer::FromGguf(*m.file);
  if (!tk.ok()) return tk.status();
  m.tokenizer = std::move(*tk);
  if (options.borrow_path.empty()) return m;
  const std::string& path = options.borrow_path;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> borrow = gguf::GgufFile::Open(path);
  if (!borrow.ok()) {
    return absl::Status(borrow.status().code(),
                        absl::StrCat("--borrow-from ", path, ": ", borrow.status().message()));
  }
  absl::StatusOr<std::unique_ptr<tok::Tokenizer>> btk = tok::Tokenizer::FromGguf(**borrow);
  if (!btk.ok()) {
    return absl::Status(btk.status().code(),
                        absl::StrCat("--borrow-from ", path, ": ", btk.status().message()));
  }
  if ((*btk)->Fingerprint() != m.tokenizer->Fingerprint()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model %s and --borrow-from %s have different vocabularies (fingerprints %016x and "
        "%016x): a draft borrows tensors only from its own target",
        options.model_path, path, m.tokenizer->Fingerprint(), (*btk)->Fingerprint()));
  }
  m.borrow = std::move(*borrow);
  return m;
}

// CPU threads of one rank: thread ranks share this process's cores, a rank process has its own.
int32_t ThreadsPerRank(const ModelHostOptions& options) {
  const int32_t cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int32_t shares = options.rendezvous.empty() ? options.world_size : 1;
  return std::max(1, (options.threads > 0 ? options.threads : cores) / shares);
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
  absl::StatusOr<ModelFiles> files = OpenModelFiles(options);
  if (!files.ok()) return files.status();
  h->file_ = std::move(files->file);
  h->tokenizer_ = std::move(files->tokenizer);
  h->borrow_file_ = std::move(files->borrow);
  const int32_t N = options.world_size;
  const int32_t threads = ThreadsPerRank(options);
  engine::Communicator* comm0 = &h->local_comm_;
  if (N > 1 && !options.rendezvous.empty()) {
    // Rank processes: this one is rank 0; the others run ServeRank in their own processes.
    if (options.rank != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", options.rank, ": only rank 0 hosts the model service (ServeRank runs the others)"));
    }
    absl::StatusOr<std::unique_ptr<engine::GlooCommunicator>> comm =
        engine::GlooCommunicator::Connect(MakeGlooOptions(options));
    if (!comm.ok()) return comm.status();
    h->comm_ = std::move(*comm);
    comm0 = h->comm_.get();
    h->group_running_ = true;  // the rank processes now wait for commands
  } else if (N > 1) {
    h->group_ = std::make_unique<engine::ThreadGroup>(N);
    h->comm_ = h->group_->Rank(0);
    comm0 = h->comm_.get();
  }
  // Loading is local to each rank (it only slices the mmap'd weights): no collectives yet.
  absl::StatusOr<Shard> shard =
      LoadShard(*h->file_, h->borrow_file_.get(), options, comm0, threads);
  if (!shard.ok()) return shard.status();
  h->backend_ = std::move(shard->backend);
  h->model_ = std::move(shard->model);
  h->kv_ = std::move(shard->kv);
  for (int32_t r = 1; r < N && h->group_ != nullptr; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->comm = h->group_->Rank(r);
    absl::StatusOr<Shard> s =
        LoadShard(*h->file_, h->borrow_file_.get(), options, rank->comm.get(), threads);
    if (!s.ok()) return s.status();  // threads start only once every rank has loaded
    rank->backend = std::move(s->backend);
    rank->model = std::move(s->model);
    rank->kv = std::move(s->kv);
    rank->logits.resize(static_cast<size_t>(options.max_batch_tokens) * rank->model->vocab_size());
    h->ranks_.push_back(std::move(rank));
  }
  h->group_running_ = !h->ranks_.empty() || h->group_running_;
  for (auto& rank : h->ranks_) {
    rank->thread = std::thread([r = rank.get(), fault = options.inject_forward_fault_on_rank] {
      // Ignored: a thread rank ends on a broken communicator, which rank 0's next collective
      // reports to its caller.
      (void)RankLoop(r, fault);
    });
  }
  for (int32_t id = 0; id < h->tokenizer_->vocab_size(); ++id) {
    if (h->tokenizer_->IsEndOfGeneration(id)) h->eos_ids_.push_back(id);
  }
  std::random_device rd;
  h->instance_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  if (N > 1 && !options.rendezvous.empty()) {
    h->heartbeat_ = std::thread(&ModelHost::HeartbeatLoop, h.get());
  }
  return h;
}

ModelHost::GroupOp::GroupOp(ModelHost* host) : host_(host) {
  host_->group_mu_.Lock();
  host_->last_group_op_ = absl::Now();
}

ModelHost::GroupOp::~GroupOp() { host_->group_mu_.Unlock(); }

// Rank processes: while no operation has gone to the group for a second, a heartbeat does. A
// rank that died is noticed by the liveness line already; this catches one that hangs: the
// round trip times out (tp_timeout_s), which breaks the group loudly (on_group_broken).
void ModelHost::HeartbeatLoop() {
  absl::MutexLock l(&group_mu_);
  for (;;) {
    const absl::Time due = last_group_op_ + absl::Seconds(1);
    group_mu_.AwaitWithDeadline(absl::Condition(&stopping_), due);
    if (stopping_) return;
    if (absl::Now() < last_group_op_ + absl::Seconds(1)) continue;  // an operation came
    last_group_op_ = absl::Now();
    Command c;
    c.op = Op::kHeartbeat;
    absl::Status st = Broadcast(c, nullptr);
    if (st.ok()) st = GatherStatus(*comm_, absl::OkStatus());
    if (!st.ok()) return;  // the communicator reported it (on_group_broken)
  }
}

ModelHost::~ModelHost() {
  if (!group_running_) return;  // one rank, or a load that failed before the ranks ran
  if (heartbeat_.joinable()) {
    {
      absl::MutexLock l(&group_mu_);
      stopping_ = true;
    }
    heartbeat_.join();
  }
  // A stop on purpose: the rank processes end now, which is not a lost rank.
  if (auto* gloo = dynamic_cast<engine::GlooCommunicator*>(comm_.get())) gloo->Disarm();
  Command stop;
  stop.op = Op::kStop;
  // Ignored: a failing broadcast fails on the receiving ranks too, and their loops return on
  // it, so the joins below finish either way.
  (void)Broadcast(stop, nullptr);
  for (auto& rank : ranks_) rank->thread.join();
}

absl::Status ModelHost::Broadcast(Command& c, const engine::ForwardBatch* batch) {
  if (Single()) return absl::OkStatus();
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

// Ranks > 0: wait for rank 0's command, do the same on this shard, report the status. A
// broken communicator ends the loop with its error (rank 0's next collective fails too);
// rank 0's stop ends it with OK.
absl::Status ModelHost::RankLoop(Rank* rank, int32_t fault_rank) {
  engine::ForwardBatch batch;
  engine::Communicator& comm = *rank->comm;
  auto* gloo = dynamic_cast<engine::GlooCommunicator*>(&comm);
  const bool fault = comm.rank() == fault_rank;
  for (;;) {
    Command c;
    // A rank process hears from rank 0 at least once a second while idle (the heartbeat) and
    // more often while busy, so a longer silence means rank 0 hangs: the wait times out and
    // the group breaks. (Rank 0's death reaches it at once through the liveness line.)
    absl::Status got = gloo != nullptr
                           ? gloo->BroadcastWithTimeout(&c, sizeof(c), 0, rank->command_wait)
                           : comm.Broadcast(&c, sizeof(c), 0);
    if (!got.ok()) return got;
    absl::Status st;
    switch (c.op) {
      case Op::kStop:
        if (gloo != nullptr) gloo->Disarm();
        return absl::OkStatus();
      case Op::kAddSequence:
        st = rank->kv->AddSequence(c.seq);
        break;
      case Op::kRelease:
        rank->kv->FreeSequence(c.seq);
        continue;  // cannot fail: nothing to report
      case Op::kTruncate:
        st = rank->kv->Truncate(c.seq, c.length);
        break;
      case Op::kAdoptPrefix:
      case Op::kPublish: {
        batch.tokens.resize(c.tokens);
        if (absl::Status b = comm.Broadcast(batch.tokens.data(), c.tokens * sizeof(int32_t), 0);
            !b.ok()) {
          return b;
        }
        if (c.op == Op::kPublish) {
          st = rank->kv->Publish(c.seq, batch.tokens);
          break;
        }
        absl::StatusOr<int64_t> adopted = rank->kv->AdoptPrefix(c.seq, batch.tokens);
        // Every rank holds the same blocks, so every rank adopts as many; a difference is a bug.
        st = !adopted.ok()          ? adopted.status()
             : *adopted != c.length ? absl::InternalError(absl::StrCat(
                                          "adopted ", *adopted, " tokens, rank 0 ", c.length))
                                    : absl::OkStatus();
        break;
      }
      case Op::kDropCache:
        rank->kv->DropCache();
        continue;  // cannot fail: nothing to report
      case Op::kHeartbeat:
        break;  // answered by the status round trip below
      case Op::kForward: {
        batch.tokens.resize(c.tokens);
        batch.slices.resize(c.slices);
        batch.logit_rows.resize(c.rows);
        const std::pair<void*, size_t> parts[] = {
            {batch.tokens.data(), c.tokens * sizeof(int32_t)},
            {batch.slices.data(), c.slices * sizeof(engine::SequenceSlice)},
            {batch.logit_rows.data(), c.rows * sizeof(int32_t)}};
        for (const auto& [data, bytes] : parts) {
          if (absl::Status b = comm.Broadcast(data, static_cast<int64_t>(bytes), 0); !b.ok()) {
            return b;
          }
        }
        st = GatherStatus(comm, CheckForward(*rank->model, batch, *rank->kv, fault));
        if (!st.ok()) continue;  // every rank skips this forward
        st = rank->model->Forward(batch, *rank->kv, rank->logits.data());
        break;
      }
    }
    if (absl::Status gathered = GatherStatus(comm, st); !gathered.ok()) {
      // An operation's failure is rank 0's to return to its caller; this rank goes on. Only
      // a broken communicator ends the loop (the next collective reports it).
    }
  }
}

engine::GlooOptions ModelHost::MakeGlooOptions(const ModelHostOptions& options) {
  engine::GlooOptions g;
  g.rank = options.rank;
  g.world_size = options.world_size;
  g.rendezvous = options.rendezvous;
  g.bind_address = options.tp_bind_address;
  g.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.tp_timeout_s * 1000));
  g.connect_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(options.tp_connect_timeout_s * 1000));
  g.on_broken = options.on_group_broken;
  return g;
}

absl::Status ModelHost::ServeRank(const ModelHostOptions& options) {
  if (options.world_size < 2 || options.rank < 1 || options.rank >= options.world_size ||
      options.rendezvous.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a rank process needs --rank in [1, --world-size) and --rendezvous; got rank ",
        options.rank, " of ", options.world_size));
  }
  absl::StatusOr<ModelFiles> files = OpenModelFiles(options);
  if (!files.ok()) return files.status();
  absl::StatusOr<std::unique_ptr<engine::GlooCommunicator>> comm =
      engine::GlooCommunicator::Connect(MakeGlooOptions(options));
  if (!comm.ok()) return comm.status();
  Rank rank;
  rank.comm = std::move(*comm);
  rank.command_wait =
      std::chrono::milliseconds(static_cast<int64_t>((options.tp_timeout_s + 5) * 1000));
  absl::StatusOr<Shard> shard =
      LoadShard(*files->file, files->borrow.get(), options, rank.comm.get(), ThreadsPerRank(options));
  if (!shard.ok()) return shard.status();
  rank.backend = std::move(shard->backend);
  rank.model = std::move(shard->model);
  rank.kv = std::move(shard->kv);
  rank.logits.resize(static_cast<size_t>(options.max_batch_tokens) * rank.model->vocab_size());
  return RankLoop(&rank, options.inject_forward_fault_on_rank);
}

absl::Status ModelHost::Forward(const engine::ForwardBatch& batch, float* logits,
                               float* hidden) {
  GroupOp op(this);
  Command c;
  c.op = Op::kForward;
  c.tokens = static_cast<int32_t>(batch.tokens.size());
  c.slices = static_cast<int32_t>(batch.slices.size());
  c.rows = static_cast<int32_t>(batch.logit_rows.size());
  const bool fault = options_.inject_forward_fault_on_rank == 0;
  if (Single()) {
    if (fault) return CheckForward(*model_, batch, *kv_, fault);
    return model_->Forward(batch, *kv_, logits, hidden);
  }
  // Only rank 0 returns hidden rows (every rank holds the whole residual after the all-reduce);
  // a feature-conditioned draft loads on one rank only, so input_features never get here.
  if (absl::Status s = Broadcast(c, &batch); !s.ok()) return s;
  if (absl::Status s = GatherStatus(*comm_, CheckForward(*model_, batch, *kv_, fault)); !s.ok()) {
    return s;
  }
  return GatherStatus(*comm_, model_->Forward(batch, *kv_, logits, hidden));
}

bool ModelHost::samples_on_device() const {
  return Single() && options_.inject_forward_fault_on_rank != 0 &&
         model_->keeps_logits_on_backend();
}

absl::StatusOr<std::vector<sampling::VerifyResult>> ModelHost::ForwardAndVerify(
    const engine::ForwardBatch& batch, const sampling::BlockwisePlan& plan, float* hidden) {
  if (!samples_on_device()) return engine::ModelRunner::ForwardAndVerify(batch, plan, hidden);
  GroupOp op(this);
  if (absl::Status st = model_->Forward(batch, *kv_, nullptr, hidden); !st.ok()) return st;
  return model_->backend()->VerifyBlockwise(plan, model_->step_logits(),
                                            static_cast<int64_t>(batch.logit_rows.size()));
}

absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ModelHost::ForwardAndPropose(
    const engine::ForwardBatch& batch, const sampling::BlockwisePlan& plan, int32_t top_n,
    float* hidden) {
  if (!samples_on_device()) {
    return engine::ModelRunner::ForwardAndPropose(batch, plan, top_n, hidden);
  }
  GroupOp op(this);
  if (absl::Status st = model_->Forward(batch, *kv_, nullptr, hidden); !st.ok()) return st;
  return model_->backend()->ProposeBlockwise(
      plan, model_->step_logits(), static_cast<int64_t>(batch.logit_rows.size()), top_n);
}

std::vector<int32_t>* ModelHost::History(engine::SeqId seq) {
  auto it = history_.find(seq);
  return it == history_.end() ? nullptr : &it->second;
}

absl::Status ModelHost::AddSequence(engine::SeqId seq) {
  GroupOp op(this);
  Command c;
  c.op = Op::kAddSequence;
  c.seq = seq;
  if (absl::Status s = Broadcast(c, nullptr); !s.ok()) return s;
  absl::Status st = kv_->AddSequence(seq);
  if (!Single()) st = GatherStatus(*comm_, st);
  if (!st.ok()) return st;
  history_[seq].clear();
  return absl::OkStatus();
}

absl::Status ModelHost::Truncate(engine::SeqId seq, int64_t length) {
  GroupOp op(this);
  Command c;
  c.op = Op::kTruncate;
  c.seq = seq;
  c.length = length;
  if (absl::Status s = Broadcast(c, nullptr); !s.ok()) return s;
  absl::Status st = kv_->Truncate(seq, length);
  return Single() ? st : GatherStatus(*comm_, st);
}

absl::Status ModelHost::BroadcastTokens(Command& c, absl::Span<const int32_t> tokens) {
  if (Single()) return absl::OkStatus();
  c.tokens = static_cast<int32_t>(tokens.size());
  if (absl::Status s = comm_->Broadcast(&c, sizeof(c), 0); !s.ok()) return s;
  // The other ranks only read: const_cast only for the collective's signature.
  return comm_->Broadcast(const_cast<int32_t*>(tokens.data()), tokens.size() * sizeof(int32_t),
                          0);
}

absl::StatusOr<int64_t> ModelHost::AdoptPrefix(engine::SeqId seq,
                                               absl::Span<const int32_t> prompt) {
  GroupOp op(this);
  // Rank 0 adopts first and tells the others how many it took, so they can check theirs.
  // A failure here (an unknown or non-empty sequence) changed nothing on rank 0; the others
  // are not asked.
  absl::StatusOr<int64_t> adopted = kv_->AdoptPrefix(seq, prompt);
  if (Single() || !adopted.ok()) return adopted;
  Command c;
  c.op = Op::kAdoptPrefix;
  c.seq = seq;
  c.length = *adopted;
  if (absl::Status s = BroadcastTokens(c, prompt); !s.ok()) return s;
  absl::Status st = GatherStatus(*comm_, adopted.status());
  if (!st.ok()) return st;
  return adopted;
}

absl::Status ModelHost::Publish(engine::SeqId seq, absl::Span<const int32_t> committed) {
  GroupOp op(this);
  // Nothing new to publish (caching off, or no new full block): a no-op on every rank.
  if (!kv_->config().prefix_caching ||
      static_cast<int64_t>(committed.size()) / kv_->config().block_size <=
          kv_->num_committed_blocks(seq)) {
    return absl::OkStatus();
  }
  Command c;
  c.op = Op::kPublish;
  c.seq = seq;
  if (absl::Status s = BroadcastTokens(c, committed); !s.ok()) return s;
  absl::Status st = kv_->Publish(seq, committed);
  return Single() ? st : GatherStatus(*comm_, st);
}

void ModelHost::DropPrefixCache() {
  GroupOp op(this);
  Command c;
  c.op = Op::kDropCache;
  // Ignored: a broadcast fails only when the communicator is broken, and then every later
  // Forward fails with that error too; rank 0's own cache is dropped regardless.
  (void)Broadcast(c, nullptr);
  kv_->DropCache();
}

void ModelHost::Release(engine::SeqId seq) {
  GroupOp op(this);
  Command c;
  c.op = Op::kRelease;
  c.seq = seq;
  // Ignored: a broadcast fails only when the communicator is broken, and then every later
  // Forward fails with that error too; rank 0's own state is released regardless.
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
  info.set_weight_bytes(model_->weight_bytes() * static_cast<uint64_t>(options_.world_size));
  info.set_prefix_caching(kv_->config().prefix_caching);
  info.set_feature_conditioned(model_->feature_conditioned());
  info.set_embedding_dim(model_->config().embedding_dim);
  return info;
}

specd::internal::v1::KvUsage ModelHost::Usage() const {
  specd::internal::v1::KvUsage u;
  u.set_used_blocks(kv_->num_used_blocks());
  u.set_free_blocks(kv_->num_free_blocks());
  u.set_num_sequences(static_cast<int32_t>(kv_->num_sequences()));
  u.set_adopted_blocks(kv_->num_adopted_blocks());
  u.set_cached_blocks(kv_->num_cached_blocks());
  u.set_evictable_blocks(kv_->num_evictable_blocks());
  const engine::PrefixCacheStats& st = kv_->prefix_stats();
  u.set_prefix_lookups(st.lookups);
  u.set_prefix_queried_tokens(st.queried_tokens);
  u.set_prefix_hit_tokens(st.hit_tokens);
  u.set_prefix_evictions(st.evictions);
  return u;
}

}  // namespace specd::services
