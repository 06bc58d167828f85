// Conversions between the internal protos and the engine's plain types.
#ifndef SPECD_SERVICES_COMMON_PROTO_CONVERT_H_
#define SPECD_SERVICES_COMMON_PROTO_CONVERT_H_

#include "common/sampling/draft_proposal.h"
#include "common/sampling/sampling_params.h"
#include "specd/internal/v1/common.pb.h"

namespace specd::services {

sampling::SamplingParams FromProto(const specd::internal::v1::SamplingParams& p);
void ToProto(const sampling::SamplingParams& p, specd::internal::v1::SamplingParams* out);

sampling::SparseProposal FromProto(const specd::internal::v1::Proposal& p);
void ToProto(const sampling::SparseProposal& p, specd::internal::v1::Proposal* out);

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_PROTO_CONVERT_H_
