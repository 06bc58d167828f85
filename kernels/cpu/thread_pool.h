// A small fork-join thread pool for the CPU kernels.
//
// ParallelFor(n, fn) splits [0, n) into contiguous ranges and calls fn(begin, end)
// on the calling thread plus N-1 workers, returning when all ranges are done. Each thread
// takes the chunks of its own contiguous share in order, then helps the others from the far
// end of theirs: a thread's memory stream (and the kernels' prefetches along it) stays
// contiguous, and a thread that woke late or was preempted still gets help.
// Workers spin after each job (low wake-up latency for decode-sized work), yielding the CPU
// now and then once the wait gets long (on an oversubscribed machine a spinning worker must
// not hold off the caller), and then sleep. How long they spin follows the gaps between jobs
// (NextSpinBudget). A call allocates nothing.
// Calls from several threads are serialized; a ParallelFor issued from inside a
// worker (nested) runs inline on that worker.
#ifndef SPECD_KERNELS_CPU_THREAD_POOL_H_
#define SPECD_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace specd::kernels::cpu {

// How long an idle worker spins before it sleeps. Waking a sleeping thread costs tens of
// microseconds on bare metal and 70-150 us on a VM whose idle vCPU halted, once per step: a
// service's steps come one hop apart (~0.3-0.6 ms), not the few microseconds between one
// step's ops, so a fixed short spin put the worker to sleep just before most steps. The budget
// follows what the worker saw: a job posted `idle` after its last one, where idle ≤
// kMaxSpinBudget / 2, would have been caught by a spin twice as long, so the budget grows to
// 2 × idle; a job posted after a longer idle (the service was idle, or the pool waited out
// another model's step) halves the budget back towards kMinSpinBudget. An idle pool so spins
// at most kMaxSpinBudget per worker before it sleeps; the cap stays short so that a draft pool
// waiting out its target's verify (several ms) sleeps instead of taking that step's cores.
inline constexpr std::chrono::nanoseconds kMinSpinBudget = std::chrono::microseconds(300);
inline constexpr std::chrono::nanoseconds kMaxSpinBudget = std::chrono::microseconds(1500);
// The next budget of a worker that spun `budget`, slept, and was handed a job posted `idle`
// after its last one. Pure: tests drive it as a timeline.
std::chrono::nanoseconds NextSpinBudget(std::chrono::nanoseconds budget,
                                        std::chrono::nanoseconds idle);

class ThreadPool {
 public:
  // num_threads <= 0: one thread per CPU this process may run on.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that run work, the caller included.
  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) for disjoint ranges covering [0, n); every range but the
  // last holds at least `grain` items. Blocks until all calls returned.
  template <typename Fn>
  void ParallelFor(int64_t n, Fn&& fn, int64_t grain = 1) {
    using F = std::remove_reference_t<Fn>;
    Run(n, grain,
        [](void* ctx, int64_t b, int64_t e) { (*static_cast<F*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // CPUs available to this process (sched_getaffinity), at least 1.
  static int AvailableCpus();

 private:
  using Trampoline = void (*)(void*, int64_t, int64_t);
  void Run(int64_t n, int64_t grain, Trampoline tr, void* ctx);
  void WorkerLoop(int self);
  // Runs chunks until none is left: self's share from the front, then the others' from
  // their backs.
  void DoChunks(int self);
  void RunChunk(int64_t c);
  // Chunk indices [front, back) of a thread's share, packed front << 32 | back so that the
  // owner (taking the front) and a helper (taking the back) race through one CAS.
  struct alignas(64) Share {
    std::atomic<uint64_t> front_back{0};
  };
  // The next chunk of shares_[t] from its front (the owner) or its back (a helper); -1: the
  // share is empty.
  enum class End { kFront, kBack };
  int64_t Take(int t, End end);

  int num_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;

  // Current job (written by the caller before bumping generation_).
  Trampoline tr_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  int64_t num_chunks_ = 0;

  // A job completes when all its chunks are done; the caller never waits for a worker
  // that has not woken up (cores shared with other processes). job_epoch_ is 0 while
  // the caller rewrites the job fields; active_ counts workers that may be reading them.
  uint64_t last_epoch_ = 0;  // caller side, under run_mu_
  alignas(64) std::atomic<uint32_t> generation_{0};  // bumped per job: wakes workers
  alignas(64) std::atomic<uint64_t> job_epoch_{0};
  std::unique_ptr<Share[]> shares_;  // one per thread: the caller is 0, workers 1..N-1
  alignas(64) std::atomic<int64_t> done_chunks_{0};
  alignas(64) std::atomic<int> active_{0};
  alignas(64) std::atomic<int> sleeping_{0};
  // When Run() last woke sleeping workers (steady_clock ns): a worker's idle gap ends when the
  // job was posted, not when the scheduler got round to running it.
  std::atomic<int64_t> wake_posted_ns_{0};
  // Idle workers sleep on a condition variable: libstdc++ 12's atomic::wait missed wake-ups
  // here (a worker stayed asleep through the destructor's notify).
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::atomic<bool> stop_{false};
};

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_THREAD_POOL_H_
