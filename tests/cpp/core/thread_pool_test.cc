// The thread pool under stress: thousands of short jobs of seeded random sizes on pools of 2 to 8
// threads, several threads submitting to one pool at once, pools destroyed right after a job.
// Every job checks what the pool promises; the ThreadSanitizer build (preset "tsan") runs these.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fp4moe {
namespace {

// Job counts: ~1 s in the release build, a few seconds under TSan on 2 cores. Pool lifetimes
// cost a thread start and join each (several ms under TSan), hence fewer there.
constexpr int kJobsPerPool = 20000;
constexpr int kJobsPerSubmitter = 5000;
#if defined(__SANITIZE_THREAD__)
constexpr int kPoolLifetimes = 400;
#else
constexpr int kPoolLifetimes = 1000;
#endif

constexpr int kMaxTasks = 48;  // "tens of tasks": a decode step's tile or expert count
constexpr int kMaxThreads = 8;

// A job size: a quarter of jobs take 0-3 tasks (0 and 1 run inline, 2 and 3 barely wake the
// workers), the rest up to kMaxTasks.
int64_t random_tasks(std::mt19937& rng) {
  if (rng() % 4 == 0) return std::uniform_int_distribution<int>(0, 3)(rng);
  return std::uniform_int_distribution<int>(0, kMaxTasks)(rng);
}

constexpr int kSubmitters = 4;

// What the submitters to one pool share: how many tasks of each submitter's job are running.
// Jobs that use the workers are serialized, so while one runs a task no other submitter's job
// may (jobs of 0 or 1 task run inline on their caller and may overlap anything).
struct PoolActivity {
  std::array<std::atomic<int>, kSubmitters> running{};
};

// Counts per task index for the jobs of one submitting thread.
class JobChecker {
 public:
  explicit JobChecker(int submitter = 0) : submitter_(submitter) {}

  // Runs one job and checks it: every index in [0, tasks) ran exactly once and no other did
  // (a task of an earlier job run late would show here as an extra count), thread indices are
  // in [0, size()), index 0 is the calling thread, no thread index ran two tasks at once, and no
  // other submitter's pooled job ran at the same time.
  testing::AssertionResult run(ThreadPool& pool, int64_t tasks, PoolActivity& activity) {
    const std::thread::id caller = std::this_thread::get_id();
    const int size = pool.size();
    const bool pooled = tasks >= 2 && size >= 2;
    pool.run(tasks, [&](int64_t t, int thread) {
      const bool slot = thread >= 0 && thread < size && thread < kMaxThreads;
      if (!slot) bad_thread_.fetch_add(1);
      if (slot && busy_[thread].exchange(true)) shared_thread_.fetch_add(1);
      if (thread == 0 && std::this_thread::get_id() != caller) not_caller_.fetch_add(1);
      if (pooled) {
        activity.running[submitter_].fetch_add(1);
        for (int other = 0; other < kSubmitters; ++other) {
          if (other != submitter_ && activity.running[other].load() != 0) overlap_.fetch_add(1);
        }
      }
      if (t >= 0 && t < kMaxTasks) {
        hits_[t].fetch_add(1, std::memory_order_relaxed);
      } else {
        out_of_range_.fetch_add(1);
      }
      if (pooled) activity.running[submitter_].fetch_sub(1);
      if (slot) busy_[thread].store(false);
    });
    std::string failures;
    for (int t = 0; t < kMaxTasks; ++t) {
      const int hits = hits_[t].exchange(0, std::memory_order_relaxed);
      const int expected = t < tasks ? 1 : 0;
      if (hits != expected) {
        failures += " task " + std::to_string(t) + " ran " + std::to_string(hits) + "x;";
      }
    }
    note(failures, out_of_range_, "task index out of range");
    note(failures, bad_thread_, "thread index out of [0, size)");
    note(failures, not_caller_, "thread index 0 not on the calling thread");
    note(failures, shared_thread_, "one thread index ran two tasks at once");
    note(failures, overlap_, "ran alongside another submitter's job");
    if (failures.empty()) return testing::AssertionSuccess();
    return testing::AssertionFailure()
           << "job of " << tasks << " tasks on a pool of " << size << ":" << failures;
  }

 private:
  static void note(std::string& failures, std::atomic<int>& count, const char* what) {
    if (const int n = count.exchange(0))
      failures += " " + std::string(what) + " x" + std::to_string(n) + ";";
  }

  const int submitter_;
  std::array<std::atomic<int>, kMaxTasks> hits_{};
  std::array<std::atomic<bool>, kMaxThreads> busy_{};
  std::atomic<int> out_of_range_{0}, bad_thread_{0}, not_caller_{0}, shared_thread_{0}, overlap_{0};
};

uint32_t announce_seed(uint32_t seed) {
  std::printf("seed %u\n", seed);
  return seed;
}

TEST(ThreadPool, EveryTaskRunsExactlyOnceAcrossManyJobs) {
  for (int threads : {2, 3, 4, 8}) {
    const uint32_t seed = announce_seed(0x7001u + static_cast<uint32_t>(threads));
    SCOPED_TRACE("seed " + std::to_string(seed) + ", pool of " + std::to_string(threads));
    std::mt19937 rng(seed);
    ThreadPool pool(threads);
    ASSERT_EQ(pool.size(), threads);
    PoolActivity activity;
    JobChecker checker;
    for (int job = 0; job < kJobsPerPool; ++job) {
      ASSERT_TRUE(checker.run(pool, random_tasks(rng), activity)) << "job " << job;
    }
  }
}

TEST(ThreadPool, OneThreadRunsEverythingOnTheCaller) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  PoolActivity activity;
  JobChecker checker;
  for (int64_t tasks = 0; tasks <= kMaxTasks; ++tasks) {
    ASSERT_TRUE(checker.run(pool, tasks, activity));
  }
}

// run() is safe from several threads at once (a binding that releases the GIL can call
// ThreadPool::global() from many): each job runs completely, and jobs that use the workers one
// at a time.
TEST(ThreadPool, ConcurrentSubmittersShareOnePool) {
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    PoolActivity activity;
    std::array<std::string, kSubmitters> failure;
    std::vector<std::thread> submitters;
    for (int s = 0; s < kSubmitters; ++s) {
      const uint32_t seed = announce_seed(0x5B00u + static_cast<uint32_t>(16 * threads + s));
      submitters.emplace_back([&, s, seed] {
        std::mt19937 rng(seed);
        JobChecker checker(s);
        for (int job = 0; job < kJobsPerSubmitter; ++job) {
          const testing::AssertionResult ok = checker.run(pool, random_tasks(rng), activity);
          if (!ok) {
            failure[s] = "seed " + std::to_string(seed) + " job " + std::to_string(job) + ": " +
                         ok.message();
            return;
          }
        }
      });
    }
    for (std::thread& t : submitters) t.join();
    for (int s = 0; s < kSubmitters; ++s) {
      EXPECT_EQ(failure[s], "") << "submitter " << s << " on a pool of " << threads;
    }
  }
}

// The destructor races the workers still returning from the last job (and, with no job, the
// workers still starting): it must neither hang nor let a worker touch the freed pool.
TEST(ThreadPool, DestroyedRightAfterAJob) {
  const uint32_t seed = announce_seed(0xDE57u);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  PoolActivity activity;
  JobChecker checker;
  for (int life = 0; life < kPoolLifetimes; ++life) {
    const int threads = 2 + life % 7;
    ThreadPool pool(threads);
    if (life % 5 == 4) continue;  // destroyed before any job
    ASSERT_TRUE(checker.run(pool, random_tasks(rng), activity)) << "lifetime " << life;
  }
}

// A pool whose fn calls run() on another pool: allowed (only the same pool is forbidden).
TEST(ThreadPool, RunOnAnotherPoolFromInsideATask) {
  ThreadPool outer(3), inner(2);
  std::array<std::atomic<int>, 6 * 5> hits{};
  outer.run(6, [&](int64_t t, int) {
    inner.run(5, [&](int64_t u, int) { hits[5 * t + u].fetch_add(1); });
  });
  for (int i = 0; i < 6 * 5; ++i) EXPECT_EQ(hits[i].load(), 1) << "task " << i;
}

// Reentrance would deadlock on the pool's submit lock or corrupt the job in flight: it aborts
// instead, from the caller's tasks and the workers' alike. (Death tests fork, which TSan does
// not support in a process with threads; the release and ASan builds run these.)
TEST(ThreadPoolDeathTest, NestedRunOnTheSamePoolAborts) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "death tests fork; not under ThreadSanitizer";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        ThreadPool pool(1);
        pool.run(1, [&](int64_t, int) { pool.run(0, [](int64_t, int) {}); });
      },
      "fp4moe invariant failed");
  // From a worker: the caller's first task holds the caller until a worker has started one, so
  // a worker surely nests.
  EXPECT_DEATH(
      {
        ThreadPool pool(2);
        std::atomic<bool> worker_started{false};
        pool.run(2, [&](int64_t, int thread) {
          if (thread == 0) {
            while (!worker_started.load()) std::this_thread::yield();
            return;
          }
          worker_started.store(true);
          pool.run(2, [](int64_t, int) {});
        });
      },
      "fp4moe invariant failed");
#endif
}

}  // namespace
}  // namespace fp4moe
