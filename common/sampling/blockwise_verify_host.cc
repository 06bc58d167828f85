#include "common/sampling/blockwise_verify_host.h"

#include <algorithm>
#include <barrier>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"

namespace specd::sampling {

static_assert(blockwise::kGreedyTemperatureValue == kGreedyTemperature);
static_assert(blockwise::kResidualEpsilonValue == kResidualEpsilon);
static_assert(blockwise::kMaxLogprobsValue == kMaxLogprobs);
static_assert(static_cast<uint32_t>(RngPurpose::kSample) == 0 &&
              static_cast<uint32_t>(RngPurpose::kAccept) == 2 &&
              static_cast<uint32_t>(RngPurpose::kResample) == 3);

namespace {

absl::Status ValidateSequence(const SequenceToVerify& s, int32_t vocab) {
  if (s.params == nullptr) return absl::InvalidArgumentError("params is null");
  if (absl::Status st = Validate(*s.params, vocab); !st.ok()) return st;
  for (size_t i = 0; i < s.proposals.size(); ++i) {
    const SparseProposal& q = s.proposals[i];
    if (IsGreedy(*s.params)) {
      if (q.token < 0 || q.token >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("proposals[", i, "].token = ", q.token, " is outside the vocabulary"));
      }
    } else if (absl::Status st = ValidateProposal(q, vocab); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("proposals[", i, "]: ", st.message()));
    }
  }
  if (s.first_logits_row < 0) return absl::InvalidArgumentError("first_logits_row is negative");
  return absl::OkStatus();
}

blockwise::Transforms TransformsOf(const SamplingParams& p) {
  blockwise::Transforms t;
  t.temperature = p.temperature;
  t.top_k = p.top_k;
  t.top_p = p.top_p;
  t.min_p = p.min_p;
  t.penalties = FactorsOf(p);
  t.has_penalties = HasPenalties(p) ? 1 : 0;
  t.num_logprobs = p.num_logprobs;
  t.seed = p.seed;
  return t;
}

}  // namespace

absl::StatusOr<BlockwisePlan> BlockwisePlan::Build(int32_t vocab,
                                                   absl::Span<const SequenceToVerify> sequences) {
  BlockwisePlan plan;
  plan.vocab_ = vocab;
  for (size_t si = 0; si < sequences.size(); ++si) {
    const SequenceToVerify& s = sequences[si];
    const int64_t name = s.name >= 0 ? s.name : static_cast<int64_t>(si);
    if (absl::Status st = ValidateSequence(s, vocab); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("sequence ", name, ": ", st.message()));
    }
    plan.names_.push_back(name);
    const SamplingParams& params = *s.params;
    const int32_t transforms = static_cast<int32_t>(plan.transforms_.size());
    plan.transforms_.push_back(TransformsOf(params));

    blockwise::SeqPlan seq;
    seq.first_row = static_cast<int32_t>(plan.rows_.size());
    seq.num_drafts = static_cast<int32_t>(s.proposals.size());
    seq.position = s.position;
    seq.transforms = transforms;
    seq.stop_begin = static_cast<int32_t>(plan.stop_ids_.size());
    for (int32_t id : params.stop_token_ids) plan.stop_ids_.push_back(id);
    if (!params.ignore_eos) {
      for (int32_t id : s.eos_token_ids) plan.stop_ids_.push_back(id);
    }
    seq.stop_count = static_cast<int32_t>(plan.stop_ids_.size()) - seq.stop_begin;
    plan.seqs_.push_back(seq);

    // Row i's penalties count d_1..d_i as generated (the verifier's extended history).
    PenaltyState history = s.history != nullptr ? *s.history : PenaltyState();
    const bool penalties = HasPenalties(params);
    for (size_t i = 0; i <= s.proposals.size(); ++i) {
      blockwise::RowPlan row;
      row.logits_row = s.first_logits_row + static_cast<int64_t>(i);
      row.transforms = transforms;
      row.penalty_begin = static_cast<int32_t>(plan.penalties_.size());
      if (penalties) {
        history.ForEachSeen([&](int32_t id, int32_t count) {
          if (id >= 0 && id < vocab) plan.penalties_.push_back({id, count});
        });
      }
      row.penalty_count = static_cast<int32_t>(plan.penalties_.size()) - row.penalty_begin;
      row.proposal_begin = static_cast<int32_t>(plan.proposals_.size());
      if (i < s.proposals.size()) {
        const SparseProposal& q = s.proposals[i];
        row.draft_token = q.token;
        if (!IsGreedy(params)) {
          row.draft_q = ProposalProb(q, q.token);
          for (size_t j = 0; j < q.ids.size(); ++j) {
            plan.proposals_.push_back({q.ids[j], ProposalProb(q, q.ids[j])});
          }
        }
        if (penalties) history.AddGenerated(q.token);
      }
      row.proposal_count = static_cast<int32_t>(plan.proposals_.size()) - row.proposal_begin;
      plan.rows_.push_back(row);
    }
  }
  return plan;
}

blockwise::PlanView BlockwisePlan::View() const {
  blockwise::PlanView v;
  v.vocab = vocab_;
  v.transforms = transforms_.data();
  v.rows = rows_.data();
  v.num_rows = num_rows();
  v.seqs = seqs_.data();
  v.num_seqs = num_seqs();
  v.penalties = penalties_.data();
  v.proposals = proposals_.data();
  v.stop_ids = stop_ids_.data();
  return v;
}

absl::StatusOr<std::vector<VerifyResult>> CollectResults(
    const BlockwisePlan& plan, absl::Span<const blockwise::SeqOutcome> outcomes,
    absl::Span<const int32_t> tokens, absl::Span<const float> logprobs,
    absl::Span<const blockwise::TopLogprobEntry> top) {
  std::vector<VerifyResult> results;
  results.reserve(plan.seqs().size());
  for (size_t si = 0; si < plan.seqs().size(); ++si) {
    const blockwise::SeqPlan& seq = plan.seqs()[si];
    const blockwise::SeqOutcome& o = outcomes[si];
    if (o.error == blockwise::kRowNotFinite) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", plan.name(si), ", row ", o.error_row,
                                                     ": logits[", o.error_index,
                                                     "] is NaN or +inf"));
    }
    if (o.error == blockwise::kRowAllMasked) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", plan.name(si), ", row ", o.error_row, ": every logit is -inf"));
    }
    VerifyResult r;
    r.num_drafted = seq.num_drafts;
    r.num_accepted = o.num_accepted;
    r.accepted.assign(seq.num_drafts, false);
    for (int32_t i = 0; i < o.num_accepted; ++i) r.accepted[i] = true;
    r.tokens.assign(tokens.begin() + seq.first_row,
                    tokens.begin() + seq.first_row + o.num_tokens);
    r.logprobs.assign(logprobs.begin() + seq.first_row,
                      logprobs.begin() + seq.first_row + o.num_tokens);
    const int32_t n = std::min(plan.transforms()[seq.transforms].num_logprobs, plan.vocab());
    if (n > 0) {
      for (int32_t t = 0; t < o.num_tokens; ++t) {
        const blockwise::TopLogprobEntry* e =
            top.data() + static_cast<size_t>(seq.first_row + t) * blockwise::kMaxLogprobsValue;
        std::vector<TokenLogprob>& list = r.top_logprobs.emplace_back();
        for (int32_t m = 0; m < n; ++m) list.push_back({e[m].id, e[m].logprob});
      }
    }
    r.stopped = o.stopped != 0;
    r.proposal_mismatch = o.proposal_mismatch != 0;
    results.push_back(std::move(r));
  }
  return results;
}

namespace {

// A block of n std::threads meeting at a barrier: every collective writes its thread's slot,
// waits, folds the slots in thread order, and waits again before the slots are reused.
class HostBlock {
 public:
  struct Shared {
    explicit Shared(int n) : barrier(n), d(n), i(n) {}
    std::barrier<> barrier;
    std::vector<double> d;
    std::vector<int64_t> i;
  };
  HostBlock(Shared* shared, int tid, int n) : shared_(shared), tid_(tid), n_(n) {}

  int tid() const { return tid_; }
  int size() const { return n_; }
  double Sum(double v) { return Fold(shared_->d, v, [](double a, double b) { return a + b; }); }
  int64_t SumInt(int64_t v) {
    return Fold(shared_->i, v, [](int64_t a, int64_t b) { return a + b; });
  }
  double Max(double v) { return Fold(shared_->d, v, [](double a, double b) { return a > b ? a : b; }); }
  int32_t MinInt(int32_t v) {
    return static_cast<int32_t>(
        Fold(shared_->i, int64_t{v}, [](int64_t a, int64_t b) { return a < b ? a : b; }));
  }
  int32_t MaxInt(int32_t v) {
    return static_cast<int32_t>(
        Fold(shared_->i, int64_t{v}, [](int64_t a, int64_t b) { return a > b ? a : b; }));
  }
  void Sync() { shared_->barrier.arrive_and_wait(); }
  void InclusiveScan(double v, double* before, double* through) {
    shared_->d[tid_] = v;
    shared_->barrier.arrive_and_wait();
    double acc = 0.0;
    for (int j = 0; j < tid_; ++j) acc += shared_->d[j];
    *before = acc;
    *through = acc + v;  // the next thread's `before`: the same additions in the same order
    shared_->barrier.arrive_and_wait();
  }

 private:
  template <class T, class Op>
  T Fold(std::vector<T>& slots, T v, Op op) {
    slots[tid_] = v;
    shared_->barrier.arrive_and_wait();
    T acc = slots[0];
    for (int j = 1; j < n_; ++j) acc = op(acc, slots[j]);
    shared_->barrier.arrive_and_wait();
    return acc;
  }

  Shared* shared_;
  int tid_, n_;
};

// Runs body(block) on n threads of one block; thread 0's return value is kept.
template <class R>
R RunBlock(int n, const std::function<R(HostBlock&)>& body) {
  HostBlock::Shared shared(n);
  R result{};
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) {
    threads.emplace_back([&, t] {
      HostBlock b(&shared, t, n);
      body(b);
    });
  }
  HostBlock b0(&shared, 0, n);
  result = body(b0);
  for (std::thread& th : threads) th.join();
  return result;
}

// The host twins' inputs: at least one thread, and every row the plan names in `logits`.
absl::Status CheckHostInputs(const BlockwisePlan& plan, absl::Span<const float> logits,
                             int threads_per_block) {
  if (threads_per_block < 1) {
    return absl::InvalidArgumentError("threads_per_block must be at least 1");
  }
  return plan.CheckReadsWithin(static_cast<int64_t>(logits.size()) / plan.vocab());
}

}  // namespace

absl::Status BlockwisePlan::CheckReadsWithin(int64_t logits_rows) const {
  for (const blockwise::RowPlan& row : rows_) {
    if (row.logits_row >= logits_rows) {
      return absl::InvalidArgumentError(absl::StrCat("the plan reads logits row ", row.logits_row,
                                                     "; the step has ", logits_rows));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckProposalTopN(int32_t top_n) {
  if (top_n >= 1 && top_n <= blockwise::kMaxBlockwiseTopN) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("top_n must be in [1, ", blockwise::kMaxBlockwiseTopN, "], got ", top_n));
}

absl::StatusOr<std::vector<VerifyResult>> VerifyBlockwiseOnHost(const BlockwisePlan& plan,
                                                                absl::Span<const float> logits,
                                                                int threads_per_block) {
  if (absl::Status st = CheckHostInputs(plan, logits, threads_per_block); !st.ok()) return st;
  const blockwise::PlanView view = plan.View();
  const int64_t vocab = plan.vocab();
  std::vector<float> weights(static_cast<size_t>(plan.num_rows()) * vocab);
  std::vector<blockwise::RowSummary> summaries(plan.num_rows());
  for (int32_t r = 0; r < plan.num_rows(); ++r) {
    summaries[r] = RunBlock<blockwise::RowSummary>(threads_per_block, [&](HostBlock& b) {
      return blockwise::SummarizeRow(b, view, r, logits.data(), weights.data() + r * vocab);
    });
  }
  std::vector<blockwise::SeqOutcome> outcomes(plan.num_seqs());
  std::vector<int32_t> tokens(plan.num_rows());
  std::vector<float> logprobs(plan.num_rows());
  std::vector<blockwise::TopLogprobEntry> top(static_cast<size_t>(plan.num_rows()) *
                                              blockwise::kMaxLogprobsValue);
  for (int32_t q = 0; q < plan.num_seqs(); ++q) {
    outcomes[q] = RunBlock<blockwise::SeqOutcome>(threads_per_block, [&](HostBlock& b) {
      return blockwise::FinishSequence(b, view, q, logits.data(), weights.data(),
                                       summaries.data(), tokens.data(), logprobs.data(),
                                       top.data());
    });
  }
  return CollectResults(plan, outcomes, tokens, logprobs, top);
}

absl::StatusOr<std::vector<BlockwiseProposal>> CollectProposals(
    const BlockwisePlan& plan, absl::Span<const blockwise::ProposalOut> outs,
    absl::Span<const int32_t> ids, absl::Span<const float> probs, int32_t top_n) {
  std::vector<BlockwiseProposal> proposals;
  for (size_t si = 0; si < plan.seqs().size(); ++si) {
    const int32_t r = plan.seqs()[si].first_row;
    const blockwise::ProposalOut& o = outs[r];
    if (o.error == blockwise::kRowNotFinite) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", plan.name(si), ": logits[",
                                                     o.error_index, "] is NaN or +inf"));
    }
    if (o.error == blockwise::kRowAllMasked) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", plan.name(si), ": every logit is -inf"));
    }
    BlockwiseProposal p;
    const size_t at = static_cast<size_t>(r) * top_n;
    p.q.token = o.token;
    p.q.ids.assign(ids.begin() + at, ids.begin() + at + o.size);
    p.q.probs.assign(probs.begin() + at, probs.begin() + at + o.size);
    p.confidence = o.confidence;
    proposals.push_back(std::move(p));
  }
  return proposals;
}

absl::StatusOr<std::vector<BlockwiseProposal>> ProposeBlockwiseOnHost(
    const BlockwisePlan& plan, absl::Span<const float> logits, int32_t top_n,
    int threads_per_block) {
  if (absl::Status st = CheckProposalTopN(top_n); !st.ok()) return st;
  if (absl::Status st = CheckHostInputs(plan, logits, threads_per_block); !st.ok()) return st;
  const blockwise::PlanView view = plan.View();
  const int64_t vocab = plan.vocab();
  const size_t R = static_cast<size_t>(plan.num_rows());
  std::vector<float> weights(R * vocab), scratch(R * top_n), probs(R * top_n);
  std::vector<int32_t> ids(R * top_n);
  std::vector<blockwise::ProposalOut> outs(R);
  for (int32_t r = 0; r < plan.num_rows(); ++r) {
    outs[r] = RunBlock<blockwise::ProposalOut>(threads_per_block, [&](HostBlock& b) {
      float* w = weights.data() + r * vocab;
      const blockwise::RowSummary s = blockwise::SummarizeRow(b, view, r, logits.data(), w);
      const size_t at = static_cast<size_t>(r) * top_n;
      return blockwise::ProposeFromRow(b, view, r, logits.data(), w, s, top_n, ids.data() + at,
                                       probs.data() + at, scratch.data() + at);
    });
  }
  return CollectProposals(plan, outs, ids, probs, top_n);
}

}  // namespace specd::sampling
