// A draft's proposal (draft_proposal.h's MakeProposal: q = the draft's transformed distribution
// truncated to its top_n, renormalized; d drawn from q with the kDraft uniform; the draft's
// confidence) written once for a block of cooperating threads, like blockwise_verify.h, so a
// draft model on a GPU proposes where its logits are and only q crosses to the host.
//
// A row is first summarized by blockwise_verify.h's SummarizeRow (the draft's transforms: its
// weights, cuts and kept mass; the plan's "sequence" for the row carries the draft params and
// the drafted token's position, with no drafts), then ProposeFromRow ranks the top_n kept
// tokens by (w desc, id asc), writes q in that order and draws d. Greedy draft params give a
// point mass on the argmax, with DraftConfidence's temperature-1 reading over the top_n.
//
// Where the result can differ from MakeProposalReference: the kept mass is a tree sum (q's
// probabilities within float rounding, the same ids and order unless two weights' ratios to
// the mass round equal); the greedy confidence is read over the top_n by temperature-1 weight
// rather than by logit (the same set unless weights tie after exp at the cut).
#ifndef SPECD_COMMON_SAMPLING_BLOCKWISE_PROPOSE_H_
#define SPECD_COMMON_SAMPLING_BLOCKWISE_PROPOSE_H_

#include <cstdint>

#include "common/sampling/blockwise_verify.h"

namespace specd::sampling::blockwise {

// The most entries a blockwise q may hold: thread 0 ranks them by insertion (a few µs at 32,
// the default top_n; a drafter asking for more proposes on the host).
inline constexpr int32_t kMaxBlockwiseTopN = 256;

struct ProposalOut {
  int32_t token = -1;
  int32_t size = 0;         // q's entries, at ids[0..size) / probs[0..size)
  double confidence = 0.0;  // DraftConfidence's value
  int32_t error = kRowOk;   // the summary's, if any
  int32_t error_index = 0;
};

namespace detail {

// The tokens `in(i)` holds for that come no later than the cut (w_cut, id_cut) in the order
// (w desc, id asc), written in ascending id order to ids / ws [count] (count <= capacity).
template <class Block, class In>
SPECD_HOST_DEVICE int32_t GatherBeforeCut(Block& b, const float* w, int32_t vocab, In in,
                                          float w_cut, int32_t id_cut, int32_t* ids, float* ws) {
  const Range r = ShareOf(b, vocab);
  double mine = 0.0;
  for (int32_t i = r.begin; i < r.end; ++i) mine += in(i) && BeforeCut(w[i], i, w_cut, id_cut);
  double before, through;  // counts as doubles: exact below 2^53
  b.InclusiveScan(mine, &before, &through);
  int32_t at = static_cast<int32_t>(before);
  for (int32_t i = r.begin; i < r.end; ++i) {
    if (in(i) && BeforeCut(w[i], i, w_cut, id_cut)) {
      ids[at] = i;
      ws[at] = w[i];
      ++at;
    }
  }
  b.Sync();
  return static_cast<int32_t>(b.Sum(mine));
}

// Insertion sort of n entries by (w desc, id asc): n <= kMaxBlockwiseTopN, one thread.
SPECD_HOST_DEVICE inline void RankEntries(int32_t* ids, float* ws, int32_t n) {
  for (int32_t a = 1; a < n; ++a) {
    const int32_t id = ids[a];
    const float w = ws[a];
    int32_t j = a;
    while (j > 0 && (ws[j - 1] < w || (ws[j - 1] == w && ids[j - 1] > id))) {
      ids[j] = ids[j - 1];
      ws[j] = ws[j - 1];
      --j;
    }
    ids[j] = id;
    ws[j] = w;
  }
}

}  // namespace detail

// Row r of the plan (its sequence's transforms are the draft's; its position is the drafted
// token's), after SummarizeRow gave `summary` and `weights` (the row's w; for greedy params
// this fills them at temperature 1 itself). ids / probs: [top_n] outputs, written by thread
// 0; scratch_w: [top_n] floats. Every thread returns the same ProposalOut.
template <class Block>
SPECD_HOST_DEVICE ProposalOut ProposeFromRow(Block& b, const PlanView& plan, int32_t r,
                                             const float* logits, float* weights,
                                             const RowSummary& summary, int32_t top_n,
                                             int32_t* ids, float* probs, float* scratch_w) {
  using namespace detail;
  ProposalOut out;
  if (summary.error != kRowOk) {
    out.error = summary.error;
    out.error_index = summary.error_index;
    return out;
  }
  const RowPlan& row = plan.rows[r];
  const Transforms& tr = plan.transforms[row.transforms];
  const int32_t vocab = plan.vocab;
  const SeqPlan* seq = nullptr;
  for (int32_t j = 0; j < plan.num_seqs && seq == nullptr; ++j) {
    if (plan.seqs[j].first_row == r) seq = &plan.seqs[j];
  }
  const int64_t position = seq != nullptr ? seq->position : 0;
  const bool greedy = tr.temperature < kGreedyTemperatureValue;
  if (greedy) {
    // The argmax as a point mass; the confidence over the temperature-1 weights' top_n.
    const float* x_raw = logits + row.logits_row * static_cast<int64_t>(vocab);
    const PenaltyEntry* pen = plan.penalties + row.penalty_begin;
    const double max_x = Penalized(x_raw, tr, pen, row.penalty_count, summary.argmax);
    for (int32_t i = b.tid(); i < vocab; i += b.size()) {
      weights[i] = ExpNonPositive(
          static_cast<float>(Penalized(x_raw, tr, pen, row.penalty_count, i) - max_x));
    }
    b.Sync();
    int64_t positive = 0;
    for (int32_t i = b.tid(); i < vocab; i += b.size()) positive += weights[i] > 0.0f;
    positive = b.SumInt(positive);
    const int64_t n = top_n < positive ? top_n : positive;
    float w_cut;
    int32_t id_cut;
    auto all = [](int32_t) { return true; };
    SelectNth(b, weights, vocab, all, n, &w_cut, &id_cut);
    double local = 0.0;
    for (int32_t i = b.tid(); i < vocab; i += b.size()) {
      if (BeforeCut(weights[i], i, w_cut, id_cut)) local += weights[i];
    }
    out.confidence = 1.0 / b.Sum(local);  // the argmax's weight is exp(0) = 1
    out.token = summary.argmax;
    out.size = 1;
    if (b.tid() == 0) {
      ids[0] = summary.argmax;
      probs[0] = 1.0f;
    }
    return out;
  }
  const Cuts c = CutsOf(tr, summary, vocab);
  auto kept = [&](int32_t i) { return Kept(c, weights[i], i); };
  int64_t count = 0;
  for (int32_t i = b.tid(); i < vocab; i += b.size()) count += kept(i);
  count = b.SumInt(count);
  const int32_t n = static_cast<int32_t>(top_n < count ? top_n : count);
  float w_cut;
  int32_t id_cut;
  SelectNth(b, weights, vocab, kept, n, &w_cut, &id_cut);
  GatherBeforeCut(b, weights, vocab, kept, w_cut, id_cut, ids, scratch_w);
  // Thread 0 ranks q and draws d (SampleProposal over the float q, in rank order); every
  // thread returns the same values because they are computed from the same shared entries.
  if (b.tid() == 0) RankEntries(ids, scratch_w, n);
  b.Sync();
  double kept_mass = 0.0;
  for (int32_t j = 0; j < n; ++j) kept_mass += scratch_w[j] / summary.mass;
  double q_total = 0.0, largest = 0.0;
  for (int32_t j = 0; j < n; ++j) {
    const float q = static_cast<float>(scratch_w[j] / summary.mass / kept_mass);
    q_total += q;
    largest = q > largest ? q : largest;
  }
  const double target = CounterUniform(tr.seed, position, 1 /*kDraft*/) * q_total;
  double cum = 0.0;
  int32_t token = ids[0];
  for (int32_t j = 0; j < n; ++j) {
    const float q = static_cast<float>(scratch_w[j] / summary.mass / kept_mass);
    if (q <= 0.0f) continue;
    cum += q;
    token = ids[j];
    if (target < cum) break;
  }
  b.Sync();  // every thread has read the ranked entries before thread 0 overwrites probs
  if (b.tid() == 0) {
    for (int32_t j = 0; j < n; ++j) {
      probs[j] = static_cast<float>(scratch_w[j] / summary.mass / kept_mass);
    }
  }
  out.token = token;
  out.size = n;
  out.confidence = q_total > 0.0 ? largest / q_total : 0.0;
  return out;
}

}  // namespace specd::sampling::blockwise

#endif  // SPECD_COMMON_SAMPLING_BLOCKWISE_PROPOSE_H_
