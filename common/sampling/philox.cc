#include "common/sampling/philox.h"

namespace specd::sampling {

PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  Philox4x32_10InPlace(counter.data(), key[0], key[1]);
  return counter;
}

PhiloxCounter CounterRng::Bits(int64_t position, RngPurpose purpose, uint32_t lane) const {
  const uint64_t pos = static_cast<uint64_t>(position);
  return Philox4x32_10({static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32),
                        static_cast<uint32_t>(purpose), lane},
                       key_);
}

double CounterRng::Uniform(int64_t position, RngPurpose purpose, uint32_t lane) const {
  const PhiloxCounter bits = Bits(position, purpose, lane);
  return UniformFromBits(bits[0], bits[1]);
}

}  // namespace specd::sampling
