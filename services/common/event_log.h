// Structured logs: one line per event on stderr, logfmt (key=value), e.g.
//   ts=2026-12-01T18:07:00.123Z level=warn svc=router event=target_down error="connect failed"
// Events carry ids, codes, counts and service names, never prompt or output text (callers pass
// none; the router has no flag that would). Lines of one event kind (and `code`/`status`
// value) that come faster than kLinesPerSecond are dropped and counted: the next line of
// that kind says `suppressed=N`.
#ifndef SPECD_SERVICES_COMMON_EVENT_LOG_H_
#define SPECD_SERVICES_COMMON_EVENT_LOG_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include "absl/strings/string_view.h"

namespace specd::services {

enum class LogLevel { kInfo, kWarn, kError };

struct LogField {
  LogField(absl::string_view k, absl::string_view v) : key(k), value(v) {}
  LogField(absl::string_view k, const char* v) : key(k), value(v) {}
  LogField(absl::string_view k, const std::string& v) : key(k), value(v) {}
  LogField(absl::string_view k, int64_t v) : key(k), value(std::to_string(v)) {}
  LogField(absl::string_view k, int32_t v) : key(k), value(std::to_string(v)) {}
  LogField(absl::string_view k, uint64_t v) : key(k), value(std::to_string(v)) {}
  LogField(absl::string_view k, double v);
  LogField(absl::string_view k, bool v) : key(k), value(v ? "true" : "false") {}
  absl::string_view key;
  std::string value;
};

inline constexpr int kLinesPerSecond = 20;

// The `svc=` of every line this process writes; call once in main.
void SetLogService(absl::string_view service);

// Writes the line (one write call, so lines from threads never interleave).
void LogEvent(LogLevel level, absl::string_view event, std::initializer_list<LogField> fields = {});

// The line LogEvent would write (without the rate limit or the timestamp): for tests.
std::string FormatEventForTest(LogLevel level, absl::string_view event,
                               std::initializer_list<LogField> fields);

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_EVENT_LOG_H_
