// engine::GlooCommunicator (rank processes over TCP), with the ranks as threads of this test so
// that one process can check them all: collectives at awkward sizes give bitwise the thread
// ranks' results on every rank; a rank that goes away or stops answering breaks the group
// loudly (on_broken, UNAVAILABLE) instead of hanging it; a stop on purpose does not.
#include "engine/gloo_communicator.h"


#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/thread_communicator.h"
#include "gtest/gtest.h"
#include "testing/free_port.h"

namespace specd::engine {
namespace {

struct Broken {
  absl::Mutex mu;
  std::vector<std::string> reasons;
  void Add(const std::string& r) {
    absl::MutexLock l(&mu);
    reasons.push_back(r);
  }
  size_t size() {
    absl::MutexLock l(&mu);
    return reasons.size();
  }
  std::string at(size_t i) {
    absl::MutexLock l(&mu);
    return reasons.at(i);
  }
};

// Connects `world` ranks (threads) through one rendezvous; every rank's on_broken records.
std::vector<std::unique_ptr<GlooCommunicator>> Group(int world, Broken* broken,
                                                     std::chrono::milliseconds timeout) {
  const std::string rendezvous = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  std::vector<std::unique_ptr<GlooCommunicator>> comms(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.rank = r;
      o.world_size = world;
      o.rendezvous = rendezvous;
      o.timeout = timeout;
      o.connect_timeout = std::chrono::seconds(30);
      o.on_broken = [broken](const std::string& why) { broken->Add(why); };
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> c = GlooCommunicator::Connect(o);
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) comms[r] = std::move(*c);
    });
  }
  for (std::thread& t : threads) t.join();
  return comms;
}

// Runs fn(rank) on one thread per rank and waits for all.
template <typename F>
void OnEveryRank(int world, F fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

TEST(GlooCommunicatorTest, AllReduceIsBitwiseTheThreadRanksOnEveryRank) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(world);
    Broken broken;
    auto gloo = Group(world, &broken, std::chrono::seconds(10));
    ThreadGroup group(world);
    for (int64_t n : {1, 3, 64, 577, 4097}) {
      SCOPED_TRACE(n);
      // Inputs whose float sums depend on the order (mixed magnitudes).
      std::mt19937 rng(static_cast<uint32_t>(n * 31 + world));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<std::vector<float>> in(world, std::vector<float>(n));
      for (auto& v : in) {
        for (float& x : v) x = dist(rng) * (rng() % 4 == 0 ? 1e4f : 1.0f);
      }
      std::vector<std::vector<float>> via_gloo = in, via_threads = in;
      OnEveryRank(world, [&](int r) {
        ASSERT_TRUE(gloo[r]->AllReduceSum(via_gloo[r].data(), n).ok());
      });
      std::vector<std::unique_ptr<Communicator>> tc;
      for (int r = 0; r < world; ++r) tc.push_back(group.Rank(r));
      OnEveryRank(world, [&](int r) {
        ASSERT_TRUE(tc[r]->AllReduceSum(via_threads[r].data(), n).ok());
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(std::memcmp(via_gloo[r].data(), via_threads[0].data(), n * sizeof(float)), 0)
            << "rank " << r;
        ASSERT_EQ(std::memcmp(via_threads[r].data(), via_threads[0].data(), n * sizeof(float)), 0);
      }
    }
    EXPECT_EQ(broken.size(), 0u);
    for (auto& c : gloo) c->Disarm();
  }
}

TEST(GlooCommunicatorTest, BroadcastFromEveryRootAtAwkwardSizes) {
  const int world = 3;
  Broken broken;
  auto gloo = Group(world, &broken, std::chrono::seconds(10));
  for (int root = 0; root < world; ++root) {
    for (int64_t bytes : {0, 1, 7, 4096, 100001}) {
      std::vector<std::vector<uint8_t>> buf(world, std::vector<uint8_t>(bytes));
      for (int64_t i = 0; i < bytes; ++i) buf[root][i] = static_cast<uint8_t>(i * 7 + root);
      OnEveryRank(world, [&](int r) {
        ASSERT_TRUE(gloo[r]->Broadcast(buf[r].data(), bytes, root).ok());
      });
      for (int r = 0; r < world; ++r) EXPECT_EQ(buf[r], buf[root]) << root << " " << bytes;
    }
  }
  EXPECT_FALSE(gloo[0]->Broadcast(nullptr, 4, 3).ok()) << "root out of range";
  EXPECT_EQ(broken.size(), 0u);
  for (auto& c : gloo) c->Disarm();
}

TEST(GlooCommunicatorTest, ARankThatGoesAwayBreaksTheGroupAtOnceEvenWhenIdle) {
  const int world = 3;
  Broken broken;
  auto gloo = Group(world, &broken, std::chrono::seconds(3));
  // Rank 2's process ends: its connections close (no collective is in flight).
  gloo[2].reset();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (broken.size() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(broken.size(), 1u) << "rank 0 did not notice rank 2's end";
  EXPECT_NE(broken.at(0).find("rank 2"), std::string::npos) << broken.at(0);
  // The survivors' next collective fails instead of waiting forever.
  std::vector<absl::Status> st(2);
  const auto t0 = std::chrono::steady_clock::now();
  OnEveryRank(2, [&](int r) {
    float x = 1.0f;
    st[r] = gloo[r]->AllReduceSum(&x, 1);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
  for (const absl::Status& s : st) EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // Once failed, always failed (no collective on half a group).
  float y = 0.0f;
  EXPECT_EQ(gloo[1]->Broadcast(&y, sizeof y, 0).code(), absl::StatusCode::kUnavailable);
  for (auto& c : gloo) {
    if (c != nullptr) c->Disarm();
  }
}

TEST(GlooCommunicatorTest, ARankThatHangsFailsTheCollectiveWithinTheTimeout) {
  const int world = 2;
  Broken broken;
  auto gloo = Group(world, &broken, std::chrono::milliseconds(500));
  float x = 1.0f;
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = gloo[0]->AllReduceSum(&x, 1);  // rank 1 never joins
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_GE(broken.size(), 1u);
  EXPECT_NE(broken.at(0).find("rank 0 of 2"), std::string::npos) << broken.at(0);
  for (auto& c : gloo) c->Disarm();
}

TEST(GlooCommunicatorTest, AStopOnPurposeIsNotABrokenGroup) {
  Broken broken;
  auto gloo = Group(3, &broken, std::chrono::seconds(3));
  for (auto& c : gloo) c->Disarm();
  gloo[1].reset();
  gloo[2].reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  gloo[0].reset();
  EXPECT_EQ(broken.size(), 0u);
}

TEST(GlooCommunicatorTest, BadOptionsAreRefusedByName) {
  GlooOptions o;
  o.world_size = 2;
  o.rank = 2;
  o.rendezvous = "127.0.0.1:1";
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> c = GlooCommunicator::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("rank 2"), std::string::npos);
  o.rank = 0;
  o.rendezvous = "no-port";
  c = GlooCommunicator::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("host:port"), std::string::npos);
  // Rank 1 with nobody serving the rendezvous: a clear deadline, not a hang.
  o.rank = 1;
  o.rendezvous = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  o.connect_timeout = std::chrono::milliseconds(500);
  c = GlooCommunicator::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("rank 0 at"), std::string::npos);
}

}  // namespace
}  // namespace specd::engine
