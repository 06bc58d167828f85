// Conversions between the internal protos and the engine's plain types.
#ifndef SPECD_SERVICES_COMMON_PROTO_CONVERT_H_
#define SPECD_SERVICES_COMMON_PROTO_CONVERT_H_

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

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_PROTO_CONVERT_H_
