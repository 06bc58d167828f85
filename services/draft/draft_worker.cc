#include "services/draft/draft_worker.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/engine/forward_batch.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "services/common/proto_convert.h"

namespace specd::services {

namespace iv1 = specd::internal::v1;

namespace {

// One sequence in flight through a draft step.
struct Work {
  int index = 0;                    // into the request
  int64_t seq = 0;
  int32_t k = 0;
  int32_t n_prompt = 0;
  sampling::SamplingParams params;
  std::vector<int32_t>* hist = nullptr;  // tokens whose KV is written
  std::vector<int32_t> pending;     // catch-up tokens not yet run
  int64_t pending_pos = 0;          // position of pending[0]
  std::vector<float> row;           // logits for the next position
  sampling::PenaltyState penalties;
};

}  // namespace

absl::StatusOr<iv1::DraftStepResponse> DraftWorker::Step(const iv1::DraftStepRequest& request) {
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t vocab = host_->vocab_size();
  const int64_t ctx = host_->context_length();
  const int32_t budget = host_->options().max_batch_tokens;
  absl::flat_hash_set<int64_t> seen;
  for (int i = 0; i < request.sequences_size(); ++i) {
    const iv1::DraftSequenceStep& s = request.sequences(i);
    const std::string where = absl::StrCat("sequences[", i, "]");
    if (!seen.insert(s.seq_id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".seq_id repeated"));
    }
    if (s.start_pos() < 0 || s.tokens_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": needs start_pos >= 0 and tokens"));
    }
    if (s.num_draft_tokens() < 1 || s.num_draft_tokens() > kMaxDraftTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".num_draft_tokens must be in [1, ", kMaxDraftTokens, "]"));
    }
    for (int32_t t : s.tokens()) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".tokens: id ", t, " out of range"));
      }
    }
    if (s.start_pos() + s.tokens_size() + s.num_draft_tokens() > ctx) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": exceeds the context length"));
    }
    if (absl::Status st = sampling::Validate(FromProto(s.sampling()), vocab); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".sampling: ", st.message()));
    }
  }

  iv1::DraftStepResponse response;
  response.set_instance_id(host_->instance_id());
  std::vector<Work> work;
  for (int i = 0; i < request.sequences_size(); ++i) {
    const iv1::DraftSequenceStep& s = request.sequences(i);
    iv1::DraftSequenceResult* r = response.add_sequences();
    r->set_seq_id(s.seq_id());
    std::vector<int32_t>* hist = host_->History(s.seq_id());
    const int64_t held = hist == nullptr ? 0 : static_cast<int64_t>(hist->size());
    if (s.start_pos() > held) {
      if (hist != nullptr) host_->Release(s.seq_id());
      r->set_needs_prefill(true);
      continue;
    }
    if (hist == nullptr) {
      if (absl::Status st = host_->AddSequence(s.seq_id()); !st.ok()) return st;
      hist = host_->History(s.seq_id());
    }
    Work w;
    w.index = i;
    w.seq = s.seq_id();
    w.k = s.num_draft_tokens();
    w.params = FromProto(s.sampling());
    w.hist = hist;
    // Keep the KV that still matches the committed tokens, but always re-run the last committed
    // token: its logits give q_1.
    const int64_t n = s.start_pos() + s.tokens_size();
    int64_t valid = s.start_pos();
    while (valid < held && valid - s.start_pos() < s.tokens_size() &&
           (*hist)[valid] == s.tokens(static_cast<int>(valid - s.start_pos()))) {
      ++valid;
    }
    valid = std::min(valid, n - 1);
    hist->resize(valid);
    w.pending.assign(s.tokens().begin() + (valid - s.start_pos()), s.tokens().end());
    w.pending_pos = valid;
    w.n_prompt = std::min<int32_t>(s.num_prompt_tokens(), n);
    work.push_back(std::move(w));
  }

  // Runs one batch; `take` says how many pending tokens of each work item go in (0 = none).
  engine::ForwardBatch batch;
  auto run = [&](const std::vector<std::pair<Work*, std::vector<int32_t>>>& items) -> absl::Status {
    batch.Clear();
    for (const auto& [w, ids] : items) {
      batch.Add(w->seq, static_cast<int32_t>(w->hist->size()), ids.data(),
                static_cast<int32_t>(ids.size()), false);
    }
    logits_.resize(batch.logit_rows.size() * size_t(vocab));
    if (absl::Status st = host_->Forward(batch, logits_.data()); !st.ok()) {
      return st;
    }
    for (size_t j = 0; j < items.size(); ++j) {
      Work* w = items[j].first;
      w->hist->insert(w->hist->end(), items[j].second.begin(), items[j].second.end());
      w->row.assign(logits_.begin() + j * vocab, logits_.begin() + (j + 1) * vocab);
    }
    return absl::OkStatus();
  };

  // Catch-up: pack pending tokens into batches of at most `budget` tokens.
  for (;;) {
    std::vector<std::pair<Work*, std::vector<int32_t>>> items;
    int32_t used = 0;
    for (Work& w : work) {
      if (w.pending.empty() || used >= budget) continue;
      const int32_t take = std::min<int32_t>(budget - used, w.pending.size());
      items.emplace_back(&w, std::vector<int32_t>(w.pending.begin(), w.pending.begin() + take));
      w.pending.erase(w.pending.begin(), w.pending.begin() + take);
      used += take;
    }
    if (items.empty()) break;
    if (absl::Status st = run(items); !st.ok()) return st;
  }

  for (Work& w : work) {
    w.penalties = sampling::PenaltyState::FromTokens(
        absl::MakeConstSpan(w.hist->data(), w.n_prompt),
        absl::MakeConstSpan(w.hist->data() + w.n_prompt, w.hist->size() - w.n_prompt));
  }
  // Draft rounds: propose d_j from the current row, then run d_j (except the last) for the next.
  const int32_t top_n = sampling::kDefaultProposalTopN;
  int32_t max_k = 0;
  for (const Work& w : work) max_k = std::max(max_k, w.k);
  for (int32_t j = 0; j < max_k; ++j) {
    std::vector<std::pair<Work*, std::vector<int32_t>>> items;
    for (Work& w : work) {
      if (j >= w.k) continue;
      const int64_t position = static_cast<int64_t>(w.hist->size());
      absl::StatusOr<sampling::SparseProposal> p =
          sampling::MakeProposal(w.row, w.penalties, w.params, top_n,
                                 sampling::CounterRng(w.params.seed), position);
      if (!p.ok()) return p.status();
      ToProto(*p, response.mutable_sequences(w.index)->add_proposals());
      w.penalties.AddGenerated(p->token);
      if (j + 1 < w.k) items.emplace_back(&w, std::vector<int32_t>{p->token});
    }
    if (items.empty()) break;
    if (absl::Status st = run(items); !st.ok()) return st;
  }
  *response.mutable_kv() = host_->Usage();
  response.set_forward_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return response;
}

iv1::ReleaseResponse DraftWorker::Release(const iv1::ReleaseRequest& request) {
  for (int64_t id : request.seq_ids()) host_->Release(id);
  iv1::ReleaseResponse r;
  *r.mutable_kv() = host_->Usage();
  return r;
}

}  // namespace specd::services
