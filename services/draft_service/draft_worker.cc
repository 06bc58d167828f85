#include "services/draft_service/draft_worker.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "speculation/calibration.h"
#include "common/util/check.h"
#include "services/common/proto_convert.h"

namespace specd::services {

namespace iv1 = specd::internal::v1;

void DraftWorkerOptions::AddFlags(FlagSet& flags, const std::string& env, DraftWorkerOptions* o) {
  flags.Add("min-keep", env + "_MIN_KEEP", &o->min_keep,
            "a chain of drafts stops before the position that takes the product of the draft's "
            "confidences below this (0 = off)");
  flags.Add("min-extend", env + "_MIN_EXTEND", &o->min_extend,
            "no further draft round once that product is below this (0 = off)");
  flags.Add("calibrate-depth", env + "_CALIBRATE_DEPTH", &o->calibrate_depth,
            "KV positions the start-up calibration times a draft round at, so that the router's "
            "adaptive k prices what context adds to it (0: not priced)");
}

absl::Status DraftWorkerOptions::Check() const {
  for (auto [flag, value] : {std::pair<const char*, double>{"--min-keep", min_keep},
                             {"--min-extend", min_extend}}) {
    if (!(value >= 0.0 && value <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": expected a probability in [0, 1], got ", value));
    }
  }
  if (calibrate_depth < 0) return absl::InvalidArgumentError("--calibrate-depth must be >= 0");
  return absl::OkStatus();
}

DraftWorker::DraftWorker(std::unique_ptr<ModelHost> host, Options options)
    : host_(std::move(host)), options_(options) {
  spec::ModelDrafterOptions o;
  o.max_batch_tokens = host_->options().max_batch_tokens;
  o.min_keep = options.min_keep;
  o.min_extend = options.min_extend;
  absl::StatusOr<std::unique_ptr<spec::ModelDrafter>> d =
      spec::ModelDrafter::CreateOnRunner(host_.get(), o, "draft-service");
  SPECD_CHECK(d.ok(), "ModelDrafter over the host: %s", d.status().ToString().c_str());
  drafter_ = std::move(*d);
}

iv1::ServiceInfo DraftWorker::Info() const {
  iv1::ServiceInfo info = host_->Info();
  ToProto(cost_, &info);
  return info;
}

absl::Status DraftWorker::Calibrate() {
  // The deep probe within the draft's context (its KV room is checked by the probe itself).
  const int32_t depth = static_cast<int32_t>(std::min<int64_t>(
      options_.calibrate_depth, host_->context_length() - spec::kDepthCalibrationRows));
  absl::StatusOr<spec::CostCurve> c = spec::CalibrateDraft(
      *drafter_, host_->vocab_size(), std::min(16, host_->model().options().max_logit_rows),
      std::max(0, depth));
  if (!c.ok()) return c.status();
  cost_ = std::move(*c);
  return absl::OkStatus();
}

absl::Status DraftWorker::Validate(const iv1::DraftStepRequest& request) const {
  const int32_t vocab = host_->vocab_size();
  const int64_t ctx = host_->context_length();
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
    if (!s.features().empty()) {
      const int64_t dim = host_->model().config().embedding_dim;
      if (!drafter_->wants_features()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".features: this draft model is not feature-conditioned"));
      }
      if (s.features_start() < 0 ||
          s.features().size() % (2 * static_cast<size_t>(dim)) != 0 ||
          s.features_start() + static_cast<int64_t>(s.features().size() / (2 * dim)) >
              s.start_pos() + s.tokens_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ".features: need whole rows of ", dim,
            " half floats at positions from features_start >= 0 up to the last token"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<iv1::DraftStepResponse> DraftWorker::Step(const iv1::DraftStepRequest& request) {
  if (absl::Status st = Validate(request); !st.ok()) return st;
  const auto t0 = std::chrono::steady_clock::now();
  iv1::DraftStepResponse response;
  response.set_instance_id(host_->instance_id());

  // Per sequence: the full committed history (what the drafter holds up to start_pos, then the
  // request's tokens), its transforms, penalty history and counter RNG. Sized up front: the
  // drafter's inputs point into these.
  const int n = request.sequences_size();
  std::vector<std::vector<int32_t>> tokens(n);
  std::vector<sampling::SamplingParams> params(n);
  std::vector<sampling::PenaltyState> penalties(n);
  std::vector<sampling::CounterRng> rngs;
  rngs.reserve(n);
  std::vector<spec::DraftInput> in;
  std::vector<int> result_of;  // in[j] -> response.sequences index
  for (int i = 0; i < n; ++i) {
    const iv1::DraftSequenceStep& s = request.sequences(i);
    iv1::DraftSequenceResult* r = response.add_sequences();
    r->set_seq_id(s.seq_id());
    params[i] = FromProto(s.sampling());
    rngs.emplace_back(params[i].seed);
    const std::vector<int32_t>* fed = drafter_->Fed(s.seq_id());
    const int64_t held = fed == nullptr ? 0 : static_cast<int64_t>(fed->size());
    if (s.start_pos() > held) {  // lost (restart, or released): the router resends it all
      if (fed != nullptr) drafter_->Release(s.seq_id());
      r->set_needs_prefill(true);
      continue;
    }
    if (fed != nullptr) tokens[i].assign(fed->begin(), fed->begin() + s.start_pos());
    tokens[i].insert(tokens[i].end(), s.tokens().begin(), s.tokens().end());
    const size_t n_prompt = std::min<size_t>(std::max(0, s.num_prompt_tokens()), tokens[i].size());
    penalties[i] = sampling::PenaltyState::FromTokens(
        absl::MakeConstSpan(tokens[i].data(), n_prompt),
        absl::MakeConstSpan(tokens[i].data() + n_prompt, tokens[i].size() - n_prompt));
    if (!s.features().empty()) {
      std::vector<float> rows;
      const int64_t dim = host_->model().config().embedding_dim;
      if (absl::Status st = FeaturesFromBytes(s.features(), dim, "features", &rows); !st.ok()) {
        return st;  // Validate checked the size: cannot happen
      }
      drafter_->AddFeatures(s.seq_id(), s.features_start(), rows);
    }
    in.push_back(spec::DraftInput{s.seq_id(), tokens[i], &params[i], &penalties[i], &rngs[i],
                                  s.num_draft_tokens()});
    result_of.push_back(i);
  }
  std::vector<spec::DraftOutput> out(in.size());
  if (!in.empty()) {
    if (absl::Status st = drafter_->Propose(in, absl::MakeSpan(out)); !st.ok()) return st;
  }
  for (size_t j = 0; j < out.size(); ++j) {
    iv1::DraftSequenceResult* r = response.mutable_sequences(result_of[j]);
    for (const sampling::SparseProposal& q : out[j].proposals) ToProto(q, r->add_proposals());
  }
  *response.mutable_kv() = host_->Usage();
  response.set_forward_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return response;
}

iv1::ReleaseResponse DraftWorker::Release(const iv1::ReleaseRequest& request) {
  for (int64_t id : request.seq_ids()) drafter_->Release(id);
  if (request.drop_prefix_cache()) host_->DropPrefixCache();
  iv1::ReleaseResponse r;
  *r.mutable_kv() = host_->Usage();
  return r;
}

}  // namespace specd::services
