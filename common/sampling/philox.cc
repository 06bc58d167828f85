#include "common/sampling/philox.h"

namespace specd::sampling {
namespace {

// Round multipliers and Weyl key increments from the Philox paper.
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

inline PhiloxCounter Round(const PhiloxCounter& x, const PhiloxKey& k) {
  const uint64_t prod0 = static_cast<uint64_t>(kMul0) * x[0];
  const uint64_t prod1 = static_cast<uint64_t>(kMul1) * x[2];
  const uint32_t hi0 = static_cast<uint32_t>(prod0 >> 32);
  const uint32_t lo0 = static_cast<uint32_t>(prod0);
  const uint32_t hi1 = static_cast<uint32_t>(prod1 >> 32);
  const uint32_t lo1 = static_cast<uint32_t>(prod1);
  return {hi1 ^ x[1] ^ k[0], lo1, hi0 ^ x[3] ^ k[1], lo0};
}

}  // namespace

PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    counter = Round(counter, key);
  }
  return counter;
}

double UniformFromBits(uint32_t w0, uint32_t w1) {
  const uint64_t hi = w0 >> 5;  // 27 bits
  const uint64_t lo = w1 >> 6;  // 26 bits
  return static_cast<double>((hi << 26) | lo) * 0x1.0p-53;
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
