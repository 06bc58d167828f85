#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace specd::kernels::cpu {
namespace {

// True on pool workers and on a caller while it runs a job's chunks.
thread_local bool t_in_worker = false;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// SPECD_POOL_SPIN_US=N pins every worker's budget to N microseconds (0: sleep at the first
// check, after 256 pauses; at most 1 s), for hosts where a spinning worker costs more than a
// wake-up; unset, the budget adapts. A value that is not such a count is refused on stderr
// once and the budget adapts.
std::optional<std::chrono::nanoseconds> PinnedSpinBudget() {
  static const std::optional<std::chrono::nanoseconds> pinned =
      []() -> std::optional<std::chrono::nanoseconds> {
    const char* v = std::getenv("SPECD_POOL_SPIN_US");
    if (v == nullptr || *v == '\0') return std::nullopt;
    constexpr long kMaxUs = 1000000;
    char* end = nullptr;
    errno = 0;
    const long us = std::strtol(v, &end, 10);
    if (*end != '\0' || errno == ERANGE || us < 0 || us > kMaxUs) {
      std::fprintf(stderr,
                   "SPECD_POOL_SPIN_US=%s: not a count of microseconds in [0, %ld]; the pool's "
                   "spin budget adapts instead\n",
                   v, kMaxUs);
      return std::nullopt;
    }
    return std::chrono::microseconds(us);
  }();
  return pinned;
}

int64_t SteadyNanos(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

std::chrono::nanoseconds NextSpinBudget(std::chrono::nanoseconds budget,
                                        std::chrono::nanoseconds idle) {
  if (idle <= kMaxSpinBudget / 2) {
    return std::clamp(std::max(budget, 2 * idle), kMinSpinBudget, kMaxSpinBudget);
  }
  return std::max(kMinSpinBudget, budget / 2);
}

int ThreadPool::AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

ThreadPool::ThreadPool(int num_threads) {
  num_threads_ = num_threads > 0 ? num_threads : AvailableCpus();
  workers_.reserve(num_threads_ - 1);
  shares_ = std::make_unique<Share[]>(static_cast<size_t>(num_threads_));
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lk(sleep_mu_);
    sleep_cv_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

int64_t ThreadPool::Take(int t, End end) {
  std::atomic<uint64_t>& fb = shares_[t].front_back;
  uint64_t cur = fb.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t front = cur >> 32, back = cur & 0xFFFFFFFFu;
    if (front >= back) return -1;
    const uint64_t taken = end == End::kFront ? front++ : --back;
    if (fb.compare_exchange_weak(cur, (front << 32) | back, std::memory_order_relaxed)) {
      return static_cast<int64_t>(taken);
    }
  }
}

void ThreadPool::RunChunk(int64_t c) {
  const int64_t b = c * chunk_;
  const int64_t e = b + chunk_ < n_ ? b + chunk_ : n_;
  tr_(ctx_, b, e);
  done_chunks_.fetch_add(1, std::memory_order_release);
}

void ThreadPool::DoChunks(int self) {
  for (int64_t c; (c = Take(self, End::kFront)) >= 0;) RunChunk(c);
  for (int i = 1; i < num_threads_; ++i) {
    const int other = (self + i) % num_threads_;
    for (int64_t c; (c = Take(other, End::kBack)) >= 0;) RunChunk(c);
  }
}

void ThreadPool::WorkerLoop(int self) {
  t_in_worker = true;
  uint32_t seen = 0;  // generation_ at construction: a job posted before this thread ran is seen
  uint64_t last = 0;
  const std::optional<std::chrono::nanoseconds> pinned_budget = PinnedSpinBudget();
  std::chrono::nanoseconds budget = pinned_budget.value_or(kMinSpinBudget);
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      const auto start = std::chrono::steady_clock::now();
      int spins = 0;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        CpuRelax();
        // On an oversubscribed machine this thread may share a CPU with the caller: after
        // ~2K pauses (tens of us) without a job, yield now and then so a spinning worker
        // never holds the caller off for a whole time slice. Back-to-back jobs (decode
        // ops a few us apart) never reach the yields.
        if (++spins > 2048 && spins % 64 == 0) std::this_thread::yield();
        if (spins % 256 == 0 && std::chrono::steady_clock::now() - start > budget) {
          {
            std::unique_lock<std::mutex> lk(sleep_mu_);
            sleeping_.fetch_add(1);  // seq_cst: Run() reads it after bumping generation_
            sleep_cv_.wait(lk, [&] { return generation_.load() != seen; });
            sleeping_.fetch_sub(1);
          }
          if (!pinned_budget) {
            // Idle until the job was posted; a wake-up that raced past another post (or a
            // stop) falls back to now.
            const int64_t posted = wake_posted_ns_.load(std::memory_order_relaxed);
            const int64_t idle_end = posted > SteadyNanos(start)
                                         ? posted
                                         : SteadyNanos(std::chrono::steady_clock::now());
            budget = NextSpinBudget(budget,
                                    std::chrono::nanoseconds(idle_end - SteadyNanos(start)));
          }
        }
      }
    }
    seen = g;
    if (stop_.load()) return;
    active_.fetch_add(1);
    const uint64_t e = job_epoch_.load();
    if (e != 0 && e != last) {  // 0: the caller is rewriting the job; last: already done
      DoChunks(self);
      last = e;
    }
    active_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::Run(int64_t n, int64_t grain, Trampoline tr, void* ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (num_threads_ == 1 || n <= grain || t_in_worker) {
    tr(ctx, 0, n);
    return;
  }
  std::lock_guard<std::mutex> lock(run_mu_);
  // Retire the previous job: no worker may still be reading its fields.
  job_epoch_.store(0);
  while (active_.load() != 0) CpuRelax();
  // About 8 chunks per thread balances load when other processes share the cores (a
  // worker that wakes late still finds work).
  int64_t chunks = (n + grain - 1) / grain;
  const int64_t max_chunks = static_cast<int64_t>(num_threads_) * 8;
  if (chunks > max_chunks) chunks = max_chunks;
  int64_t chunk = (n + chunks - 1) / chunks;
  if (chunk < grain) chunk = grain;
  tr_ = tr;
  ctx_ = ctx;
  n_ = n;
  chunk_ = chunk;
  num_chunks_ = (n + chunk - 1) / chunk;
  // Thread t's share: chunks [num_chunks_ * t / N, num_chunks_ * (t + 1) / N).
  for (int t = 0; t < num_threads_; ++t) {
    const uint64_t front = static_cast<uint64_t>(num_chunks_ * t / num_threads_);
    const uint64_t back = static_cast<uint64_t>(num_chunks_ * (t + 1) / num_threads_);
    shares_[t].front_back.store((front << 32) | back, std::memory_order_relaxed);
  }
  done_chunks_.store(0, std::memory_order_relaxed);
  job_epoch_.store(++last_epoch_);  // seq_cst: publishes the fields above
  generation_.fetch_add(1);         // seq_cst: ordered before reading sleeping_
  if (sleeping_.load() > 0) {
    wake_posted_ns_.store(SteadyNanos(std::chrono::steady_clock::now()),
                          std::memory_order_relaxed);
    std::lock_guard<std::mutex> lk(sleep_mu_);
    sleep_cv_.notify_all();
  }
  t_in_worker = true;  // a nested ParallelFor from inside fn runs inline
  DoChunks(0);
  t_in_worker = false;
  for (int spins = 0; done_chunks_.load(std::memory_order_acquire) < num_chunks_; ++spins) {
    if (spins < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();  // a worker holding a chunk was descheduled
    }
  }
}

}  // namespace specd::kernels::cpu
