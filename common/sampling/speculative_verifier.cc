#include "common/sampling/speculative_verifier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specd::sampling {
namespace {

void Emit(const SamplingParams& params, absl::Span<const float> row, int32_t token,
          VerifyResult& out) {
  SampledToken described = DescribeToken(row, token, params.num_logprobs);
  out.tokens.push_back(token);
  out.logprobs.push_back(described.logprob);
  if (params.num_logprobs > 0) out.top_logprobs.push_back(std::move(described.top_logprobs));
}

}  // namespace

TargetDistribution ResidualDistribution(const TargetDistribution& p, const SparseProposal& q) {
  double q_total = 0.0;
  for (float v : q.probs) q_total += v;
  std::vector<double> r(p.probs().begin(), p.probs().end());
  if (q_total > 0.0) {
    for (size_t j = 0; j < q.ids.size(); ++j) {
      const int32_t id = q.ids[j];
      size_t idx;
      if (p.is_dense()) {
        if (id < 0 || id >= p.vocab_size()) continue;
        idx = static_cast<size_t>(id);
      } else {
        // p's support is small and sorted; ids of q outside it have p = 0, hence r = 0.
        size_t lo = 0, hi = p.size();
        while (lo < hi) {
          const size_t mid = (lo + hi) / 2;
          if (p.id(mid) < id) lo = mid + 1; else hi = mid;
        }
        if (lo == p.size() || p.id(lo) != id) continue;
        idx = lo;
      }
      r[idx] -= q.probs[j] / q_total;
    }
  }
  double mass = 0.0;
  for (double& v : r) {
    v = std::max(v, 0.0);
    mass += v;
  }
  if (mass <= kResidualEpsilon) return p;
  if (p.is_dense()) return TargetDistribution::Dense(std::move(r));
  std::vector<int32_t> ids(p.size());
  for (size_t i = 0; i < p.size(); ++i) ids[i] = p.id(i);
  return TargetDistribution::Sparse(std::move(ids), std::move(r), p.vocab_size());
}

absl::StatusOr<VerifyResult> VerifyDraft(const SamplingParams& params, const CounterRng& rng,
                                         const VerifyInput& in) {
  const int32_t vocab = in.vocab_size;
  if (absl::Status s = Validate(params, vocab); !s.ok()) return s;
  const size_t k = in.proposals.size();
  if (in.target_logits.size() != (k + 1) * static_cast<size_t>(vocab)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_logits has ", in.target_logits.size(), " values; expected (k+1) * vocab = ",
        (k + 1) * static_cast<size_t>(vocab), " for k = ", k));
  }
  const bool greedy = IsGreedy(params);
  for (size_t i = 0; i < k; ++i) {
    const SparseProposal& q = in.proposals[i];
    if (greedy) {
      if (q.token < 0 || q.token >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("proposals[", i, "].token = ", q.token, " is outside the vocabulary"));
      }
    } else if (absl::Status s = ValidateProposal(q, vocab); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("proposals[", i, "]: ", s.message()));
    }
  }

  // Row i's penalties count d_1..d_{i-1}: extend a private copy of the history as we accept.
  static const PenaltyState kNoHistory;
  const PenaltyState* state = in.history != nullptr ? in.history : &kNoHistory;
  PenaltyState extended;
  const bool track = HasPenalties(params);
  if (track) {
    extended = *state;
    state = &extended;
  }

  VerifyResult out;
  out.num_drafted = static_cast<int32_t>(k);
  out.accepted.assign(k, false);
  auto row = [&](size_t i) { return in.target_logits.subspan(i * vocab, vocab); };
  auto finish = [&](size_t i, int32_t token) {
    Emit(params, row(i), token, out);
    out.stopped = IsStopToken(params, in.eos_token_ids, token);
  };

  for (size_t i = 0; i < k; ++i) {
    const int64_t pos = in.position + static_cast<int64_t>(i);
    const int32_t d = in.proposals[i].token;
    if (greedy) {
      absl::StatusOr<int32_t> g = GreedyToken(row(i), *state, params);
      if (!g.ok()) return g.status();
      if (d != *g) {
        finish(i, *g);
        return out;
      }
    } else {
      absl::StatusOr<TargetDistribution> p = BuildTargetDistribution(row(i), *state, params);
      if (!p.ok()) return p.status();
      const double qd = ProposalProb(in.proposals[i], d);
      if (qd <= 0.0) {
        out.proposal_mismatch = true;
        finish(i, p->Sample(rng.Uniform(pos, RngPurpose::kSample)));
        return out;
      }
      const double pd = p->Prob(d);
      // u < pd / qd, without dividing: accepted with probability min(1, pd / qd).
      if (!(rng.Uniform(pos, RngPurpose::kAccept) * qd < pd)) {
        const TargetDistribution residual = ResidualDistribution(*p, in.proposals[i]);
        finish(i, residual.Sample(rng.Uniform(pos, RngPurpose::kResample)));
        return out;
      }
    }
    out.accepted[i] = true;
    ++out.num_accepted;
    finish(i, d);
    if (out.stopped) return out;
    if (track) extended.AddGenerated(d);
  }

  // All k accepted: the bonus token from p_{k+1}.
  const int64_t pos = in.position + static_cast<int64_t>(k);
  if (greedy) {
    absl::StatusOr<int32_t> g = GreedyToken(row(k), *state, params);
    if (!g.ok()) return g.status();
    finish(k, *g);
  } else {
    absl::StatusOr<TargetDistribution> p = BuildTargetDistribution(row(k), *state, params);
    if (!p.ok()) return p.status();
    finish(k, p->Sample(rng.Uniform(pos, RngPurpose::kSample)));
  }
  return out;
}

}  // namespace specd::sampling
