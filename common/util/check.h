// SPECD_CHECK: aborts with a message on a broken invariant (a bug, never bad input).
// Abseil 20220623 (Debian 12) has no absl/log, so we keep our own minimal macro.
#ifndef SPECD_COMMON_UTIL_CHECK_H_
#define SPECD_COMMON_UTIL_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define SPECD_CHECK(cond, ...)                                                       \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                             \
      std::fprintf(stderr, "\n");                                                    \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

#endif  // SPECD_COMMON_UTIL_CHECK_H_
