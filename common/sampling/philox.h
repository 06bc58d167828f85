// Philox4x32-10 counter-based random numbers (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11) and the counter layout specd uses for sampling decisions.
//
// Every random decision of a request is a pure function of (seed, position, purpose, lane), so a
// seeded request produces the same tokens however it is batched, retried or failed over.
#ifndef SPECD_COMMON_SAMPLING_PHILOX_H_
#define SPECD_COMMON_SAMPLING_PHILOX_H_

#include <array>
#include <cstdint>

namespace specd::sampling {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// One Philox4x32 block with 10 rounds: a keyed bijection of the 128-bit counter.
PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key);

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
double UniformFromBits(uint32_t w0, uint32_t w1);

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_PHILOX_H_
