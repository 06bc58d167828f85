// Runs tests/integration/openai_client_test.py (the official `openai` Python client) against the
// router's OpenAI HTTP API on a real cluster. The interpreter is $SPECD_PYTHON (scripts/test.sh
// points it at a venv with `openai`); when that variable is set the test fails rather than
// skips if the package is missing, so CI cannot pass without running it.
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace specd::testing {
namespace {

std::string Python() {
  const char* env_python = std::getenv("SPECD_PYTHON");
  return env_python != nullptr ? env_python : "python3";
}

bool HasOpenAi() {
  const std::string probe = Python() + " -c 'import openai' >/dev/null 2>&1";
  return std::system(probe.c_str()) == 0;
}

std::string Script() {
  const char* src = std::getenv("SPECD_SOURCE_DIR");
  return std::string(src != nullptr ? src : "..") + "/tests/integration/openai_client_test.py";
}

// The HTTP status curl gets for `args` (its scratch file goes in `dir`).
int CurlStatus(const std::string& dir, const std::string& args) {
  const std::string out = dir + "/status.txt";
  const std::string cmd = "curl -s -o /dev/null -w '%{http_code}' " + args + " > " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  FILE* f = std::fopen(out.c_str(), "r");
  int code = 0;
  if (f != nullptr) {
    EXPECT_EQ(std::fscanf(f, "%d", &code), 1);
    std::fclose(f);
  }
  return code;
}

// A target wide enough that a 400-token stream lasts about a second here (more on a loaded
// machine): tests whose streams must outlast the requests sent after them use it.
void WiderTarget(TinyModelSpec& spec) {
  spec.num_layers = 4;
  spec.embedding_dim = 512;
  spec.ffn_dim = 2048;
}

#define SPECD_REQUIRE_OPENAI()                                                              \
  if (!HasOpenAi()) {                                                                       \
    if (std::getenv("SPECD_PYTHON") != nullptr) FAIL() << Python() << " lacks openai";      \
    GTEST_SKIP() << "NOT RUN: python3 has no `openai` (scripts/test.sh sets SPECD_PYTHON)"; \
  }

TEST(OpenAiClientTest, ChatCompletionsStreamsErrorsAndCancel) {
  SPECD_REQUIRE_OPENAI();
  Cluster c;
  const std::string cmd =
      Python() + " " + Script() + " main --base http://127.0.0.1:" +
      std::to_string(c.router_http_port) + "/v1 --target-metrics http://127.0.0.1:" +
      std::to_string(c.target_metrics_port) + "/metrics --draft-metrics http://127.0.0.1:" +
      std::to_string(c.draft_metrics_port) + "/metrics";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(OpenAiClientTest, AFullQueueIsRateLimitError) {
  SPECD_REQUIRE_OPENAI();
  ClusterOptions o;
  o.router_flags = {"--max-queue", "2", "--max-running", "2"};
  // A wider target, as in the drain test: the held streams (400 tokens, unread) must outlast
  // the requests sent after them. With the 64-wide default, a fast machine finished one first,
  // freeing its slot, and the fifth request was admitted (CI, stop 44).
  o.target_model_spec = WiderTarget;
  Cluster c(o);
  const std::string cmd = Python() + " " + Script() + " overload --base http://127.0.0.1:" +
                          std::to_string(c.router_http_port) +
                          "/v1 --router-metrics http://127.0.0.1:" +
                          std::to_string(c.router_metrics_port) + "/metrics";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// curl, as a newcomer would try it: the answer's shape and the errors' status codes.
TEST(OpenAiClientTest, CurlSmoke) {
  if (std::system("command -v curl >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "NOT RUN: no curl on this machine";
  }
  Cluster c;
  const std::string base = "http://127.0.0.1:" + std::to_string(c.router_http_port);
  auto status = [&](const std::string& args) { return CurlStatus(c.dir, args); };
  EXPECT_EQ(status(base + "/health"), 200);
  EXPECT_EQ(status(base + "/v1/models"), 200);
  EXPECT_EQ(status(base + "/v1/nothing"), 404);
  EXPECT_EQ(status("-X GET " + base + "/v1/chat/completions"), 405);
  EXPECT_EQ(status("-d '{not json' " + base + "/v1/chat/completions"), 400);
  EXPECT_EQ(status("-d '[1, 2]' " + base + "/v1/completions"), 400);
  // Not UTF-8 inside a string.
  const std::string bad = c.dir + "/bad.txt";
  EXPECT_EQ(std::system(("printf '{\"model\": \"\\377\\376\"}' > " + bad).c_str()), 0);
  EXPECT_EQ(status("--data-binary @" + bad + " " + base + "/v1/completions"), 400);
  EXPECT_EQ(status("-d '{\"model\": \"m\", \"prompt\": \"x\", \"max_tokens\": "
                   "1e400}' " + base + "/v1/completions"),
            400);
  // A body over the limit (4 MiB) is refused before it is read.
  const std::string big = c.dir + "/big.txt";
  EXPECT_EQ(std::system(("head -c 5000000 /dev/zero | tr '\\0' 'a' > " + big).c_str()), 0);
  EXPECT_EQ(status("--data-binary @" + big + " " + base + "/v1/completions"), 413);
  // The router still answers after all of that.
  EXPECT_EQ(status(base + "/health"), 200);
}

// SIGTERM: /health turns 503 and new requests are refused with 503, while a stream already
// running finishes with [DONE].
TEST(OpenAiClientTest, DrainingIs503AndFinishesInFlightStreams) {
  if (std::system("command -v curl >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "NOT RUN: no curl on this machine";
  }
  ClusterOptions o;
  o.router_flags = {"--drain-grace-s", "60", "--max-running", "1"};
  // A wider target (about 1 s per stream here, more on a loaded machine): the streams must
  // outlast the start of the four curls and the checks after SIGTERM, or the drain ends first.
  o.target_model_spec = WiderTarget;
  o.with_draft = false;  // the drain does not depend on speculation
  Cluster c(o);
  const std::string base = "http://127.0.0.1:" + std::to_string(c.router_http_port);
  const std::string body =
      R"({"model": "target", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400,)"
      R"( "ignore_eos": true, "temperature": 0, "stream": true})";
  // Four long streams, one running at a time (--max-running 1): the drain has work for a while.
  constexpr int kStreams = 4;
  for (int i = 0; i < kStreams; ++i) {
    const std::string bg = "curl -s -N -d '" + body + "' " + base + "/v1/chat/completions > " +
                           c.dir + "/stream" + std::to_string(i) + ".txt & echo $! >> " + c.dir +
                           "/curl.pids";
    ASSERT_EQ(std::system(bg.c_str()), 0);
  }
  // Wait until the router holds all of them (running + waiting, from its metrics).
  const std::string held =
      "curl -s http://127.0.0.1:" + std::to_string(c.router_metrics_port) +
      "/metrics | awk '/^specd_router_(running_sequences|waiting_requests) / {n += $2} END "
      "{exit !(n == " + std::to_string(kStreams) + ")}'";
  bool all_held = false;
  for (int i = 0; i < 200 && !all_held; ++i) {
    all_held = std::system(held.c_str()) == 0;
    if (!all_held) usleep(20 * 1000);
  }
  ASSERT_TRUE(all_held) << "the router never held the " << kStreams << " streams";
  c.router_proc->Signal(SIGTERM);
  usleep(100 * 1000);
  auto status = [&](const std::string& args) { return CurlStatus(c.dir, args); };
  EXPECT_EQ(status(base + "/health"), 503);
  EXPECT_EQ(status("-d '" + body + "' " + base + "/v1/chat/completions"), 503);
  // The streams that were in flight finish whole.
  EXPECT_EQ(std::system(("for p in $(cat " + c.dir + "/curl.pids); do while kill -0 $p "
                         "2>/dev/null; do sleep 0.1; done; done").c_str()),
            0);
  for (int i = 0; i < kStreams; ++i) {
    std::ifstream in(c.dir + "/stream" + std::to_string(i) + ".txt");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string tail = text.substr(text.size() > 600 ? text.size() - 600 : 0);
    EXPECT_NE(text.find("data: [DONE]"), std::string::npos)
        << "in-flight stream " << i << " must end with [DONE]; it ends: " << tail;
    EXPECT_NE(text.find("\"finish_reason\":\"length\""), std::string::npos) << tail;
  }
}

}  // namespace
}  // namespace specd::testing
