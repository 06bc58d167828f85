#include "speculation/model_drafter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/check.h"

namespace specd::spec {
namespace {

absl::Status CheckMinConfidence(const ModelDrafterOptions& options) {
  for (auto [name, value] : {std::pair<const char*, double>{"min_keep", options.min_keep},
                             {"min_extend", options.min_extend}}) {
    if (!(value >= 0.0 && value <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ModelDrafterOptions: %s must be in [0, 1], got %g", name, value));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::CreateFromFile(
    const std::string& draft_path, const TargetIdentity& target, engine::Backend* backend,
    const ModelDrafterOptions& options) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(draft_path);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("draft model ", draft_path, ": ", file.status().message()));
  }
  absl::StatusOr<std::unique_ptr<tok::Tokenizer>> tk = tok::Tokenizer::FromGguf(**file);
  if (!tk.ok()) {
    return absl::Status(tk.status().code(), absl::StrCat("draft model ", draft_path,
                                                         " tokenizer: ", tk.status().message()));
  }
  if ((*tk)->Fingerprint() != target.vocab_fingerprint ||
      (*tk)->vocab_size() != target.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft model %s and target model %s have different vocabularies (draft: %d tokens, "
        "fingerprint %016x; target: %d tokens, fingerprint %016x); a draft model must share the "
        "target's tokenizer",
        draft_path, target.name, (*tk)->vocab_size(), (*tk)->Fingerprint(), target.vocab_size,
        target.vocab_fingerprint));
  }
  const gguf::GgufFile& ref = **file;
  absl::StatusOr<std::unique_ptr<ModelDrafter>> d =
      Build(std::move(*file), ref, /*layers=*/0, backend, options,
            absl::StrCat("draft-model(", draft_path, ")"), target.file);
  if (!d.ok()) {
    return absl::Status(d.status().code(), absl::StrCat("draft model ", draft_path, " (target ",
                                                        target.name, "): ", d.status().message()));
  }
  return d;
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::CreateSelf(
    const gguf::GgufFile& target_file, int32_t layers, engine::Backend* backend,
    const ModelDrafterOptions& options) {
  absl::StatusOr<engine::ModelConfig> config = engine::ReadModelConfig(target_file);
  if (!config.ok()) return config.status();
  if (layers < 1 || layers >= config->num_layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("self_draft_layers must be in [1, %d) for a %d-layer target, got %d",
                        config->num_layers, config->num_layers, layers));
  }
  return Build(nullptr, target_file, layers, backend, options,
               absl::StrCat("self-draft(", layers, " of ", config->num_layers, " layers)"));
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::Build(
    std::unique_ptr<gguf::GgufFile> owned, const gguf::GgufFile& file, int32_t layers,
    engine::Backend* backend, const ModelDrafterOptions& options, std::string name,
    const gguf::GgufFile* borrow_from) {
  if (options.kv_blocks < 1 || options.block_size < 1 || options.max_batch_tokens < 1 ||
      options.max_sequences < 1 || options.proposal_top_n < 1) {
    return absl::InvalidArgumentError(
        "ModelDrafterOptions: kv_blocks, block_size, max_batch_tokens, max_sequences and "
        "proposal_top_n must be >= 1");
  }
  if (absl::Status st = CheckMinConfidence(options); !st.ok()) return st;
  std::unique_ptr<ModelDrafter> d(new ModelDrafter());
  d->name_ = std::move(name);
  d->options_ = options;
  d->owned_file_ = std::move(owned);
  engine::ModelOptions mo;
  mo.max_batch_tokens = std::max(options.max_batch_tokens, options.max_sequences);
  mo.max_logit_rows = options.max_sequences;
  mo.num_layers = layers;
  mo.borrow_from = borrow_from;
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> m =
      engine::LlamaModel::Load(file, backend, &d->comm_, mo);
  if (!m.ok()) return m.status();
  d->model_ = std::move(*m);
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(
      d->model_->MakeKvCacheConfig(options.kv_blocks, options.block_size, options.kv_dtype));
  if (!kv.ok()) return kv.status();
  d->kv_ = std::move(*kv);
  d->local_ = std::make_unique<engine::LocalModelRunner>(d->model_.get(), d->kv_.get());
  d->runner_ = d->local_.get();
  return d;
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::CreateOnRunner(
    engine::ModelRunner* runner, const ModelDrafterOptions& options, std::string name) {
  if (runner == nullptr) return absl::InvalidArgumentError("ModelDrafter: runner is null");
  if (options.max_batch_tokens < 1 || options.proposal_top_n < 1) {
    return absl::InvalidArgumentError(
        "ModelDrafterOptions: max_batch_tokens and proposal_top_n must be >= 1");
  }
  if (absl::Status st = CheckMinConfidence(options); !st.ok()) return st;
  std::unique_ptr<ModelDrafter> d(new ModelDrafter());
  d->name_ = std::move(name);
  d->options_ = options;
  d->options_.max_sequences = runner->model().options().max_logit_rows;
  d->options_.max_batch_tokens =
      std::min(options.max_batch_tokens, runner->model().options().max_batch_tokens);
  d->runner_ = runner;
  return d;
}

int64_t ModelDrafter::CachedLength(SeqId seq) const {
  absl::StatusOr<int64_t> len = runner_->kv().Length(seq);
  return len.ok() ? *len : -1;
}

const std::vector<int32_t>* ModelDrafter::Fed(SeqId seq) const {
  auto it = fed_.find(seq);
  return it == fed_.end() ? nullptr : &it->second;
}

absl::Status ModelDrafter::RunForward(const sampling::BlockwisePlan* plan) {
  hidden_.resize(batch_.hidden_rows.size() *
                 static_cast<size_t>(model().config().embedding_dim));
  absl::Status st;
  if (plan != nullptr) {
    absl::StatusOr<std::vector<sampling::BlockwiseProposal>> q =
        runner_->ForwardAndPropose(batch_, *plan, options_.proposal_top_n, hidden_.data());
    if (q.ok()) device_q_ = *std::move(q);
    st = q.status();
  } else {
    logits_.resize(batch_.logit_rows.size() * static_cast<size_t>(model().vocab_size()));
    st = runner_->Forward(batch_, logits_.data(), hidden_.data());
  }
  if (!st.ok()) {
    // Forward cut each slice's sequence back to start_pos before it failed.
    for (const engine::SequenceSlice& s : batch_.slices) {
      std::vector<int32_t>& fed = fed_[s.seq];
      if (static_cast<int64_t>(fed.size()) > s.start_pos) fed.resize(s.start_pos);
      if (auto f = features_.find(s.seq); f != features_.end()) {
        f->second.true_len = std::min<int64_t>(f->second.true_len, s.start_pos);
      }
      if (absl::Status t = runner_->Truncate(s.seq, static_cast<int64_t>(fed.size())); !t.ok()) {
        return absl::Status(st.code(), absl::StrCat(st.message(), "; rollback: ", t.message()));
      }
    }
  }
  return st;
}

// A sequence that gets drafts this call, with where its catch-up starts.
struct ModelDrafter::Work {
  size_t idx;                      // into the call's in/out
  int64_t next;                    // next token of in[idx].tokens to feed
  int32_t k;                       // drafts wanted (clipped to the context)
  sampling::PenaltyState history;  // extended with d_1..d_{j-1} when penalties are on
  bool track = false;
  std::vector<float> feature;      // feature-conditioned: the last row's hidden state [D]
  double survival = 1.0;           // product of the proposed drafts' confidences
};

// What every step of one Propose call reads.
struct ModelDrafter::Call {
  absl::Span<const DraftInput> in;
  absl::Span<DraftOutput> out;
  int32_t vocab;
  bool conditioned;  // a feature-conditioned draft
  int64_t dim;       // its hidden state's width
  // The logits stay on the runner's device: each forward's rows are proposed there.
  bool on_device;
};

absl::Status ModelDrafter::Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) {
  SPECD_CHECK(in.size() == out.size(), "Propose: %zu inputs, %zu outputs", in.size(), out.size());
  for (DraftOutput& o : out) o.proposals.clear();
  const Call call{in, out, model().vocab_size(), model().feature_conditioned(),
                  model().config().embedding_dim,
                  runner_->samples_on_device() &&
                      options_.proposal_top_n <= sampling::blockwise::kMaxBlockwiseTopN};
  absl::StatusOr<std::vector<Work>> work = PlanWork(call);
  if (!work.ok()) return work.status();
  absl::Status st = CatchUp(call, *work);
  if (st.ok()) st = DraftRounds(call, *work);
  if (!st.ok()) {
    for (DraftOutput& o : out) o.proposals.clear();  // all of a call's drafts, or none
  }
  return st;
}

absl::StatusOr<std::vector<ModelDrafter::Work>> ModelDrafter::PlanWork(const Call& call) {
  const int32_t ctx = model().config().context_length;
  std::vector<Work> work;
  for (size_t i = 0; i < call.in.size(); ++i) {
    const DraftInput& d = call.in[i];
    const int64_t n = static_cast<int64_t>(d.tokens.size());
    const int32_t k = static_cast<int32_t>(std::min<int64_t>(d.max_tokens, ctx - n));
    if (k <= 0 || n == 0) continue;
    if (!runner_->kv().HasSequence(d.seq)) {
      if (absl::Status st = AddWithCachedPrefix(d.seq, d.tokens); !st.ok()) return st;
    }
    // Re-feed x_n at least: its logits give d_1. Forward rolls the KV back to `next`.
    int64_t next = std::min<int64_t>(CommonPrefix(fed_[d.seq], d.tokens), n - 1);
    if (call.conditioned) {
      // Rows fed drafted features are recomputed; without the target's features: no drafts.
      next = std::min(next, features_[d.seq].true_len);
      if (!KnowsTargetFeatures(d.seq, next, n)) continue;
    }
    // The KV of x_1..x_next is committed: its full blocks may serve other sequences.
    if (absl::Status st = runner_->Publish(d.seq, d.tokens.subspan(0, next)); !st.ok()) {
      return st;
    }
    Work w{i, next, k, {}, false, {}, 1.0};
    if (sampling::HasPenalties(*d.params)) {
      // d_j's distribution counts d_1..d_{j-1}, exactly as the verifier's p_j does.
      w.track = true;
      w.history = *d.history;
    }
    work.push_back(std::move(w));
  }
  if (work.size() > static_cast<size_t>(options_.max_sequences)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("draft batch has %d sequences, more than max_sequences = %d", work.size(),
                        options_.max_sequences));
  }
  return work;
}

// Catch-up (and prefill of new sequences) in chunks of max_batch_tokens; a sequence's last
// chunk ends with x_n and returns the logits row that gives d_1.
absl::Status ModelDrafter::CatchUp(const Call& call, std::vector<Work>& work) {
  std::vector<Work*> pending;
  for (Work& w : work) pending.push_back(&w);
  while (!pending.empty()) {
    std::vector<Work*> finishing, rest;
    BatchCatchUp(call, pending, finishing, rest);
    SPECD_CHECK(!batch_.slices.empty(), "draft catch-up made no progress");
    std::vector<int64_t> positions;
    for (Work* w : finishing) {
      positions.push_back(static_cast<int64_t>(call.in[w->idx].tokens.size()));
    }
    if (absl::Status st = ForwardRows(call, finishing, positions); !st.ok()) return st;
    for (size_t r = 0; r < finishing.size(); ++r) {
      Work& w = *finishing[r];
      if (call.conditioned) KeepCaughtUpFeatures(call, w, r);
      if (absl::Status st = ProposeRow(call, w, r, positions[r]); !st.ok()) return st;
    }
    pending = std::move(rest);
  }
  return absl::OkStatus();
}

// batch_ = the next chunk of each pending sequence within the token budget: `finishing` reach
// x_n (a logits row each), `rest` have more to feed.
void ModelDrafter::BatchCatchUp(const Call& call, absl::Span<Work* const> pending,
                                std::vector<Work*>& finishing, std::vector<Work*>& rest) {
  batch_.Clear();
  int64_t budget = options_.max_batch_tokens;
  for (Work* w : pending) {
    const DraftInput& d = call.in[w->idx];
    const int64_t n = static_cast<int64_t>(d.tokens.size());
    const int64_t take = std::min<int64_t>(n - w->next, budget);
    if (take <= 0) {
      rest.push_back(w);
      continue;
    }
    if (call.conditioned) AppendTargetFeatures(d.seq, w->next, w->next + take);
    if (w->next + take < n) {  // mid-prompt chunk: no logits needed
      batch_.AddPrompt(d.seq, static_cast<int32_t>(w->next), d.tokens.data() + w->next,
                       static_cast<int32_t>(take));
      rest.push_back(w);
    } else {
      batch_.Add(d.seq, static_cast<int32_t>(w->next), d.tokens.data() + w->next,
                 static_cast<int32_t>(take), /*all_logits=*/false);
      if (call.conditioned) batch_.hidden_rows.push_back(batch_.logit_rows.back());
      finishing.push_back(w);
    }
    budget -= take;
    std::vector<int32_t>& fed = fed_[d.seq];
    fed.resize(w->next);
    fed.insert(fed.end(), d.tokens.begin() + w->next, d.tokens.begin() + w->next + take);
    w->next += take;
  }
}

// Row r of a catch-up forward that reached x_n: the draft's hidden state for d_2, and every
// committed row now holds the target's features. The next catch-up starts at row n (feature
// n - 1), or re-feeds row n - 1 (feature n - 2) when nothing new came.
void ModelDrafter::KeepCaughtUpFeatures(const Call& call, Work& w, size_t r) {
  w.feature.assign(hidden_.begin() + r * call.dim, hidden_.begin() + (r + 1) * call.dim);
  SeqFeatures& f = features_[call.in[w.idx].seq];
  f.true_len = static_cast<int64_t>(call.in[w.idx].tokens.size());
  const int64_t drop = std::max<int64_t>(0, f.true_len - 2 - f.base);
  const int64_t have = static_cast<int64_t>(f.rows.size()) / call.dim;
  f.rows.erase(f.rows.begin(), f.rows.begin() + std::min(drop, have) * call.dim);
  f.base += std::min(drop, have);
}

// d_2..d_k: one batched single-token step per draft position.
absl::Status ModelDrafter::DraftRounds(const Call& call, std::vector<Work>& work) {
  for (int32_t j = 1;; ++j) {
    const std::vector<Work*> active = BatchDraftRound(call, work, j);
    if (active.empty()) return absl::OkStatus();
    std::vector<int64_t> positions;
    for (Work* w : active) {
      positions.push_back(static_cast<int64_t>(call.in[w->idx].tokens.size()) + j);
    }
    if (absl::Status st = ForwardRows(call, active, positions); !st.ok()) return st;
    for (size_t r = 0; r < active.size(); ++r) {
      Work& w = *active[r];
      if (call.conditioned) {
        w.feature.assign(hidden_.begin() + r * call.dim, hidden_.begin() + (r + 1) * call.dim);
      }
      if (absl::Status st = ProposeRow(call, w, r, positions[r]); !st.ok()) return st;
    }
  }
}

// batch_ = d_j of every sequence that drafts past it (those are returned), each at its position.
std::vector<ModelDrafter::Work*> ModelDrafter::BatchDraftRound(const Call& call,
                                                               std::vector<Work>& work, int32_t j) {
  batch_.Clear();
  std::vector<Work*> active;
  for (Work& w : work) {
    if (w.k <= j) continue;
    const DraftInput& d = call.in[w.idx];
    const int64_t pos = static_cast<int64_t>(d.tokens.size()) + j - 1;  // of d_j
    const int32_t tok = call.out[w.idx].proposals.back().token;
    batch_.Add(d.seq, static_cast<int32_t>(pos), &tok, 1, false);
    if (call.conditioned) {  // fed the draft's own hidden state of the row before
      batch_.input_features.insert(batch_.input_features.end(), w.feature.begin(),
                                   w.feature.end());
      batch_.hidden_rows.push_back(batch_.logit_rows.back());
    }
    fed_[d.seq].push_back(tok);
    active.push_back(&w);
  }
  return active;
}

// Runs batch_, whose logit rows are `rows` drafting the tokens at `positions`. Where the logits
// stay on the runner's device, they are proposed there: the plan names, per logit row, its
// request's transforms, penalty history and position.
absl::Status ModelDrafter::ForwardRows(const Call& call, absl::Span<Work* const> rows,
                                       absl::Span<const int64_t> positions) {
  if (!call.on_device) return RunForward();
  std::vector<sampling::SamplingParams> params(rows.size());
  std::vector<sampling::SequenceToVerify> seqs(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const DraftInput& d = call.in[rows[r]->idx];
    params[r] = *d.params;
    params[r].num_logprobs = 0;  // a draft reports none
    params[r].seed = d.rng->key()[0] | (static_cast<uint64_t>(d.rng->key()[1]) << 32);
    seqs[r].params = &params[r];
    seqs[r].history = rows[r]->track ? &rows[r]->history : d.history;
    seqs[r].position = positions[r];
    seqs[r].first_logits_row = static_cast<int64_t>(r);
    seqs[r].name = static_cast<int64_t>(d.seq);
  }
  absl::StatusOr<sampling::BlockwisePlan> plan = sampling::BlockwisePlan::Build(call.vocab, seqs);
  if (!plan.ok()) return plan.status();
  return RunForward(&*plan);
}

// Row r of the last forward for work item w, drafting the token at `position`; the chain
// ends there when its confidence falls under min_keep (or, after it, under min_extend).
absl::Status ModelDrafter::ProposeRow(const Call& call, Work& w, size_t r, int64_t position) {
  const DraftInput& d = call.in[w.idx];
  const sampling::PenaltyState& hist = w.track ? w.history : *d.history;
  const bool cut = options_.min_keep > 0.0 || options_.min_extend > 0.0;
  double sure = 1.0;  // sampling::DraftConfidence, from MakeProposal's own pass
  absl::StatusOr<sampling::SparseProposal> q;
  if (call.on_device) {
    q = std::move(device_q_[r].q);
    sure = device_q_[r].confidence;
  } else {
    q = sampling::MakeProposal(
        absl::Span<const float>(logits_.data() + r * static_cast<size_t>(call.vocab), call.vocab),
        hist, *d.params, options_.proposal_top_n, *d.rng, position, cut ? &sure : nullptr);
  }
  if (!q.ok()) return q.status();
  std::vector<sampling::SparseProposal>& proposals = call.out[w.idx].proposals;
  bool extend = true;
  if (cut) {
    const double survival = w.survival * sure;
    if (survival < options_.min_keep) {  // the chain ends before this token
      w.k = static_cast<int32_t>(proposals.size());
      return absl::OkStatus();
    }
    w.survival = survival;
    extend = survival >= options_.min_extend;
  }
  if (w.track) w.history.AddGenerated(q->token);
  proposals.push_back(std::move(*q));
  if (!extend) w.k = static_cast<int32_t>(proposals.size());  // no further round
  return absl::OkStatus();
}

absl::Status ModelDrafter::AddWithCachedPrefix(SeqId seq, absl::Span<const int32_t> tokens) {
  if (absl::Status st = runner_->AddSequence(seq); !st.ok()) return st;
  absl::StatusOr<int64_t> adopted = runner_->AdoptPrefix(seq, tokens);
  if (!adopted.ok()) {
    runner_->FreeSequence(seq);
    return adopted.status();
  }
  fed_[seq].assign(tokens.begin(), tokens.begin() + *adopted);
  // Published rows were all fed the target's features (Propose publishes below true_len only).
  if (wants_features()) features_[seq].true_len = *adopted;
  return absl::OkStatus();
}

absl::Status ModelDrafter::Commit(SeqId seq, absl::Span<const int32_t> committed) {
  auto it = fed_.find(seq);
  if (it == fed_.end()) return absl::OkStatus();
  std::vector<int32_t>& fed = it->second;
  fed.resize(CommonPrefix(fed, committed));
  if (auto f = features_.find(seq); f != features_.end()) {
    f->second.true_len = std::min<int64_t>(f->second.true_len, fed.size());
  }
  return runner_->Truncate(seq, static_cast<int64_t>(fed.size()));
}

void ModelDrafter::Release(SeqId seq) {
  fed_.erase(seq);
  features_.erase(seq);
  runner_->FreeSequence(seq);
}

void ModelDrafter::AddFeatures(SeqId seq, int32_t first_pos, absl::Span<const float> rows) {
  const int64_t dim = model().config().embedding_dim;
  if (!wants_features() || rows.size() % dim != 0) return;
  SeqFeatures& f = features_[seq];
  const int64_t end = f.base + static_cast<int64_t>(f.rows.size()) / dim;
  if (first_pos < f.base || first_pos > end) {  // starts over (a re-prefill, or a gap)
    f.base = first_pos;
    f.rows.clear();
  } else {
    f.rows.resize((first_pos - f.base) * dim);  // re-sent positions overwrite
  }
  f.rows.insert(f.rows.end(), rows.begin(), rows.end());
}

bool ModelDrafter::KnowsTargetFeatures(SeqId seq, int64_t from, int64_t to) const {
  // Rows [from, to) read the target's hidden states at [from - 1, to - 1); row 0 reads zeros.
  const int64_t first = std::max<int64_t>(from - 1, 0), last = to - 2;
  if (last < first) return true;
  auto it = features_.find(seq);
  if (it == features_.end()) return false;
  const int64_t dim = model().config().embedding_dim;
  const SeqFeatures& f = it->second;
  return first >= f.base && last < f.base + static_cast<int64_t>(f.rows.size()) / dim;
}

void ModelDrafter::AppendTargetFeatures(SeqId seq, int64_t from, int64_t to) {
  const int64_t dim = model().config().embedding_dim;
  const SeqFeatures& f = features_.at(seq);
  std::vector<float>& out = batch_.input_features;
  for (int64_t t = from; t < to; ++t) {
    if (t == 0) {
      out.insert(out.end(), dim, 0.0f);
      continue;
    }
    const float* row = f.rows.data() + (t - 1 - f.base) * dim;
    out.insert(out.end(), row, row + dim);
  }
}

}  // namespace specd::spec
