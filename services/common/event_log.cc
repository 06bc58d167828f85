#include "services/common/event_log.h"

#include <unistd.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace specd::services {
namespace {

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

// logfmt: bare when safe, otherwise double-quoted with \" \\ \n escaped.
void AppendValue(std::string& out, absl::string_view v) {
  bool bare = !v.empty();
  for (char c : v) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) >= 0x7f) {
      bare = false;
      break;
    }
  }
  if (bare) {
    out.append(v.data(), v.size());
    return;
  }
  out.push_back('"');
  for (char c : v) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else if (static_cast<unsigned char>(c) < ' ') {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(c));
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

struct Limiter {
  absl::Mutex mu;
  std::string service ABSL_GUARDED_BY(mu) = "specd";
  struct Window {
    int64_t second = 0;
    int lines = 0;
    int64_t suppressed = 0;
  };
  absl::flat_hash_map<std::string, Window> windows ABSL_GUARDED_BY(mu);
};

Limiter& State() {
  static Limiter* l = new Limiter;
  return *l;
}

std::string Format(LogLevel level, absl::string_view service, absl::string_view event,
                   std::initializer_list<LogField> fields) {
  std::string line = absl::StrCat("level=", LevelName(level), " svc=");
  AppendValue(line, service);
  line.append(" event=");
  AppendValue(line, event);
  for (const LogField& f : fields) {
    absl::StrAppend(&line, " ", f.key, "=");
    AppendValue(line, f.value);
  }
  return line;
}

}  // namespace

LogField::LogField(absl::string_view k, double v) : key(k), value(absl::StrFormat("%.6g", v)) {}

void SetLogService(absl::string_view service) {
  Limiter& l = State();
  absl::MutexLock lock(&l.mu);
  l.service = std::string(service);
}

std::string FormatEventForTest(LogLevel level, absl::string_view event,
                               std::initializer_list<LogField> fields) {
  return Format(level, "test", event, fields);
}

void LogEvent(LogLevel level, absl::string_view event, std::initializer_list<LogField> fields) {
  const absl::Time now = absl::Now();
  Limiter& l = State();
  std::string service;
  int64_t suppressed = 0;
  {
    absl::MutexLock lock(&l.mu);
    service = l.service;
    // Limited per event and outcome: a flood of one refusal code hides no other code.
    std::string key(event);
    for (const LogField& f : fields) {
      if (f.key == "code" || f.key == "status") absl::StrAppend(&key, "|", f.value);
    }
    Limiter::Window& w = l.windows[key];
    const int64_t second = absl::ToUnixSeconds(now);
    if (w.second != second) {
      w.second = second;
      w.lines = 0;
    }
    if (++w.lines > kLinesPerSecond) {
      ++w.suppressed;
      return;
    }
    suppressed = w.suppressed;
    w.suppressed = 0;
  }
  std::string line = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", now, absl::UTCTimeZone()), " ",
      Format(level, service, event, fields));
  if (suppressed > 0) absl::StrAppend(&line, " suppressed=", suppressed);
  line.push_back('\n');
  // One write: atomic for lines under PIPE_BUF, and never interleaved by stdio buffering.
  ssize_t left = static_cast<ssize_t>(line.size());
  const char* p = line.data();
  while (left > 0) {
    const ssize_t n = write(STDERR_FILENO, p, static_cast<size_t>(left));
    if (n <= 0) return;  // stderr closed: nothing better to do with a log line
    p += n;
    left -= n;
  }
}

}  // namespace specd::services
