// Conversions between the internal protos and the engine's plain types.
#ifndef SPECD_SERVICES_COMMON_PROTO_CONVERT_H_
#define SPECD_SERVICES_COMMON_PROTO_CONVERT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/sampling_params.h"
#include "speculation/adaptive_k.h"
#include "specd/internal/v1/common.pb.h"

namespace specd::services {

sampling::SamplingParams FromProto(const specd::internal::v1::SamplingParams& p);
void ToProto(const sampling::SamplingParams& p, specd::internal::v1::SamplingParams* out);

sampling::SparseProposal FromProto(const specd::internal::v1::Proposal& p);
void ToProto(const sampling::SparseProposal& p, specd::internal::v1::Proposal* out);
// ServiceInfo.step_cost <-> the calibrated curve of the adaptive-k policy (empty: none).
void ToProto(const spec::CostCurve& curve, specd::internal::v1::ServiceInfo* info);
spec::CostCurve CostCurveFromProto(const specd::internal::v1::ServiceInfo& info);

// Hidden-state rows on the wire (TargetSequenceResult.features, DraftSequenceStep.features):
// IEEE half floats, little-endian, row after row. FeaturesFromBytes: INVALID_ARGUMENT naming
// `field` unless the bytes hold whole rows of `dim`.
std::string FeaturesToBytes(absl::Span<const float> rows);
absl::Status FeaturesFromBytes(const std::string& bytes, int64_t dim, const char* field,
                               std::vector<float>* rows);

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_PROTO_CONVERT_H_
