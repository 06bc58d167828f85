// The step socket (services/common/step_socket.h) without a model: a handler's answers and
// errors cross unchanged, malformed frames are refused with why, a stalled step is
// DEADLINE_EXCEEDED and never read as the next answer, and Stop() ends connections only
// between steps.
#include "services/common/step_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace specd::services {
namespace {

std::string SocketPath(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/specd-step-" + std::to_string(getpid()) +
         "-" + name + ".sock";
}

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

// Answers "echo:<request>", or the status a request names ("fail:<message>").
StepSocketServer::Reply Echo(absl::string_view request) {
  StepSocketServer::Reply r;
  if (request.substr(0, 5) == "fail:") {
    r.status = absl::FailedPreconditionError(request.substr(5));
  } else {
    r.response = "echo:" + std::string(request);
  }
  return r;
}

TEST(StepSocketTest, AnswersAndErrorsCrossUnchanged) {
  std::atomic<int> after{0};
  absl::Mutex mu;
  absl::flat_hash_set<std::thread::id> step_threads;  // the threads that ran steps
  auto server = StepSocketServer::Listen(SocketPath("echo"), 1 << 20, [&](absl::string_view req) {
    {
      absl::MutexLock l(&mu);
      step_threads.insert(std::this_thread::get_id());
    }
    StepSocketServer::Reply r = Echo(req);
    r.after = [&] { ++after; };
    return r;
  });
  ASSERT_TRUE(server.ok()) << server.status();
  StepSocketClient client(1 << 20);
  ASSERT_TRUE(client.Connect((*server)->path()).ok());
  std::string resp;
  bool unsent = true;
  int waited = 0;
  for (int i = 0; i < 50; ++i) {
    const std::string req = "step " + std::to_string(i) + std::string(i * 997, 'x');
    ASSERT_TRUE(client.Call(req, [&] { ++waited; }, Soon(), &resp, &unsent).ok());
    EXPECT_EQ(resp, "echo:" + req);
    EXPECT_FALSE(unsent);
  }
  EXPECT_EQ(waited, 50) << "the overlapped work runs once per step";
  // An empty request and an empty answer are frames too.
  ASSERT_TRUE(client.Call("", [] {}, Soon(), &resp, &unsent).ok());
  EXPECT_EQ(resp, "echo:");

  absl::Status failed = client.Call("fail:no such sequence 7", [] {}, Soon(), &resp, &unsent);
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(failed.message(), "no such sequence 7");
  EXPECT_TRUE(client.connected()) << "a failed step keeps the connection";
  ASSERT_TRUE(client.Call("again", [] {}, Soon(), &resp, &unsent).ok());
  EXPECT_EQ(resp, "echo:again");
  (*server)->Stop();
  EXPECT_EQ(after.load(), 53) << "the bookkeeping runs after every reply";
  // No hand-off: every step of the connection ran on one thread, the one that read it.
  absl::MutexLock l(&mu);
  EXPECT_EQ(step_threads.size(), 1u);
  EXPECT_FALSE(step_threads.contains(std::this_thread::get_id()));
}

TEST(StepSocketTest, MalformedFramesAreRefusedWithWhy) {
  auto server = StepSocketServer::Listen(SocketPath("limits"), 1000, Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  StepSocketClient client(1 << 20);
  ASSERT_TRUE(client.Connect((*server)->path()).ok());
  std::string resp;
  bool unsent;
  absl::Status big = client.Call(std::string(1001, 'x'), [] {}, Soon(), &resp, &unsent);
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
  EXPECT_NE(big.message().find("1001 bytes exceeds the limit of 1000"), std::string::npos) << big;

  // A frame of another kind, written by hand: refused, and the connection ends.
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string path = (*server)->path();
  std::memcpy(a.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const char frame[] = {2, 0, 0, 0, 9, 'h', 'i'};
  ASSERT_EQ(write(fd, frame, sizeof(frame)), static_cast<ssize_t>(sizeof(frame)));
  char answer[256];
  const ssize_t n = read(fd, answer, sizeof(answer));
  ASSERT_GT(n, 6);
  EXPECT_EQ(answer[4], static_cast<char>(StepFrame::kError));
  EXPECT_EQ(answer[5], static_cast<char>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(answer + 6, n - 6).find("kind 9"), std::string::npos);
  EXPECT_EQ(read(fd, answer, sizeof(answer)), 0) << "the server closed the connection";
  close(fd);

  // The refused client's next step finds its connection gone before anything was sent.
  absl::Status after = client.Call("x", [] {}, Soon(), &resp, &unsent);
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
  EXPECT_TRUE(unsent);
  ASSERT_TRUE(client.Connect((*server)->path()).ok());
  EXPECT_TRUE(client.Call("x", [] {}, Soon(), &resp, &unsent).ok());
}

TEST(StepSocketTest, AStalledStepIsDeadlineExceededAndItsLateAnswerIsNeverRead) {
  absl::Notification release;
  auto server = StepSocketServer::Listen(SocketPath("stall"), 1 << 20, [&](absl::string_view r) {
    if (r == "stall") release.WaitForNotification();
    return Echo(r);
  });
  ASSERT_TRUE(server.ok()) << server.status();
  StepSocketClient client(1 << 20);
  ASSERT_TRUE(client.Connect((*server)->path()).ok());
  std::string resp;
  bool unsent;
  const absl::Time t0 = absl::Now();
  absl::Status st = client.Call("stall", [] {}, t0 + absl::Milliseconds(300), &resp, &unsent);
  const absl::Duration waited = absl::Now() - t0;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_GE(waited, absl::Milliseconds(290));
  EXPECT_LT(waited, absl::Seconds(3));
  EXPECT_FALSE(client.connected()) << "the stalled step's connection is closed";
  release.Notify();
  ASSERT_TRUE(client.Connect((*server)->path()).ok());
  ASSERT_TRUE(client.Call("next", [] {}, Soon(), &resp, &unsent).ok());
  EXPECT_EQ(resp, "echo:next") << "never the stalled step's late answer";
}

TEST(StepSocketTest, StopEndsConnectionsBetweenStepsAndRemovesTheSocket) {
  absl::Notification in_step, finish;
  auto server = StepSocketServer::Listen(SocketPath("stop"), 1 << 20, [&](absl::string_view r) {
    if (r == "slow") {
      in_step.Notify();
      finish.WaitForNotification();
    }
    return Echo(r);
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string path = (*server)->path();
  StepSocketClient busy(1 << 20), idle(1 << 20);
  ASSERT_TRUE(busy.Connect(path).ok());
  ASSERT_TRUE(idle.Connect(path).ok());
  std::string resp, idle_resp;
  bool unsent;
  ASSERT_TRUE(idle.Call("warm", [] {}, Soon(), &idle_resp, &unsent).ok());
  absl::Status slow;
  std::thread caller([&] { slow = busy.Call("slow", [] {}, Soon(), &resp, &unsent); });
  in_step.WaitForNotification();
  std::thread stopper([&] { (*server)->Stop(); });
  absl::SleepFor(absl::Milliseconds(100));
  finish.Notify();
  caller.join();
  stopper.join();
  EXPECT_TRUE(slow.ok()) << "the step in flight is answered: " << slow;
  EXPECT_EQ(resp, "echo:slow");
  // The idle connection was ended without a step: its next request is never sent.
  absl::Status after = idle.Call("late", [] {}, Soon(), &idle_resp, &unsent);
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
  EXPECT_TRUE(unsent) << after;
  EXPECT_FALSE(busy.Connect(path).ok()) << "nothing listens after Stop()";
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the socket file is removed";
}

// A router that reconnects again and again (timeouts, restarts) leaves no threads behind: each
// closed connection's thread is joined by the next accept.
TEST(StepSocketTest, ClosedConnectionsLeaveNoThreadsBehind) {
  auto server = StepSocketServer::Listen(SocketPath("reconnect"), 1 << 20, Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  std::string resp;
  bool unsent;
  for (int i = 0; i < 40; ++i) {
    StepSocketClient client(1 << 20);
    ASSERT_TRUE(client.Connect((*server)->path()).ok());
    ASSERT_TRUE(client.Call("x", [] {}, Soon(), &resp, &unsent).ok());
  }  // each client closes its connection here
  // Each accept joins the threads of the connections that have ended by then. On a loaded
  // machine a few closed connections' threads may still be returning at an accept, so connect
  // again (a bounded number of times, a pause between) until those have been joined too: then
  // only the live connection and the one closed just before it may be held, never the 41 of
  // every connection so far.
  int64_t held = 0;
  for (int attempt = 0; attempt < 50; ++attempt) {
    StepSocketClient probe(1 << 20);
    ASSERT_TRUE(probe.Connect((*server)->path()).ok());
    ASSERT_TRUE(probe.Call("y", [] {}, Soon(), &resp, &unsent).ok());
    held = (*server)->threads_held();
    if (held <= 2) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LE(held, 2);
}

TEST(StepSocketTest, AWorkerServesOneBesideAUnixListenInPlaintextOnly) {
  EXPECT_EQ(StepSocketPath("auto", "unix:/run/specd/target.sock", false),
            "/run/specd/target.sock.step");
  EXPECT_EQ(StepSocketPath("auto", "unix:///run/t.sock", false), "/run/t.sock.step");
  EXPECT_EQ(StepSocketPath("auto", "unix:/run/t.sock", /*tls=*/true), "") << "TLS keeps steps on TLS";
  EXPECT_EQ(StepSocketPath("auto", "0.0.0.0:50052", false), "") << "another host may be the router";
  EXPECT_EQ(StepSocketPath("off", "unix:/run/t.sock", false), "");
  EXPECT_EQ(StepSocketPath("", "unix:/run/t.sock", false), "");
  EXPECT_EQ(StepSocketPath("/tmp/steps.sock", "0.0.0.0:50052", false), "/tmp/steps.sock");
}

TEST(StepSocketTest, BadPathsAreNamed) {
  auto too_long = StepSocketServer::Listen("/tmp/" + std::string(200, 'p'), 100, Echo);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("step socket path"), std::string::npos);
  auto missing_dir = StepSocketServer::Listen("/nonexistent-dir/x.sock", 100, Echo);
  EXPECT_FALSE(missing_dir.ok());
  EXPECT_NE(missing_dir.status().message().find("/nonexistent-dir/x.sock"), std::string::npos);
  StepSocketClient client(100);
  EXPECT_EQ(client.Connect("/nonexistent-dir/x.sock").code(), absl::StatusCode::kUnavailable);
  std::string resp;
  bool unsent = false;
  int waited = 0;
  EXPECT_EQ(client.Call("x", [&] { ++waited; }, Soon(), &resp, &unsent).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(unsent);
  EXPECT_EQ(waited, 1) << "the overlapped work runs even when the step cannot";
}

}  // namespace
}  // namespace specd::services
