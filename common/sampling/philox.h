// Philox4x32-10 counter-based random numbers (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11) and the counter layout specd uses for sampling decisions.
//
// Every random decision of a request is a pure function of (seed, position, purpose, lane), so a
// seeded request produces the same tokens however it is batched, retried or failed over.
#ifndef SPECD_COMMON_SAMPLING_PHILOX_H_
#define SPECD_COMMON_SAMPLING_PHILOX_H_

#include <array>
#include <cstdint>

#include "common/util/host_device.h"

namespace specd::sampling {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// One Philox4x32 block with 10 rounds: a keyed bijection of the 128-bit counter.
PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// The same block on plain arrays: THE definition, which the CUDA sampling kernels call too.
// Round multipliers and Weyl key increments from the Philox paper.
SPECD_HOST_DEVICE inline void Philox4x32_10InPlace(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;  // golden ratio
      k1 += 0xBB67AE85u;  // sqrt(3) - 1
    }
    const uint64_t prod0 = static_cast<uint64_t>(0xD2511F53u) * c[0];
    const uint64_t prod1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(prod0 >> 32), lo0 = static_cast<uint32_t>(prod0);
    const uint32_t hi1 = static_cast<uint32_t>(prod1 >> 32), lo1 = static_cast<uint32_t>(prod1);
    const uint32_t next0 = hi1 ^ c[1] ^ k0, next2 = hi0 ^ c[3] ^ k1;
    c[0] = next0;
    c[1] = lo1;
    c[2] = next2;
    c[3] = lo0;
  }
}

// Which decision a uniform feeds. Distinct purposes at one position are independent streams.
enum class RngPurpose : uint32_t {
  kSample = 0,    // plain sampling, and the bonus token after a fully accepted draft
  kDraft = 1,     // the drafter drawing d from its proposal q
  kAccept = 2,    // the accept/reject test of a draft token
  kResample = 3,  // the correction token drawn from norm(max(0, p - q)) after a rejection
};

// Counter-based RNG of one request. Counter words: [position lo, position hi, purpose, lane];
// key words: [seed lo, seed hi]. `position` is the absolute index in the sequence (prompt
// included) of the token being decided; `lane` is a spare index (e.g. candidate index of a
// tree-shaped draft), 0 for linear speculation and plain decoding.
//
// Why reusing a (position, purpose) pair across speculation steps is safe: the token emitted at
// position j depends only on the prefix and on the uniforms at position j, and a draft at
// position j whose step was cut short before j never influenced any emitted token.
class CounterRng {
 public:
  explicit CounterRng(uint64_t seed)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)} {}

  // The raw 128-bit block for this counter.
  PhiloxCounter Bits(int64_t position, RngPurpose purpose, uint32_t lane = 0) const;

  // Uniform double in [0, 1) with 53 random bits.
  double Uniform(int64_t position, RngPurpose purpose, uint32_t lane = 0) const;

  const PhiloxKey& key() const { return key_; }

 private:
  PhiloxKey key_;
};

// Maps two 32-bit words to a double in [0, 1) using 27 + 26 bits.
SPECD_HOST_DEVICE inline double UniformFromBits(uint32_t w0, uint32_t w1) {
  const uint64_t hi = w0 >> 5;  // 27 bits
  const uint64_t lo = w1 >> 6;  // 26 bits
  return static_cast<double>((hi << 26) | lo) * 0x1.0p-53;
}

// CounterRng(seed).Uniform(position, purpose, lane) as one host/device function of plain
// values (the counter layout is CounterRng's, below).
SPECD_HOST_DEVICE inline double CounterUniform(uint64_t seed, int64_t position, uint32_t purpose,
                                               uint32_t lane = 0) {
  const uint64_t pos = static_cast<uint64_t>(position);
  uint32_t c[4] = {static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), purpose, lane};
  Philox4x32_10InPlace(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return UniformFromBits(c[0], c[1]);
}

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_PHILOX_H_
