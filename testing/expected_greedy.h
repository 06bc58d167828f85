// The reference tokens a test compares against (PlainGreedy), for use inside a gtest body.
#ifndef SPECD_TESTING_EXPECTED_GREEDY_H_
#define SPECD_TESTING_EXPECTED_GREEDY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "testing/plain_greedy.h"

namespace specd::testing {

// PlainGreedy's tokens. If the reference itself fails to run, the calling test fails here and
// gets no tokens, so its comparison fails too rather than passing against nothing.
inline std::vector<int32_t> ExpectedGreedy(const std::string& path,
                                           const std::vector<int32_t>& prompt, int n) {
  auto out = PlainGreedy(path, prompt, n);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<int32_t>{};
}

}  // namespace specd::testing

#endif  // SPECD_TESTING_EXPECTED_GREEDY_H_
