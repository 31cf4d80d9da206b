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

// The pool whose task this thread is running, if any (a worker: always its own pool). run() on
// that same pool would deadlock on run_mutex_, so it aborts instead.
thread_local const ThreadPool* t_running_in = nullptr;

// Marks this thread as running tasks of `pool` for a scope, restoring the outer pool after (fn
// may run a job of another pool).
class RunningIn {
 public:
  explicit RunningIn(const ThreadPool* pool) : outer_(t_running_in) {
    FP4MOE_CHECK(outer_ != pool);  // run() called from inside a task of the same pool
    t_running_in = pool;
  }
  ~RunningIn() { t_running_in = outer_; }
  RunningIn(const RunningIn&) = delete;
  RunningIn& operator=(const RunningIn&) = delete;

 private:
  const ThreadPool* outer_;
};
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

// Why the plain members ctx_, call_ and tasks_ are race-free, and why a worker with a stale
// state (it loaded it, then was descheduled while the job finished and the next began) is
// harmless:
// - Within one generation g the count of unclaimed tasks only falls, so each state (g, n) is
//   written once; an atomic read-modify-write reads the value just before its own write in
//   state_'s modification order, so at most one CAS succeeds from (g, n), claiming task
//   tasks_ - n. A stale CAS from (g, n) fails once that claim happened (no later state equals
//   (g, n): counts only fall and later jobs have later generations, until the 32-bit generation
//   wraps after 2^32 jobs), and a worker never CASes from (g, 0).
// - Nothing but a generation number and a count is read before the CAS. After a successful one,
//   the worker reads the job: that CAS read (g, n), the caller's release store of (g, tasks) or a
//   CAS after it (one release sequence), so the caller's writes of the job happen before. And
//   the claimed task is not yet done, so the caller cannot return and rewrite the job until
//   done_ counts it: the worker's reads are sequenced before its release increment of done_,
//   which the caller's acquire load of done_ == tasks reads (through the later increments, all
//   read-modify-writes). The next submitter, on this thread or another after run_mutex_, comes
//   later still.
void ThreadPool::drain(uint32_t generation, int thread) {
  uint64_t s = state_.load(std::memory_order_relaxed);
  for (;;) {
    if (static_cast<uint32_t>(s >> 32) != generation) return;
    const int64_t left = static_cast<int64_t>(s & 0xFFFFFFFFu);
    if (left == 0) return;
    if (!state_.compare_exchange_weak(s, s - 1, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
      continue;  // s now holds the current state
    }
    // Tasks are handed out in increasing order: the task claimed is tasks_ - left.
    call_(ctx_, tasks_ - left, thread);
    done_.fetch_add(1, std::memory_order_release);
    s = state_.load(std::memory_order_relaxed);
  }
}

void ThreadPool::run_impl(int64_t tasks, void* ctx, Trampoline call) {
  const RunningIn running(this);
  if (tasks <= 0) return;
  FP4MOE_CHECK(tasks < (int64_t{1} << 32));
  if (workers_.empty() || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) call(ctx, t, 0);
    return;
  }
  // One job at a time: a second submitter would overwrite the job in flight. Taken once per job;
  // the tasks themselves are claimed lock-free.
  std::lock_guard<std::mutex> submit(run_mutex_);
  ctx_ = ctx;
  call_ = call;
  tasks_ = tasks;
  // Every increment of the previous job is in: its caller saw done_ == its tasks.
  done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  // The release store publishes ctx_, call_, tasks_ and done_ = 0 to every worker whose CAS
  // claims a task of this generation.
  state_.store((uint64_t{generation} << 32) | static_cast<uint64_t>(tasks),
               std::memory_order_release);
  {
    // Under the mutex, so a worker between its check and its sleep cannot miss the wake-up.
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    generation_.store(generation, std::memory_order_release);
  }
  wake_.notify_all();
  drain(generation, 0);
  // Acquire: the tasks' writes (and the workers' last reads of the job) happen before return.
  while (done_.load(std::memory_order_acquire) != tasks) cpu_relax();
}

void ThreadPool::worker_loop(int thread, uint32_t seen) {
  const RunningIn running(this);
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
