// The host side of the blockwise verifier (blockwise_verify.h): the plan a step's sequences
// make (built and validated on the host, then uploaded to the device or read in place), the
// outcomes turned back into VerifyResults, and the host twin that runs both phases on
// std::threads, one "thread block" at a time.
#ifndef SPECD_COMMON_SAMPLING_BLOCKWISE_VERIFY_HOST_H_
#define SPECD_COMMON_SAMPLING_BLOCKWISE_VERIFY_HOST_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sampling/blockwise_propose.h"
#include "common/sampling/blockwise_verify.h"
#include "common/sampling/speculative_verifier.h"

namespace specd::sampling {

// One sequence of a verification step, as VerifyInput describes it, with where its k + 1 rows
// sit in the step's logits matrix.
struct SequenceToVerify {
  const SamplingParams* params = nullptr;
  const PenaltyState* history = nullptr;       // committed tokens before d_1; nullptr = none
  absl::Span<const SparseProposal> proposals;  // [k]
  int64_t position = 0;                        // absolute position of d_1
  absl::Span<const int32_t> eos_token_ids;
  int64_t first_logits_row = 0;                // rows first_logits_row .. + k
  int64_t name = -1;                           // in errors, "sequence <name>"; -1: its index
};

class BlockwisePlan {
 public:
  // INVALID_ARGUMENT as VerifyDraft for invalid params or a malformed q (naming the sequence).
  static absl::StatusOr<BlockwisePlan> Build(int32_t vocab,
                                             absl::Span<const SequenceToVerify> sequences);

  // The arrays in host memory.
  blockwise::PlanView View() const;
  int32_t vocab() const { return vocab_; }
  int32_t num_rows() const { return static_cast<int32_t>(rows_.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }

  const std::vector<blockwise::Transforms>& transforms() const { return transforms_; }
  const std::vector<blockwise::RowPlan>& rows() const { return rows_; }
  const std::vector<blockwise::SeqPlan>& seqs() const { return seqs_; }
  const std::vector<blockwise::PenaltyEntry>& penalties() const { return penalties_; }
  const std::vector<blockwise::ProposalEntry>& proposals() const { return proposals_; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  int64_t name(size_t seq) const { return names_[seq]; }
  // INVALID_ARGUMENT unless every row the plan reads is one of `logits_rows` rows (what each
  // runner of the plan checks before it reads a step's logits).
  absl::Status CheckReadsWithin(int64_t logits_rows) const;

 private:
  int32_t vocab_ = 0;
  std::vector<blockwise::Transforms> transforms_;
  std::vector<blockwise::RowPlan> rows_;
  std::vector<blockwise::SeqPlan> seqs_;
  std::vector<blockwise::PenaltyEntry> penalties_;
  std::vector<blockwise::ProposalEntry> proposals_;
  std::vector<int32_t> stop_ids_;
  std::vector<int64_t> names_;  // [seqs]: what errors call each sequence
};

// INVALID_ARGUMENT unless top_n is in [1, blockwise::kMaxBlockwiseTopN] (every proposer's
// check).
absl::Status CheckProposalTopN(int32_t top_n);

// What phase 2 wrote, per sequence, as VerifyDraft's results. A row error the chain reached
// is INVALID_ARGUMENT naming the sequence, the row and the logit. tokens, logprobs:
// [plan.num_rows()]; top: [plan.num_rows(), kMaxLogprobsValue] (read for requests with
// num_logprobs > 0).
absl::StatusOr<std::vector<VerifyResult>> CollectResults(
    const BlockwisePlan& plan, absl::Span<const blockwise::SeqOutcome> outcomes,
    absl::Span<const int32_t> tokens, absl::Span<const float> logprobs,
    absl::Span<const blockwise::TopLogprobEntry> top);

// The host twin: both phases on `threads_per_block` std::threads per block, blocks one after
// another. logits: [*, vocab], holding every row the plan names.
absl::StatusOr<std::vector<VerifyResult>> VerifyBlockwiseOnHost(const BlockwisePlan& plan,
                                                                absl::Span<const float> logits,
                                                                int threads_per_block);

// Draft proposals (blockwise_propose.h): one plan sequence per drafted row, with the draft's
// params, the drafted token's position and no proposals (SequenceToVerify::proposals empty).
struct BlockwiseProposal {
  SparseProposal q;          // ids in rank order (most likely first), token drawn from q
  double confidence = 0.0;   // DraftConfidence's value
};

// What the proposal phase wrote, per plan sequence, as proposals. A malformed row is
// INVALID_ARGUMENT naming the sequence. ids, probs: [num_rows * top_n].
absl::StatusOr<std::vector<BlockwiseProposal>> CollectProposals(
    const BlockwisePlan& plan, absl::Span<const blockwise::ProposalOut> outs,
    absl::Span<const int32_t> ids, absl::Span<const float> probs, int32_t top_n);

// The host twin of the device proposal: SummarizeRow then ProposeFromRow per row. top_n in
// [1, kMaxBlockwiseTopN].
absl::StatusOr<std::vector<BlockwiseProposal>> ProposeBlockwiseOnHost(
    const BlockwisePlan& plan, absl::Span<const float> logits, int32_t top_n,
    int threads_per_block);

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_BLOCKWISE_VERIFY_HOST_H_
