// Prompt-lookup drafting done by the router itself (speculation mode NGRAM): the tokens that
// followed the most recent earlier occurrence of the sequence's last n tokens. The proposal
// distribution is a point mass on each drafted token, which verification accepts losslessly
// (DESIGN §2: q may be any distribution d is really drawn from).
#ifndef SPECD_SERVICES_ROUTER_NGRAM_PROPOSER_H_
#define SPECD_SERVICES_ROUTER_NGRAM_PROPOSER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace specd::router {

// Up to k tokens (none when no n-gram of length min_n..max_n recurs). Longer matches first.
std::vector<int32_t> NgramPropose(absl::Span<const int32_t> history, int32_t k,
                                  int32_t max_n = 3, int32_t min_n = 1);

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_NGRAM_PROPOSER_H_
