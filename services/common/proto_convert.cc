#include "services/common/proto_convert.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/gguf/quants.h"

namespace specd::services {

sampling::SamplingParams FromProto(const specd::internal::v1::SamplingParams& p) {
  sampling::SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p();
  s.min_p = p.min_p();
  s.repetition_penalty = p.repetition_penalty();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.seed = p.seed();
  s.num_logprobs = p.num_logprobs();
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  return s;
}

void ToProto(const sampling::SamplingParams& s, specd::internal::v1::SamplingParams* out) {
  out->set_temperature(s.temperature);
  out->set_top_k(s.top_k);
  out->set_top_p(s.top_p);
  out->set_min_p(s.min_p);
  out->set_repetition_penalty(s.repetition_penalty);
  out->set_presence_penalty(s.presence_penalty);
  out->set_frequency_penalty(s.frequency_penalty);
  out->set_seed(s.seed);
  out->set_num_logprobs(s.num_logprobs);
  out->mutable_stop_token_ids()->Assign(s.stop_token_ids.begin(), s.stop_token_ids.end());
  out->set_ignore_eos(s.ignore_eos);
}

sampling::SparseProposal FromProto(const specd::internal::v1::Proposal& p) {
  sampling::SparseProposal s;
  s.token = p.token();
  s.ids.assign(p.ids().begin(), p.ids().end());
  s.probs.assign(p.probs().begin(), p.probs().end());
  return s;
}

void ToProto(const sampling::SparseProposal& s, specd::internal::v1::Proposal* out) {
  out->set_token(s.token);
  out->mutable_ids()->Assign(s.ids.begin(), s.ids.end());
  out->mutable_probs()->Assign(s.probs.begin(), s.probs.end());
}

void ToProto(const spec::CostCurve& curve, specd::internal::v1::ServiceInfo* info) {
  info->clear_step_cost();
  for (const auto& [size, seconds] : curve.points()) {
    specd::internal::v1::CostPoint* p = info->add_step_cost();
    p->set_size(size);
    p->set_seconds(seconds);
  }
  info->set_step_cost_per_key(curve.depth().per_key);
  info->set_step_cost_per_row_key(curve.depth().per_row_key);
  info->set_step_cost_per_logit_row(curve.logits().per_row);
  info->set_step_cost_logit_rows(curve.logits().calibrated_rows);
  info->set_step_cost_per_catch_up_row(curve.catch_up_row());
}

spec::CostCurve CostCurveFromProto(const specd::internal::v1::ServiceInfo& info) {
  std::vector<std::pair<double, double>> points;
  for (const auto& p : info.step_cost()) points.push_back({p.size(), p.seconds()});
  if (points.empty()) return spec::CostCurve();
  spec::CostCurve curve(std::move(points));
  // Negative or NaN from a peer would make context look cheaper than none: read as none.
  const auto seconds = [](double x) { return x > 0.0 ? x : 0.0; };
  curve.set_depth({seconds(info.step_cost_per_key()), seconds(info.step_cost_per_row_key())});
  // Likewise for logit rows: without a positive row count the saving is not known.
  if (info.step_cost_logit_rows() > 0) {
    curve.set_logits({seconds(info.step_cost_per_logit_row()), info.step_cost_logit_rows()});
  }
  curve.set_catch_up_row(seconds(info.step_cost_per_catch_up_row()));
  return curve;
}

std::string FeaturesToBytes(absl::Span<const float> rows) {
  std::string out(rows.size() * sizeof(uint16_t), '\0');
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint16_t h = gguf::F32ToF16(rows[i]);
    out[2 * i] = static_cast<char>(h & 0xff);
    out[2 * i + 1] = static_cast<char>(h >> 8);
  }
  return out;
}

absl::Status FeaturesFromBytes(const std::string& bytes, int64_t dim, const char* field,
                               std::vector<float>* rows) {
  if (dim <= 0 || bytes.size() % (2 * static_cast<size_t>(dim)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", bytes.size(), " bytes are not whole rows of ", dim, " half floats"));
  }
  rows->resize(bytes.size() / 2);
  for (size_t i = 0; i < rows->size(); ++i) {
    const uint16_t h = static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * i])) |
                       static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * i + 1])) << 8;
    (*rows)[i] = gguf::F16ToF32(h);
  }
  return absl::OkStatus();
}

}  // namespace specd::services
