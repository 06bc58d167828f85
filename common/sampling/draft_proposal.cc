#include "common/sampling/draft_proposal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sampling/target_distribution.h"

namespace specd::sampling {
namespace {

double ProposalTotal(const SparseProposal& q) {
  double total = 0.0;
  for (float p : q.probs) total += p;
  return total;
}

}  // namespace

absl::Status ValidateProposal(const SparseProposal& q, int32_t vocab_size) {
  if (q.ids.size() != q.probs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("proposal has ", q.ids.size(), " ids but ",
                                                   q.probs.size(), " probs"));
  }
  if (q.ids.empty()) return absl::InvalidArgumentError("proposal distribution is empty");
  if (q.token < 0 || q.token >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("proposal token ", q.token, " is outside the vocabulary [0, ", vocab_size,
                     ")"));
  }
  // Repeated ids: proposals are small (top-32), so sort a copy only when they are not.
  std::vector<int32_t> sorted;
  if (q.ids.size() > 64) {
    sorted = q.ids;
    std::sort(sorted.begin(), sorted.end());
  }
  for (size_t j = 0; j < q.ids.size(); ++j) {
    if (q.ids[j] < 0 || q.ids[j] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("proposal ids[", j, "] = ", q.ids[j],
                                                     " is outside the vocabulary"));
    }
    const bool repeated =
        sorted.empty()
            ? std::find(q.ids.begin(), q.ids.begin() + j, q.ids[j]) != q.ids.begin() + j
            : (j > 0 && sorted[j] == sorted[j - 1]);
    if (repeated) {
      const int32_t id = sorted.empty() ? q.ids[j] : sorted[j];
      return absl::InvalidArgumentError(absl::StrCat("proposal id ", id, " is repeated"));
    }
    if (!(q.probs[j] >= 0.0f) || !std::isfinite(q.probs[j])) {
      return absl::InvalidArgumentError(
          absl::StrCat("proposal probs[", j, "] = ", q.probs[j], " is not a probability"));
    }
  }
  const double total = ProposalTotal(q);
  if (!(std::fabs(total - 1.0) <= kProposalSumTolerance)) {
    return absl::InvalidArgumentError(
        absl::StrCat("proposal probs sum to ", total, ", not 1"));
  }
  return absl::OkStatus();
}

double ProposalProb(const SparseProposal& q, int32_t token) {
  for (size_t j = 0; j < q.ids.size(); ++j) {
    if (q.ids[j] == token) {
      const double total = ProposalTotal(q);
      return total > 0.0 ? q.probs[j] / total : 0.0;
    }
  }
  return 0.0;
}

int32_t SampleProposal(const SparseProposal& q, double u) {
  const double target = u * ProposalTotal(q);
  double cum = 0.0;
  int32_t last_positive = q.ids.empty() ? -1 : q.ids.front();
  for (size_t j = 0; j < q.ids.size(); ++j) {
    if (q.probs[j] <= 0.0f) continue;
    cum += q.probs[j];
    last_positive = q.ids[j];
    if (target < cum) return q.ids[j];
  }
  return last_positive;
}

namespace {

// q from candidates ranked most likely first: the first n, renormalized, and d drawn from
// exactly the float q the verifier will read. weight(c) / id(c) read a candidate.
template <typename Candidate, typename Weight, typename Id>
SparseProposal RankedProposal(const std::vector<Candidate>& ranked, size_t n, Weight weight,
                              Id id, const CounterRng& rng, int64_t position) {
  double kept = 0.0;
  for (size_t j = 0; j < n; ++j) kept += weight(ranked[j]);
  SparseProposal q;
  q.ids.resize(n);
  q.probs.resize(n);
  for (size_t j = 0; j < n; ++j) {
    q.ids[j] = id(ranked[j]);
    q.probs[j] = static_cast<float>(weight(ranked[j]) / kept);
  }
  q.token = SampleProposal(q, rng.Uniform(position, RngPurpose::kDraft));
  return q;
}

}  // namespace

absl::StatusOr<SparseProposal> MakeProposalReference(absl::Span<const float> logits,
                                                     const PenaltyState& history,
                                                     const SamplingParams& draft_params,
                                                     int32_t top_n, const CounterRng& rng,
                                                     int64_t position) {
  if (top_n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("proposal top_n must be >= 1, got ", top_n));
  }
  if (absl::Status s = Validate(draft_params, static_cast<int32_t>(logits.size())); !s.ok()) {
    return s;
  }
  absl::StatusOr<TargetDistribution> p = BuildTargetDistribution(logits, history, draft_params);
  if (!p.ok()) return p.status();

  std::vector<std::pair<double, int32_t>> cand;  // (prob, id), positive probs only
  cand.reserve(p->size());
  for (size_t i = 0; i < p->size(); ++i) {
    if (p->prob(i) > 0.0) cand.push_back({p->prob(i), p->id(i)});
  }
  const size_t n = std::min<size_t>(top_n, cand.size());
  std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  return RankedProposal(
      cand, n, [](const auto& c) { return c.first; }, [](const auto& c) { return c.second; }, rng,
      position);
}

namespace {

// A candidate for q: penalized logit x, its weight w = exp(x / T - max s) computed exactly as
// BuildTargetDistribution computes it, and its id.
struct Cand {
  double x, w;
  int32_t id;
};

// The reference's order: more likely first, ties -> lower id.
bool MoreLikely(const Cand& a, const Cand& b) { return a.w > b.w || (a.w == b.w && a.id < b.id); }

// Extra candidates selected by logit beyond top_n, so that weights that tie after exp() at the
// cut are ordered by id as the reference orders them.
constexpr size_t kSlack = 8;

// SelectByLogit scans the row in chunks of this many logits.
constexpr size_t kChunk = 64;

// The `keep` largest penalized logits of the row (ties -> lower id); INVALID_ARGUMENT for
// NaN / +inf. The row is read twice, branch-light: a validity pass, then a streaming top-k
// over the raw floats with a threshold (most entries fail one compare). Penalized ids are few
// (the history): the raw pass keeps keep + |penalized| entries so that dropping theirs leaves
// the top `keep` of the rest, then theirs come back with their penalized values.
absl::Status SelectByLogit(absl::Span<const float> logits,
                           const std::vector<std::pair<int32_t, double>>& penalized, size_t keep,
                           std::vector<Cand>* out) {
  const size_t vocab = logits.size();
  // Validity on the bit patterns (vectorizes): NaN has |bits| > +inf's, +inf is exactly it.
  constexpr uint32_t kInfBits = 0x7f800000u;
  uint32_t max_abs = 0, pos_inf = 0;
  for (size_t i = 0; i < vocab; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &logits[i], sizeof(bits));
    max_abs = std::max(max_abs, bits & 0x7fffffffu);
    pos_inf |= static_cast<uint32_t>(bits == kInfBits);
  }
  if (max_abs > kInfBits || pos_inf != 0) {
    for (size_t i = 0; i < vocab; ++i) {
      const float v = logits[i];
      if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
        return absl::InvalidArgumentError(absl::StrCat("logits[", i, "] is ", v));
      }
    }
  }
  struct Raw {
    float v;
    int32_t id;
  };
  auto stronger = [](const Raw& a, const Raw& b) { return a.v > b.v || (a.v == b.v && a.id < b.id); };
  const size_t want = keep + penalized.size();
  const size_t flush = std::max<size_t>(2 * want, 64);
  std::vector<Raw> buf;
  buf.reserve(flush + kChunk);
  float threshold = -std::numeric_limits<float>::infinity();
  const float* row = logits.data();
  for (size_t base = 0; base < vocab; base += kChunk) {
    const size_t end = std::min(vocab, base + kChunk);
    // A chunk's max first (vectorizes): once the threshold has risen most chunks stop here.
    float chunk_max = -std::numeric_limits<float>::infinity();
    if (end - base == kChunk) {
      // Eight independent lanes: the compiler turns this into packed max (a single running
      // max is a serial chain it may not reorder).
      float lane[8];
      for (int j = 0; j < 8; ++j) lane[j] = row[base + j];
      for (size_t i = base + 8; i < end; i += 8) {
        for (int j = 0; j < 8; ++j) lane[j] = lane[j] > row[i + j] ? lane[j] : row[i + j];
      }
      for (int j = 0; j < 8; ++j) chunk_max = std::max(chunk_max, lane[j]);
    } else {
      for (size_t i = base; i < end; ++i) chunk_max = std::max(chunk_max, row[i]);
    }
    if (!(chunk_max > threshold)) continue;
    for (size_t i = base; i < end; ++i) {
      // Equal to the threshold: a later id loses the tie.
      if (row[i] > threshold) buf.push_back({row[i], static_cast<int32_t>(i)});
    }
    if (buf.size() >= flush) {
      std::nth_element(buf.begin(), buf.begin() + (want - 1), buf.end(), stronger);
      buf.resize(want);
      threshold = buf[want - 1].v;
      for (const Raw& r : buf) threshold = std::min(threshold, r.v);
    }
  }
  out->clear();
  auto is_penalized = [&](int32_t id) {
    auto it = std::lower_bound(penalized.begin(), penalized.end(), id,
                               [](const auto& e, int32_t t) { return e.first < t; });
    return it != penalized.end() && it->first == id;
  };
  for (const Raw& r : buf) {
    if (!is_penalized(r.id)) out->push_back({r.v, 0.0, r.id});
  }
  for (const auto& [id, x] : penalized) {
    if (x != -std::numeric_limits<double>::infinity()) out->push_back({x, 0.0, id});
  }
  if (out->empty()) return absl::InvalidArgumentError("every logit is -inf");
  auto by_logit = [](const Cand& a, const Cand& b) { return a.x > b.x || (a.x == b.x && a.id < b.id); };
  if (out->size() > keep) {
    std::nth_element(out->begin(), out->begin() + (keep - 1), out->end(), by_logit);
    out->resize(keep);
  }
  std::sort(out->begin(), out->end(), by_logit);
  return absl::OkStatus();
}

// Sum of w over the whole row (top-p's denominator without top-k): the one full pass of exp.
double TotalWeight(absl::Span<const float> logits,
                   const std::vector<std::pair<int32_t, double>>& penalized, double temperature,
                   double max_s) {
  double total = 0.0;
  size_t next_penalized = 0;
  const int32_t vocab = static_cast<int32_t>(logits.size());
  for (int32_t i = 0; i < vocab; ++i) {
    double x = logits[i];
    if (next_penalized < penalized.size() && penalized[next_penalized].first == i) {
      x = penalized[next_penalized++].second;
    }
    if (x == -std::numeric_limits<double>::infinity()) continue;
    total += std::exp(x / temperature - max_s);
  }
  return total;
}

// DraftConfidence's value: sampled, q's largest probability; greedy, the argmax's weight
// among c (the top logits, sorted by logit, largest first) at temperature 1.
double LargestProbability(const SparseProposal& q) {
  double total = 0.0, largest = 0.0;
  for (float p : q.probs) {
    total += p;
    largest = std::max(largest, static_cast<double>(p));
  }
  return total > 0.0 ? largest / total : 0.0;
}
double ArgmaxProbability(const std::vector<Cand>& c) {
  double total = 0.0;
  for (const Cand& k : c) total += std::exp(k.x - c.front().x);
  return 1.0 / total;
}

}  // namespace

absl::StatusOr<SparseProposal> MakeProposal(absl::Span<const float> logits,
                                            const PenaltyState& history,
                                            const SamplingParams& draft_params, int32_t top_n,
                                            const CounterRng& rng, int64_t position,
                                            double* confidence) {
  if (top_n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("proposal top_n must be >= 1, got ", top_n));
  }
  if (absl::Status s = Validate(draft_params, static_cast<int32_t>(logits.size())); !s.ok()) {
    return s;
  }
  if (logits.empty()) return absl::InvalidArgumentError("logits row is empty");
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const bool use_top_k = draft_params.top_k > 0 && draft_params.top_k < vocab;
  const bool use_top_p = draft_params.top_p < 1.0f;
  // top-p's denominator is the mass of top-k's survivors: beyond the candidates, that needs
  // the reference's full sort.
  if (use_top_p && use_top_k && static_cast<size_t>(draft_params.top_k) > top_n + kSlack) {
    absl::StatusOr<SparseProposal> q =
        MakeProposalReference(logits, history, draft_params, top_n, rng, position);
    if (q.ok() && confidence != nullptr) *confidence = LargestProbability(*q);
    return q;
  }
  std::vector<std::pair<int32_t, double>> penalized;
  history.PenalizedEntries(draft_params, logits, &penalized);
  // Greedy needs the argmax only, or the top_n for its confidence (the same argmax first).
  const size_t select = IsGreedy(draft_params) ? (confidence != nullptr ? top_n : 1)
                                               : static_cast<size_t>(top_n) + kSlack;
  std::vector<Cand> c;
  c.reserve(select);
  if (absl::Status s = SelectByLogit(logits, penalized, select, &c); !s.ok()) return s;

  if (IsGreedy(draft_params)) {  // the argmax (ties -> lowest id) as a point mass
    SparseProposal q;
    q.ids = {c.front().id};
    q.probs = {1.0f};
    q.token = c.front().id;
    if (confidence != nullptr) *confidence = ArgmaxProbability(c);
    return q;
  }
  const double temperature = draft_params.temperature;
  double max_x = c.front().x;
  for (const Cand& k : c) max_x = std::max(max_x, k.x);
  const double max_s = max_x / temperature;
  for (Cand& k : c) k.w = std::exp(k.x / temperature - max_s);
  std::sort(c.begin(), c.end(), MoreLikely);
  std::erase_if(c, [](const Cand& k) { return k.w <= 0.0; });  // positive probs only

  if (use_top_k && static_cast<size_t>(draft_params.top_k) < c.size()) c.resize(draft_params.top_k);
  if (use_top_p) {
    const bool all_survivors_here =
        use_top_k && static_cast<size_t>(draft_params.top_k) <= c.size();
    double total = 0.0;
    if (all_survivors_here) {
      for (const Cand& k : c) total += k.w;
    } else {
      total = TotalWeight(logits, penalized, temperature, max_s);
    }
    const double target = static_cast<double>(draft_params.top_p) * total;
    double cum = 0.0;
    size_t keep = 0;
    while (keep < c.size() && cum < target) cum += c[keep++].w;  // the top token always stays
    c.resize(keep);
  }
  if (draft_params.min_p > 0.0f) {
    const double threshold = draft_params.min_p;  // max w is exp(0) = 1
    std::erase_if(c, [threshold](const Cand& k) { return k.w < threshold; });
  }
  SparseProposal q = RankedProposal(
      c, std::min<size_t>(top_n, c.size()), [](const Cand& k) { return k.w; },
      [](const Cand& k) { return k.id; }, rng, position);
  if (confidence != nullptr) *confidence = LargestProbability(q);
  return q;
}

absl::StatusOr<double> DraftConfidence(absl::Span<const float> logits, const PenaltyState& history,
                                       const SamplingParams& draft_params, int32_t top_n,
                                       const SparseProposal& q) {
  if (!IsGreedy(draft_params)) return LargestProbability(q);
  if (top_n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("proposal top_n must be >= 1, got ", top_n));
  }
  std::vector<std::pair<int32_t, double>> penalized;
  history.PenalizedEntries(draft_params, logits, &penalized);
  std::vector<Cand> c;
  if (absl::Status s = SelectByLogit(logits, penalized, static_cast<size_t>(top_n), &c); !s.ok()) {
    return s;
  }
  return ArgmaxProbability(c);
}

}  // namespace specd::sampling
