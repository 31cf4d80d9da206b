// The persistent thread pool (see thread_pool.h). Workers spin briefly on the generation counter
// before sleeping on a condition variable: decode issues products every few hundred
// microseconds, and a futex wake-up costs tens of microseconds that spinning avoids.
#include "core/thread_pool.h"

#include <cstdlib>

#include "core/check.h"

namespace fp4moe {
namespace {
constexpr int kSpinIterations = 4000;  // ~100 us (pause is ~65 cycles on Zen 3)

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  FP4MOE_CHECK(threads >= 1);
  workers_.reserve(threads - 1);
  // Each worker starts from the generation of construction, not from what it reads when the OS
  // first runs it: a worker started late must still see (and act on) a job or stop published
  // before it ran.
  const uint32_t start = generation_.load(std::memory_order_relaxed);
  for (int t = 1; t < threads; ++t) {
    workers_.emplace_back([this, t, start] { worker_loop(t, start); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("FP4MOE_THREADS")) {
      const int n = std::atoi(env);
      if (n >= 1) return n;
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
  }());
  return pool;
}

void ThreadPool::drain(uint32_t generation, int thread) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(s >> 32) != generation) return;
    const int64_t task = static_cast<int64_t>(s & 0xFFFFFFFFu);
    if (task >= tasks_) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // s now holds the current state
    }
    call_(ctx_, task, thread);
    done_.fetch_add(1, std::memory_order_acq_rel);
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::run_impl(int64_t tasks, void* ctx, Trampoline call) {
  if (tasks <= 0) return;
  FP4MOE_CHECK(tasks < (int64_t{1} << 32));
  if (workers_.empty() || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) call(ctx, t, 0);
    return;
  }
  ctx_ = ctx;
  call_ = call;
  tasks_ = tasks;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  // The release store publishes ctx_, call_ and tasks_ to any thread that sees this generation.
  state_.store(uint64_t{generation} << 32, std::memory_order_release);
  {
    // Under the mutex, so a worker between its check and its sleep cannot miss the wake-up.
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    generation_.store(generation, std::memory_order_release);
  }
  wake_.notify_all();
  drain(generation, 0);
  while (done_.load(std::memory_order_acquire) != tasks) cpu_relax();
  // Close the job before the next run rewrites ctx_, call_ and tasks_: a worker still holding
  // this generation's state (it read "next = tasks" and was descheduled) must fail its CAS, not
  // compare a stale index with the next job's task count and run a task of a dead job.
  state_.store((uint64_t{generation} << 32) | 0xFFFFFFFFu, std::memory_order_release);
}

void ThreadPool::worker_loop(int thread, uint32_t seen) {
  for (;;) {
    uint32_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; i < kSpinIterations && now == seen; ++i) {
      cpu_relax();
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == seen) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      continue;
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    drain(now, thread);
  }
}

}  // namespace fp4moe
