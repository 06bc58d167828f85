// THE penalty formula for one seen token's logit (sampling_params.h): repetition (over prompt
// and generated tokens), then presence and frequency (over generated tokens). PenaltyState
// applies it on the CPU, the CUDA sampling kernels on the device: one definition.
#ifndef SPECD_COMMON_SAMPLING_PENALTY_FORMULA_H_
#define SPECD_COMMON_SAMPLING_PENALTY_FORMULA_H_

#include <cstdint>

#include "common/util/host_device.h"

namespace specd::sampling {

// The penalties of a request, as the formula reads them (floats widened to double).
struct PenaltyFactors {
  float repetition = 1.0f;
  float presence = 0.0f;
  float frequency = 0.0f;
};

// logit of a token seen in the prompt or the generated text; generated_count: its occurrences
// in the generated text.
SPECD_HOST_DEVICE inline double PenalizeLogit(const PenaltyFactors& f, int32_t generated_count,
                                              double l) {
  const double rep = f.repetition;
  if (rep != 1.0) l = l > 0.0 ? l / rep : l * rep;
  if (generated_count > 0) {
    l -= static_cast<double>(f.presence) + static_cast<double>(f.frequency) * generated_count;
  }
  return l;
}

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_PENALTY_FORMULA_H_
