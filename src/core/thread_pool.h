// A persistent thread pool for the kernels and the MoE layer: workers are created once and wait
// for work, so a parallel region costs a wake-up, not a thread creation, and allocates nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace fp4moe {

class ThreadPool {
 public:
  // `threads` counts the calling thread: ThreadPool(2) starts one worker.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process-wide pool: FP4MOE_THREADS if set (>= 1), else the hardware concurrency.
  static ThreadPool& global();

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task, thread) for every task in [0, tasks), tasks handed out dynamically to the
  // caller and the workers (thread is 0 for the caller, 1.. for workers, < size()); returns when
  // all are done. Within a job a thread index never runs two tasks at once, so it can key
  // per-thread scratch of that job.
  //
  // Thread-safe: several threads may call run() on one pool at once (a binding that releases the
  // GIL around ThreadPool::global() does); their jobs are serialized by a lock taken once per
  // job, never per task, so each waits for the one in flight. Jobs of 0 or 1 task, and every job
  // on a pool of one thread, run inline on the caller and take no lock.
  // Not reentrant: fn must not call run() on the same pool, from the caller's tasks or a
  // worker's; that aborts (it would deadlock on the lock). run() on another pool is fine.
  template <class Fn>
  void run(int64_t tasks, Fn&& fn) {
    run_impl(tasks, &fn,
             [](void* ctx, int64_t task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); });
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t task, int thread);
  void run_impl(int64_t tasks, void* ctx, Trampoline call);
  void worker_loop(int thread, uint32_t seen);
  void drain(uint32_t generation, int thread);

  std::vector<std::thread> workers_;
  // Serializes submitters (see run()); held for a whole pooled job.
  std::mutex run_mutex_;
  // The job in flight. Plain members, yet race-free: a worker reads them only after its CAS on
  // state_ claimed a task (see drain() for the proof), and written only by the submitter before
  // it publishes the job.
  void* ctx_ = nullptr;
  Trampoline call_ = nullptr;
  int64_t tasks_ = 0;
  // (generation << 32) | tasks not yet claimed. A worker claims a task with a CAS that also
  // checks the generation, so a worker that wakes late cannot claim a task of a newer job; and
  // the caller waits for tasks done, not for workers, so a descheduled worker that claimed
  // nothing (a busy 2-core machine) never delays a job.
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<uint32_t> generation_{0};  // bumped to publish a job
  // Idle workers sleep on this condition variable (after spinning). A mutex-guarded check, not
  // std::atomic::wait: GCC 12's libstdc++ atomic wait can miss a notify (seen as a hang here).
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<bool> stop_{false};
};

}  // namespace fp4moe
