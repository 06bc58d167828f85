// A small fork-join thread pool for the CPU kernels.
//
// ParallelFor(n, fn) splits [0, n) into contiguous ranges and calls fn(begin, end)
// on the calling thread plus N-1 workers, returning when all ranges are done.
// Workers spin briefly after each job (low wake-up latency for decode-sized work),
// yielding the CPU now and then once the wait gets long (on an oversubscribed machine a
// spinning worker must not hold off the caller), and then sleep. A call allocates nothing.
// Calls from several threads are serialized; a ParallelFor issued from inside a
// worker (nested) runs inline on that worker.
#ifndef SPECD_KERNELS_CPU_THREAD_POOL_H_
#define SPECD_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace specd::kernels::cpu {

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
  void WorkerLoop();
  void DoChunks();

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
  alignas(64) std::atomic<int64_t> next_chunk_{0};
  alignas(64) std::atomic<int64_t> done_chunks_{0};
  alignas(64) std::atomic<int> active_{0};
  alignas(64) std::atomic<int> sleeping_{0};
  // Idle workers sleep on a condition variable: libstdc++ 12's atomic::wait missed wake-ups
  // here (a worker stayed asleep through the destructor's notify).
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::atomic<bool> stop_{false};
};

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_THREAD_POOL_H_
