#include "services/router/remote_backends.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/common/proto_convert.h"

namespace specd::router {
namespace {

void CountError(services::Metrics* m, const char* hop, const absl::Status& s) {
  m->router_rpc_errors.Add({{"hop", hop}, {"code", absl::StatusCodeToString(s.code())}})
      .Increment();
}

void ObserveLatency(prometheus::Histogram& h, absl::Time t0) {
  h.Observe(absl::ToDoubleSeconds(absl::Now() - t0));
}

// The router's view of a service's KV, refreshed by every answer that reports it (steps and
// releases alike, so it never lags a release).
void RecordKv(HopSeries& s, const iv1::KvUsage& kv) {
  s.kv_used.Set(kv.used_blocks());
  s.kv_free.Set(kv.free_blocks());
}

}  // namespace

HopSeries::HopSeries(services::Metrics& m, const char* hop, const char* service)
    : latency(m.router_rpc_latency.Add({{"hop", hop}}, services::LatencyBuckets())),
      kv_used(m.router_kv_blocks.Add({{"service", service}, {"state", "used"}})),
      kv_free(m.router_kv_blocks.Add({{"service", service}, {"state", "free"}})) {}

// ---- RemoteDrafter -------------------------------------------------------------------------

int64_t RemoteDrafter::CachedLength(spec::SeqId seq) const {
  auto it = held_.find(seq);
  return it == held_.end() ? -1 : it->second.kept;
}

absl::Status RemoteDrafter::Commit(spec::SeqId seq, absl::Span<const int32_t> committed) {
  auto it = held_.find(seq);
  if (it == held_.end()) return absl::OkStatus();
  Held& h = it->second;
  const size_t from = std::min<size_t>(h.committed, committed.size());
  h.kept = static_cast<int32_t>(from + spec::CommonPrefix(h.drafted, committed.subspan(from)));
  return absl::OkStatus();
}

absl::Status RemoteDrafter::Propose(absl::Span<const spec::DraftInput> in,
                                    absl::Span<spec::DraftOutput> out) {
  iv1::DraftStepRequest request;
  for (const spec::DraftInput& d : in) {
    // From what the service holds, but at least the last token: a sequence drafted in a step
    // whose target answer was lost (needs_prefill) comes back with nothing new.
    const auto held = held_.find(d.seq);
    const int32_t start = static_cast<int32_t>(
        std::clamp<int64_t>(held == held_.end() ? 0 : held->second.committed, 0,
                            static_cast<int64_t>(d.tokens.size()) - 1));
    iv1::DraftSequenceStep* s = request.add_sequences();
    s->set_seq_id(d.seq);
    s->set_start_pos(start);
    s->mutable_tokens()->Assign(d.tokens.begin() + start, d.tokens.end());
    s->set_num_draft_tokens(d.max_tokens);
    s->set_num_prompt_tokens(d.num_prompt);
    services::ToProto(*d.params, s->mutable_sampling());
    if (auto f = pending_features_.find(d.seq); f != pending_features_.end()) {
      s->set_features_start(f->second.start);
      s->set_features(services::FeaturesToBytes(f->second.rows));
    }
    metrics_->router_chosen_k.Observe(d.max_tokens);
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<iv1::DraftStepResponse> response =
      backend_->StepOverlapping(request, while_waiting_);
  ObserveLatency(series_.latency, t0);
  if (!response.ok()) {
    CountError(metrics_, "draft", response.status());
    return response.status();
  }
  absl::flat_hash_map<int64_t, const iv1::DraftSequenceResult*> result_of;
  for (const iv1::DraftSequenceResult& r : response->sequences()) result_of[r.seq_id()] = &r;
  for (size_t j = 0; j < in.size(); ++j) {
    out[j].proposals.clear();
    // Delivered (or, after a restart, lost with the rest: that sequence drafts no more).
    pending_features_.erase(in[j].seq);
    auto it = result_of.find(in[j].seq);
    if (it == result_of.end() || it->second->needs_prefill()) {
      held_.erase(in[j].seq);  // lost (a restart): resend everything next time
      continue;
    }
    Held& h = held_[in[j].seq];
    h.committed = h.kept = static_cast<int32_t>(in[j].tokens.size());
    h.drafted.clear();
    for (const iv1::Proposal& p : it->second->proposals()) {
      out[j].proposals.push_back(services::FromProto(p));
      h.drafted.push_back(out[j].proposals.back().token);
    }
    if (!h.drafted.empty()) h.drafted.pop_back();  // the last draft is proposed, never fed
  }
  RecordKv(series_, response->kv());
  return absl::OkStatus();
}

void RemoteDrafter::AddFeatures(spec::SeqId seq, int32_t first_pos,
                                absl::Span<const float> rows) {
  const int32_t dim = feature_dim_;
  if (dim <= 0 || rows.size() % dim != 0) return;
  PendingFeatures& p = pending_features_[seq];
  const int64_t end = p.start + static_cast<int64_t>(p.rows.size()) / dim;
  if (p.rows.empty() || first_pos < p.start || first_pos > end) {
    p.start = first_pos;
    p.rows.clear();
  } else {
    p.rows.resize(static_cast<size_t>(first_pos - p.start) * dim);  // re-sent rows overwrite
  }
  p.rows.insert(p.rows.end(), rows.begin(), rows.end());
}

void RemoteDrafter::ReleaseMany(absl::Span<const spec::SeqId> seqs) {
  for (spec::SeqId s : seqs) {
    held_.erase(s);
    pending_features_.erase(s);
  }
  if (!available_ || seqs.empty()) return;
  absl::StatusOr<iv1::KvUsage> kv =
      backend_->Release(std::vector<int64_t>(seqs.begin(), seqs.end()));
  if (!kv.ok()) {
    CountError(metrics_, "draft", kv.status());
    return;
  }
  RecordKv(series_, *kv);
}

// ---- RemoteTarget --------------------------------------------------------------------------

absl::Status RemoteTarget::Run(absl::Span<const spec::TargetCall> calls,
                               std::vector<spec::TargetOutcome>& out) {
  iv1::TargetStepRequest request;
  for (const spec::TargetCall& c : calls) {
    iv1::TargetSequenceStep* t = request.add_sequences();
    t->set_seq_id(c.seq);
    t->set_start_pos(c.start);
    t->mutable_tokens()->Assign(c.tokens.begin(), c.tokens.end());
    t->set_emit(c.emit);
    t->set_want_features(c.want_features);
    t->set_num_prompt_tokens(c.num_prompt);
    t->mutable_cached_prefix()->Assign(c.cached_prefix.begin(), c.cached_prefix.end());
    services::ToProto(*c.params, t->mutable_sampling());
    for (const sampling::SparseProposal& q : c.proposals) {
      services::ToProto(q, t->add_proposals());
    }
  }
  absl::StatusOr<iv1::TargetStepResponse> response = CallStep(request, series_.latency);
  if (!response.ok()) return response.status();
  absl::flat_hash_map<int64_t, const iv1::TargetSequenceResult*> result_of;
  for (const iv1::TargetSequenceResult& r : response->sequences()) result_of[r.seq_id()] = &r;
  out.assign(calls.size(), spec::TargetOutcome{});
  for (size_t i = 0; i < calls.size(); ++i) {
    auto it = result_of.find(calls[i].seq);
    if (it == result_of.end()) {
      return absl::InternalError(
          absl::StrCat("the target's answer has no sequence ", calls[i].seq));
    }
    const iv1::TargetSequenceResult& r = *it->second;
    spec::TargetOutcome& o = out[i];
    o.needs_prefill = r.needs_prefill();
    if (!r.features().empty()) {
      absl::Status st = services::FeaturesFromBytes(r.features(), r.feature_dim(),
                                                    "TargetSequenceResult.features", &o.features);
      if (!st.ok()) return absl::InternalError(absl::StrCat("the target's answer: ", st.message()));
    }
    sampling::VerifyResult& v = o.verified;
    v.num_drafted = static_cast<int32_t>(calls[i].proposals.size());
    v.num_accepted = r.num_accepted();
    v.stopped = r.stopped();
    for (bool a : r.accepted()) v.accepted.push_back(a);
    for (const iv1::TokenResult& t : r.tokens()) {
      v.tokens.push_back(t.token());
      v.logprobs.push_back(t.logprob());
      std::vector<sampling::TokenLogprob> top;
      for (int j = 0; j < t.top_ids_size() && j < t.top_logprobs_size(); ++j) {
        top.push_back({t.top_ids(j), t.top_logprobs(j)});
      }
      v.top_logprobs.push_back(std::move(top));
    }
  }
  return absl::OkStatus();
}

void RemoteTarget::Release(absl::Span<const spec::SeqId> seqs) {
  if (seqs.empty()) return;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<iv1::KvUsage> kv =
      backend_->Release(std::vector<int64_t>(seqs.begin(), seqs.end()));
  ObserveLatency(release_latency_, t0);
  if (!kv.ok()) {
    CountError(metrics_, "target", kv.status());
    return;
  }
  Record(*kv);
}

absl::StatusOr<iv1::TargetStepResponse> RemoteTarget::CallStep(
    const iv1::TargetStepRequest& request, prometheus::Histogram& latency) {
  const absl::Time t0 = absl::Now();
  absl::StatusOr<iv1::TargetStepResponse> response =
      backend_->StepOverlapping(request, while_waiting_);
  ObserveLatency(latency, t0);
  if (!response.ok()) {
    CountError(metrics_, "target", response.status());
    return response.status();
  }
  Record(response->kv());
  return response;
}

void RemoteTarget::Record(const iv1::KvUsage& kv) {
  RecordKv(series_, kv);
  adopted_blocks_.store(kv.adopted_blocks());
  evictable_blocks_.store(kv.evictable_blocks());
}

absl::Status RemoteTarget::LookupPrefixes(absl::Span<const spec::PrefixLookup> lookups,
                                         std::vector<int32_t>& cached) {
  iv1::TargetStepRequest request;
  for (const spec::PrefixLookup& l : lookups) {
    iv1::PrefixLookup* p = request.add_prefix_lookups();
    p->set_seq_id(l.seq);
    p->mutable_tokens()->Assign(l.tokens.begin(), l.tokens.end());
  }
  absl::StatusOr<iv1::TargetStepResponse> response = CallStep(request, lookup_latency_);
  if (!response.ok()) return response.status();
  if (response->prefix_cached_size() != static_cast<int>(lookups.size())) {
    return absl::InternalError(absl::StrCat("the target answered ", response->prefix_cached_size(),
                                            " of ", lookups.size(), " prefix lookups"));
  }
  cached.assign(response->prefix_cached().begin(), response->prefix_cached().end());
  return absl::OkStatus();
}

}  // namespace specd::router
