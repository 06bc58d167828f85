// services/common/event_log: logfmt lines a log pipeline can parse (values quoted and escaped
// when they must be), and the per-event rate limit that reports what it dropped.
#include "services/common/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace specd::services {
namespace {

TEST(EventLogTest, FormatsLogfmtWithQuotingAndEscapes) {
  EXPECT_EQ(FormatEventForTest(LogLevel::kWarn, "target_down",
                               {{"seq", int64_t{42}}, {"ok", false}, {"ratio", 0.5}}),
            "level=warn svc=test event=target_down seq=42 ok=false ratio=0.5");
  EXPECT_EQ(FormatEventForTest(LogLevel::kInfo, "x",
                               {{"reason", "a b"}, {"q", "say \"hi\"\\n"}, {"eq", "k=v"},
                                {"empty", ""}, {"nl", "1\n2"}}),
            R"(level=info svc=test event=x reason="a b" q="say \"hi\"\\n" eq="k=v" empty="" nl="1\n2")");
}

// Captures what LogEvent writes to stderr while `body` runs.
template <typename F>
std::string CaptureStderr(F body) {
  const std::string path = ::testing::TempDir() + "/event_log_test.txt";
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, STDERR_FILENO);
  close(fd);
  body();
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(EventLogTest, FloodsAreLimitedPerEventAndCode) {
  SetLogService("unit");
  const std::string out = CaptureStderr([] {
    for (int i = 0; i < 500; ++i) {
      LogEvent(LogLevel::kInfo, "request_refused", {{"code", "RESOURCE_EXHAUSTED"}});
    }
    LogEvent(LogLevel::kInfo, "request_refused", {{"code", "INVALID_ARGUMENT"}});
  });
  // Within one second at most kLinesPerSecond; the loop may straddle a second boundary.
  const int flood = Count(out, "code=RESOURCE_EXHAUSTED");
  EXPECT_GE(flood, 1);
  EXPECT_LE(flood, 2 * kLinesPerSecond);
  EXPECT_EQ(Count(out, "code=INVALID_ARGUMENT"), 1) << "another code is not hidden by the flood";
  EXPECT_NE(out.find("ts="), std::string::npos);
  EXPECT_NE(out.find("svc=unit event=request_refused"), std::string::npos);
  // The next line of the flooded kind reports what was dropped.
  const std::string later = CaptureStderr([] {
    absl::SleepFor(absl::Seconds(1.1));
    LogEvent(LogLevel::kInfo, "request_refused", {{"code", "RESOURCE_EXHAUSTED"}});
  });
  EXPECT_NE(later.find("suppressed="), std::string::npos) << later;
}

}  // namespace
}  // namespace specd::services
