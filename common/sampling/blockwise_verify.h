// Speculative verification (speculative_verifier.h, docs/DESIGN.md §2) written once for a block
// of cooperating threads, so that it can run where the logits are: the CUDA kernels run it with
// one thread block per verify row and per sequence (kernels/cuda/sampling.cu), and the host twin
// runs the same code on std::threads (blockwise_verify_host.h), which is how the tests hold it
// against VerifyDraft on a machine without a GPU.
//
// Two phases, each a pure function of the plan (built on the host: blockwise_verify_host.h):
//   SummarizeRow (one block per verify row): penalized argmax, the row's weights
//     w_i = exp(x_i / T - max) (fast_exp.h: the CPU's bits), the top-k and top-p cuts as
//     (weight, id) boundaries in the order (w desc, id asc), the kept mass, p(d) of the row's
//     draft, and the raw row's log-normalizer for the emitted token's logprob.
//   FinishSequence (one block per sequence): the accept / residual-resample / bonus chain on
//     the summaries with the request's counter-based uniforms (philox.h), then one inverse-CDF
//     draw over the row where the chain ends; only tokens and logprobs are written.
//
// Where the result can differ from VerifyDraft: sums are folded in a tree across threads, not
// left to right, so the kept mass, the top-p boundary and the inverse-CDF sums may differ in
// the last bits; a token differs only when a uniform lands within that rounding of a
// boundary (probability ~1e-15 per draw). Every per-token value (penalties, w, the cuts'
// comparisons) is the CPU's to the bit.
//
// A Block provides (every thread of the block calls each collective, in the same order):
//   int tid() const; int size() const;
//   double Sum(double); int64_t SumInt(int64_t); double Max(double);
//   int32_t MinInt(int32_t); int32_t MaxInt(int32_t); void Sync();
//   void InclusiveScan(double v, double* before, double* through): the running sum of the
//     threads' values in thread order; `before` of thread t + 1 is bitwise `through` of
//     thread t, and thread 0's `before` is 0 (folded as a tree on the device, a thread with
//     v = 0 may still see before != through by an ulp).
#ifndef SPECD_COMMON_SAMPLING_BLOCKWISE_VERIFY_H_
#define SPECD_COMMON_SAMPLING_BLOCKWISE_VERIFY_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/sampling/fast_exp.h"
#include "common/sampling/penalty_formula.h"
#include "common/sampling/philox.h"
#include "common/util/host_device.h"

namespace specd::sampling::blockwise {

// The constants of sampling_params.h / speculative_verifier.h, restated for device code (the
// host twin's test checks they are equal).
inline constexpr float kGreedyTemperatureValue = 1e-5f;
inline constexpr double kResidualEpsilonValue = 1e-9;

enum RowError : int32_t { kRowOk = 0, kRowNotFinite = 1, kRowAllMasked = 2 };

// A request's transforms as plain data.
struct Transforms {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  PenaltyFactors penalties;
  int32_t has_penalties = 0;
  int32_t num_logprobs = 0;  // top raw logprobs per emitted token, [0, kMaxLogprobsValue]
  uint64_t seed = 0;
};

// sampling_params.h's kMaxLogprobs: the top-logprob slots per row.
inline constexpr int32_t kMaxLogprobsValue = 20;
struct TopLogprobEntry {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct PenaltyEntry {
  int32_t id = 0;  // ascending within a row's list
  int32_t generated_count = 0;
};

struct ProposalEntry {
  int32_t id = 0;
  double q = 0.0;  // normalized by the proposal's sum (ProposalProb's value)
};

// One verify row: the target's logits for [x_n, d_1..d_k]'s row i.
struct RowPlan {
  int64_t logits_row = 0;     // row of the logits matrix [*, vocab]
  int32_t transforms = 0;     // index into PlanView::transforms (its sequence's)
  int32_t draft_token = -1;   // d_{i+1} checked against this row; -1 on the bonus row
  double draft_q = 0.0;       // q(d) (ProposalProb); 0 = d outside q (the verifier's mismatch)
  int32_t penalty_begin = 0;  // this row's history (committed + d_1..d_i) in `penalties`
  int32_t penalty_count = 0;
  int32_t proposal_begin = 0;  // q of this row's draft in `proposals`
  int32_t proposal_count = 0;
};

struct SeqPlan {
  int32_t first_row = 0;   // rows first_row .. first_row + num_drafts
  int32_t num_drafts = 0;  // k
  int64_t position = 0;    // absolute position of d_1
  int32_t transforms = 0;  // index into Plan::transforms
  int32_t stop_begin = 0;  // stop ids (the request's, plus EOS unless ignore_eos)
  int32_t stop_count = 0;
};

// The plan's arrays (host memory for the host twin, device memory for the kernels).
struct PlanView {
  int32_t vocab = 0;
  const Transforms* transforms = nullptr;
  const RowPlan* rows = nullptr;
  int32_t num_rows = 0;
  const SeqPlan* seqs = nullptr;
  int32_t num_seqs = 0;
  const PenaltyEntry* penalties = nullptr;
  const ProposalEntry* proposals = nullptr;
  const int32_t* stop_ids = nullptr;
};

struct RowSummary {
  int32_t error = kRowOk;
  int32_t error_index = 0;  // the first NaN / +inf logit
  int32_t argmax = 0;       // of the penalized row, ties -> lowest id
  int32_t cut_k_id = 0;     // top-k keeps (w > cut_k_w) or (w == cut_k_w and id <= cut_k_id)
  float cut_k_w = 0.0f;     // 0: top-k off (or it keeps every token of positive weight)
  int32_t cut_p_id = 0;     // top-p's boundary, the same way
  float cut_p_w = 0.0f;
  double mass = 0.0;        // sum of the kept weights
  double draft_p = 0.0;     // p(d) for the row's draft
  double log_normalizer = 0.0;  // log sum exp of the raw row (the logprobs' normalizer)
};

struct SeqOutcome {
  int32_t error = kRowOk;  // a RowError of the row the chain reached
  int32_t error_row = 0;   // 0-based within the sequence
  int32_t error_index = 0;
  int32_t num_accepted = 0;
  int32_t num_tokens = 0;  // tokens[first_row .. first_row + num_tokens)
  int32_t stopped = 0;
  int32_t proposal_mismatch = 0;
};

namespace detail {

SPECD_HOST_DEVICE inline uint32_t FloatBits(float v) {
  uint32_t b;
  memcpy(&b, &v, sizeof(b));
  return b;
}
SPECD_HOST_DEVICE inline float BitsFloat(uint32_t b) {
  float v;
  memcpy(&v, &b, sizeof(v));
  return v;
}

constexpr float kInfF = __builtin_huge_valf();
constexpr int32_t kNoIndex = 0x7fffffff;

// The penalized logit x_i of a row (as double, sampling_params.h's order).
SPECD_HOST_DEVICE inline double Penalized(const float* logits, const Transforms& tr,
                                          const PenaltyEntry* pen, int32_t n_pen, int32_t i) {
  double x = logits[i];
  if (!tr.has_penalties || n_pen == 0) return x;
  int32_t lo = 0, hi = n_pen;  // binary search: the list is ascending
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (pen[mid].id < i) lo = mid + 1; else hi = mid;
  }
  if (lo < n_pen && pen[lo].id == i) x = PenalizeLogit(tr.penalties, pen[lo].generated_count, x);
  return x;
}

// Keeps token i under a cut (w_cut, id_cut) of the order (w desc, id asc).
SPECD_HOST_DEVICE inline bool BeforeCut(float w, int32_t i, float w_cut, int32_t id_cut) {
  return w > w_cut || (w == w_cut && i <= id_cut);
}

struct Cuts {
  bool top_k = false, top_p = false, min_p = false;
  float k_w = 0.0f, p_w = 0.0f, min_p_value = 0.0f;
  int32_t k_id = 0, p_id = 0;
};

SPECD_HOST_DEVICE inline bool KeptByTopK(const Cuts& c, float w, int32_t i) {
  return !c.top_k || BeforeCut(w, i, c.k_w, c.k_id);
}
// Kept in p's support (positive weight, inside every truncation).
SPECD_HOST_DEVICE inline bool Kept(const Cuts& c, float w, int32_t i) {
  return w > 0.0f && KeptByTopK(c, w, i) && (!c.top_p || BeforeCut(w, i, c.p_w, c.p_id)) &&
         (!c.min_p || static_cast<double>(w) >= static_cast<double>(c.min_p_value));
}

SPECD_HOST_DEVICE inline Cuts CutsOf(const Transforms& tr, const RowSummary& s, int32_t vocab) {
  Cuts c;
  c.top_k = tr.top_k > 0 && tr.top_k < vocab;
  c.top_p = tr.top_p < 1.0f;
  c.min_p = tr.min_p > 0.0f;
  c.k_w = s.cut_k_w;
  c.k_id = s.cut_k_id;
  c.p_w = s.cut_p_w;
  c.p_id = s.cut_p_id;
  c.min_p_value = tr.min_p;
  return c;
}

// The n-th token (1-based) in the order (key desc, id asc) among tokens `in(i)` holds for, as a
// cut (key, id). key(i): an order-preserving uint32 below key_end. n must be in [1, count of
// such tokens].
template <class Block, class In, class Key>
SPECD_HOST_DEVICE void SelectNthByKey(Block& b, int32_t vocab, In in, Key key, uint64_t key_end,
                                      int64_t n, uint32_t* key_cut, int32_t* id_cut) {
  // The largest key v with count(in, key >= v) >= n, by bisection.
  auto count_at_least = [&](uint64_t v) {
    int64_t local = 0;
    for (int32_t i = b.tid(); i < vocab; i += b.size()) local += in(i) && key(i) >= v;
    return b.SumInt(local);
  };
  uint64_t lo = 0, hi = key_end;  // count(>= lo) >= n > count(>= hi)
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (count_at_least(mid) >= n) lo = mid; else hi = mid;
  }
  const int64_t ties_kept = n - count_at_least(lo + 1);
  // The ties_kept-th lowest id among tokens of key lo.
  int32_t id_lo = -1, id_hi = vocab - 1;  // count(id <= id_lo) < ties_kept <= count(id <= id_hi)
  while (id_hi - id_lo > 1) {
    const int32_t mid = id_lo + (id_hi - id_lo) / 2;
    int64_t local = 0;
    for (int32_t i = b.tid(); i <= mid; i += b.size()) local += in(i) && key(i) == lo;
    if (b.SumInt(local) >= ties_kept) id_hi = mid; else id_lo = mid;
  }
  *key_cut = static_cast<uint32_t>(lo);
  *id_cut = id_hi;
}

// SelectNthByKey on weights w: [vocab] in [0, 1] (non-negative floats order as their bits).
template <class Block, class In>
SPECD_HOST_DEVICE void SelectNth(Block& b, const float* w, int32_t vocab, In in, int64_t n,
                                 float* w_cut, int32_t* id_cut) {
  uint32_t cut;
  SelectNthByKey(b, vocab, in, [&](int32_t i) { return FloatBits(w[i]); },
                 uint64_t{FloatBits(1.0f)} + 1, n, &cut, id_cut);
  *w_cut = BitsFloat(cut);
}

// Any float (no NaN) as a uint32 in the same order: -inf lowest, +inf highest, -0 equal to +0
// (as the CPU's comparisons see them).
SPECD_HOST_DEVICE inline uint32_t OrderedKey(float v) {
  const uint32_t bits = v == 0.0f ? 0u : FloatBits(v);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// This thread's contiguous share of [0, n) for scans in id order.
struct Range {
  int32_t begin, end;
};
template <class Block>
SPECD_HOST_DEVICE Range ShareOf(const Block& b, int32_t n) {
  const int32_t per = (n + b.size() - 1) / b.size();
  const int64_t begin = static_cast<int64_t>(b.tid()) * per;
  const int64_t end = begin + per < n ? begin + per : n;
  return {static_cast<int32_t>(begin < n ? begin : n), static_cast<int32_t>(end)};
}

// The inverse CDF in ascending id order over non-negative values value(i), i in [0, n): the
// first token whose running sum exceeds u * total (TargetDistribution::Sample's rule, without
// normalizing first); the last positive token if rounding leaves none.
template <class Block, class Value>
SPECD_HOST_DEVICE int32_t InverseCdf(Block& b, int32_t n, Value value, double u) {
  const Range r = ShareOf(b, n);
  double local = 0.0;
  int32_t last_positive = -1;
  for (int32_t i = r.begin; i < r.end; ++i) {
    const double v = value(i);
    local += v;
    if (v > 0.0) last_positive = i;
  }
  double before, through;
  b.InclusiveScan(local, &before, &through);
  const double total = b.Sum(local);
  const double target = u * total;
  // Every thread with mass whose running sum passes the target offers its first crossing (or,
  // if its own fold left it a hair short, its last positive token); the lowest offer is the
  // first crossing. A tree-folded scan need not give an empty thread an empty interval, so a
  // thread without mass never offers.
  int32_t found = kNoIndex;
  if (last_positive >= 0 && target < through) {
    double run = before;
    for (int32_t i = r.begin; i < r.end && found == kNoIndex; ++i) {
      const double v = value(i);
      if (v <= 0.0) continue;
      run += v;
      if (target < run) found = i;
    }
    if (found == kNoIndex) found = last_positive;
  }
  found = b.MinInt(found);
  if (found != kNoIndex) return found;
  return b.MaxInt(last_positive);
}

// DescribeToken's top list: the n most likely tokens of the raw row by (logit desc, id asc),
// written ranked to out[0, n) by thread 0 (gathered in id order first, then ranked).
// x_raw: [vocab], no NaN; n in [1, kMaxLogprobsValue], at most vocab.
template <class Block>
SPECD_HOST_DEVICE void TopLogprobs(Block& b, const float* x_raw, int32_t vocab, int32_t n,
                                   double log_z, TopLogprobEntry* out) {
  auto all = [](int32_t) { return true; };
  auto key = [&](int32_t i) { return OrderedKey(x_raw[i]); };
  uint32_t key_cut;
  int32_t id_cut;
  SelectNthByKey(b, vocab, all, key, uint64_t{1} << 32, n, &key_cut, &id_cut);
  auto before = [&](int32_t i) { return key(i) > key_cut || (key(i) == key_cut && i <= id_cut); };
  const Range r = ShareOf(b, vocab);
  double mine = 0.0;
  for (int32_t i = r.begin; i < r.end; ++i) mine += before(i);
  double at_d, through;  // counts as doubles: exact
  b.InclusiveScan(mine, &at_d, &through);
  int32_t at = static_cast<int32_t>(at_d);
  for (int32_t i = r.begin; i < r.end; ++i) {
    if (before(i)) out[at++] = {i, static_cast<float>(static_cast<double>(x_raw[i]) - log_z)};
  }
  b.Sync();
  if (b.tid() == 0) {  // n <= 20 entries: insertion by (logit desc, id asc)
    for (int32_t a = 1; a < n; ++a) {
      const TopLogprobEntry e = out[a];
      const float x = x_raw[e.id];
      int32_t j = a;
      while (j > 0 && (x_raw[out[j - 1].id] < x ||
                       (x_raw[out[j - 1].id] == x && out[j - 1].id > e.id))) {
        out[j] = out[j - 1];
        --j;
      }
      out[j] = e;
    }
  }
  b.Sync();
}

}  // namespace detail

// Phase 1 for verify row `r`: fills *out (every thread returns the same summary; the caller
// stores it once) and weights[0, vocab) (the row's w as floats, read again by phase 2).
// logits: [*, vocab]; weights: [vocab] of this row.
template <class Block>
SPECD_HOST_DEVICE RowSummary SummarizeRow(Block& b, const PlanView& plan, int32_t r,
                                          const float* logits, float* weights) {
  using namespace detail;
  const RowPlan& row = plan.rows[r];
  const int32_t vocab = plan.vocab;
  const float* x_raw = logits + row.logits_row * static_cast<int64_t>(vocab);
  const PenaltyEntry* pen = plan.penalties + row.penalty_begin;
  const Transforms& tr = plan.transforms[row.transforms];
  RowSummary s;

  // 1. Malformed rows (NaN / +inf raw logits: CheckRow), the penalized argmax, the raw max.
  int32_t bad = kNoIndex;
  double best = -__builtin_huge_val();
  int32_t best_id = kNoIndex;
  float raw_max = -kInfF;
  for (int32_t i = b.tid(); i < vocab; i += b.size()) {
    const float v = x_raw[i];
    if (!(v < kInfF)) {
      if (i < bad) bad = i;
      continue;
    }
    raw_max = v > raw_max ? v : raw_max;
    const double x = Penalized(x_raw, tr, pen, row.penalty_count, i);
    if (x > best) {  // strided in ascending ids: strict keeps this thread's lowest id
      best = x;
      best_id = i;
    }
  }
  bad = b.MinInt(bad);
  if (bad != kNoIndex) {
    s.error = kRowNotFinite;
    s.error_index = bad;
    return s;
  }
  const double max_x = b.Max(best);
  s.argmax = b.MinInt(best == max_x ? best_id : kNoIndex);
  if (max_x == -__builtin_huge_val()) {
    s.error = kRowAllMasked;
    return s;
  }
  // LogNormalizer: float max, float exps of (v - max) summed in double.
  const float row_max = static_cast<float>(b.Max(static_cast<double>(raw_max)));
  double exp_sum = 0.0;
  for (int32_t i = b.tid(); i < vocab; i += b.size()) exp_sum += ExpNonPositive(x_raw[i] - row_max);
  s.log_normalizer = static_cast<double>(row_max) + ::log(b.Sum(exp_sum));
  if (tr.temperature < kGreedyTemperatureValue) return s;

  // 2. The weights w_i = exp(x_i / T - max_s) at float precision (the CPU's WeightsFast).
  const double temperature = tr.temperature;
  const double max_s = max_x / temperature;
  for (int32_t i = b.tid(); i < vocab; i += b.size()) {
    const double x = Penalized(x_raw, tr, pen, row.penalty_count, i);
    weights[i] = ExpNonPositive(static_cast<float>(x / temperature - max_s));
  }
  b.Sync();  // step 5 reads p(d) from the thread that wrote it
  Cuts c = CutsOf(tr, s, vocab);

  // 3. top-k: the k-th token in the order (w desc, id asc) is the cut.
  auto all = [](int32_t) { return true; };
  if (c.top_k) SelectNth(b, weights, vocab, all, tr.top_k, &c.k_w, &c.k_id);

  // 4. top-p over the top-k survivors: token j stays while the mass strictly before it is
  //    < top_p * (their mass). The last kept weight is the smallest w* whose heavier mass
  //    f(w*) is still below the target; its ties stay in id order while the mass does.
  if (c.top_p) {
    double local = 0.0;
    for (int32_t i = b.tid(); i < vocab; i += b.size()) {
      if (KeptByTopK(c, weights[i], i)) local += weights[i];
    }
    const double target = static_cast<double>(tr.top_p) * b.Sum(local);
    auto heavier = [&](uint32_t v) {  // f: the mass of survivors with bits(w) > v
      double m = 0.0;
      for (int32_t i = b.tid(); i < vocab; i += b.size()) {
        if (FloatBits(weights[i]) > v && KeptByTopK(c, weights[i], i)) m += weights[i];
      }
      return b.Sum(m);
    };
    uint32_t lo = 0, hi = FloatBits(1.0f);  // f(lo) >= target > f(hi) = 0
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      if (heavier(mid) < target) hi = mid; else lo = mid;
    }
    const float w_star = BitsFloat(hi);
    const double f = heavier(hi);
    auto kept_k = [&](int32_t i) { return KeptByTopK(c, weights[i], i); };
    int64_t ties = 0;
    for (int32_t i = b.tid(); i < vocab; i += b.size()) ties += kept_k(i) && weights[i] == w_star;
    ties = b.SumInt(ties);
    int64_t keep = 0;
    while (keep < ties && f + static_cast<double>(keep) * w_star < target) ++keep;
    // The survivors heavier than w* plus `keep` ties: the cut is the (heavier + keep)-th token.
    int64_t above = 0;
    for (int32_t i = b.tid(); i < vocab; i += b.size()) above += kept_k(i) && weights[i] > w_star;
    above = b.SumInt(above);
    SelectNth(b, weights, vocab, kept_k, above + keep, &c.p_w, &c.p_id);
  }
  s.cut_k_w = c.k_w;
  s.cut_k_id = c.k_id;
  s.cut_p_w = c.p_w;
  s.cut_p_id = c.p_id;

  // 5. min-p is a plain threshold (the argmax has w = 1); the kept mass; p(d).
  double mass = 0.0;
  for (int32_t i = b.tid(); i < vocab; i += b.size()) {
    if (Kept(c, weights[i], i)) mass += weights[i];
  }
  s.mass = b.Sum(mass);
  const int32_t d = row.draft_token;
  if (d >= 0 && d < vocab && Kept(c, weights[d], d)) s.draft_p = weights[d] / s.mass;
  return s;
}

// Phase 2 for sequence `q`: the chain over its rows' summaries, then the draw that ends it.
// Every thread computes the same outcome; tokens / logprobs ([rows]) and, for requests that
// want them, the top logprobs ([rows, kMaxLogprobsValue]) are written by thread 0.
template <class Block>
SPECD_HOST_DEVICE SeqOutcome FinishSequence(Block& b, const PlanView& plan, int32_t q,
                                            const float* logits, const float* weights,
                                            const RowSummary* summaries, int32_t* tokens,
                                            float* logprobs, TopLogprobEntry* top) {
  using namespace detail;
  const SeqPlan& seq = plan.seqs[q];
  const Transforms& tr = plan.transforms[seq.transforms];
  const int32_t vocab = plan.vocab;
  const bool greedy = tr.temperature < kGreedyTemperatureValue;
  SeqOutcome out;

  auto emit = [&](int32_t i, int32_t token) {
    const int32_t r = seq.first_row + i;
    const float* x_raw = logits + plan.rows[r].logits_row * static_cast<int64_t>(vocab);
    if (tr.num_logprobs > 0) {
      const int32_t n = tr.num_logprobs < vocab ? tr.num_logprobs : vocab;
      TopLogprobs(b, x_raw, vocab, n, summaries[r].log_normalizer,
                  top + static_cast<int64_t>(seq.first_row + out.num_tokens) * kMaxLogprobsValue);
    }
    if (b.tid() == 0) {
      const float raw = x_raw[token];
      tokens[seq.first_row + out.num_tokens] = token;
      logprobs[seq.first_row + out.num_tokens] =
          static_cast<float>(static_cast<double>(raw) - summaries[r].log_normalizer);
    }
    ++out.num_tokens;
    for (int32_t j = 0; j < seq.stop_count; ++j) {
      if (plan.stop_ids[seq.stop_begin + j] == token) out.stopped = 1;
    }
  };
  // A draw from row i's p, or from norm(max(0, p - q)) of its draft's q.
  auto draw = [&](int32_t i, bool residual, double u) {
    const int32_t r = seq.first_row + i;
    const RowSummary& s = summaries[r];
    const Cuts c = CutsOf(tr, s, vocab);
    const float* w = weights + static_cast<int64_t>(r) * vocab;
    const RowPlan& row = plan.rows[r];
    auto p = [&](int32_t t) { return Kept(c, w[t], t) ? w[t] / s.mass : 0.0; };
    auto resid = [&](int32_t t) {
      const double pt = p(t);
      if (pt <= 0.0) return 0.0;
      for (int32_t j = 0; j < row.proposal_count; ++j) {
        const ProposalEntry& e = plan.proposals[row.proposal_begin + j];
        if (e.id == t) return pt - e.q > 0.0 ? pt - e.q : 0.0;
      }
      return pt;
    };
    if (residual) {
      double local = 0.0;
      for (int32_t t = b.tid(); t < vocab; t += b.size()) local += resid(t);
      if (b.Sum(local) > kResidualEpsilonValue) return InverseCdf(b, vocab, resid, u);
    }
    return InverseCdf(b, vocab, p, u);
  };
  auto failed = [&](int32_t i) {
    const RowSummary& s = summaries[seq.first_row + i];
    if (s.error == kRowOk) return false;
    out.error = s.error;
    out.error_row = i;
    out.error_index = s.error_index;
    return true;
  };

  for (int32_t i = 0; i < seq.num_drafts; ++i) {
    if (failed(i)) return out;
    const int64_t pos = seq.position + i;
    const RowSummary& s = summaries[seq.first_row + i];
    const RowPlan& row = plan.rows[seq.first_row + i];
    const int32_t d = row.draft_token;
    if (greedy) {
      if (d != s.argmax) {
        emit(i, s.argmax);
        return out;
      }
    } else if (row.draft_q <= 0.0) {
      out.proposal_mismatch = 1;
      emit(i, draw(i, false, CounterUniform(tr.seed, pos, 0 /*kSample*/)));
      return out;
    } else if (!(CounterUniform(tr.seed, pos, 2 /*kAccept*/) * row.draft_q < s.draft_p)) {
      emit(i, draw(i, true, CounterUniform(tr.seed, pos, 3 /*kResample*/)));
      return out;
    }
    ++out.num_accepted;
    emit(i, d);
    if (out.stopped) return out;
  }
  const int32_t k = seq.num_drafts;
  if (failed(k)) return out;
  emit(k, greedy ? summaries[seq.first_row + k].argmax
                 : draw(k, false, CounterUniform(tr.seed, seq.position + k, 0 /*kSample*/)));
  return out;
}

}  // namespace specd::sampling::blockwise

#endif  // SPECD_COMMON_SAMPLING_BLOCKWISE_VERIFY_H_
