// numba_kernel's parallel='xla' runner (csrc/cpu_pool.h) over a plain
// thread pool: every index once, statuses, pools that run tasks late or
// never, and helpers that stay to take the next call's chunks.
#include "cpu_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace numbax {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// `n` worker threads taking tasks in order, as XLA's pool does.
class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  template <typename F>
  void Schedule(F&& f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.emplace_back(std::forward<F>(f));
      ++scheduled_;
    }
    cv_.notify_one();
  }
  int scheduled() {
    std::lock_guard<std::mutex> lock(mu_);
    return scheduled_;
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int scheduled_ = 0;
  bool stop_ = false;
};

// A pool that keeps its tasks until asked: they run after the call returned.
struct LatePool {
  std::vector<std::function<void()>> tasks;
  template <typename F>
  void Schedule(F&& f) {
    tasks.emplace_back(std::forward<F>(f));
  }
};

// Counts visits per index; fails a chunk that contains `fail_at`.
struct Visits {
  std::vector<std::atomic<int>> count;
  uint64_t fail_at = UINT64_MAX;
  std::mutex mu;
  std::set<std::thread::id> threads;
  explicit Visits(uint64_t n) : count(n) {}
  static int32_t Part(const void* ctx, uint64_t begin, uint64_t end) {
    auto* v = const_cast<Visits*>(static_cast<const Visits*>(ctx));
    {
      std::lock_guard<std::mutex> lock(v->mu);
      v->threads.insert(std::this_thread::get_id());
    }
    for (uint64_t i = begin; i < end; ++i) v->count[i]++;
    return begin <= v->fail_at && v->fail_at < end ? 7 : 0;
  }
  void ExpectEachOnce() {
    for (uint64_t i = 0; i < count.size(); ++i) {
      ASSERT_EQ(count[i].load(), 1) << "index " << i;
    }
  }
};

TEST(CpuPool, EveryIndexOnceOnPoolsOfEverySize) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    CallBoard board;
    for (uint64_t total : {1ull, 5ull, 64ull, 1000ull, 100003ull}) {
      Visits v(total);
      EXPECT_EQ(RunInChunks(pool, threads, total, Visits::Part, &v, board,
                            microseconds(0)),
                0);
      v.ExpectEachOnce();
    }
  }
}

TEST(CpuPool, AChunksStatusIsTheCallsStatus) {
  ThreadPool pool(4);
  CallBoard board;
  Visits v(10000);
  v.fail_at = 6543;
  EXPECT_EQ(
      RunInChunks(pool, 4, 10000, Visits::Part, &v, board, microseconds(0)), 7);
  v.ExpectEachOnce();  // the other chunks still ran
}

TEST(CpuPool, SchedulesThePoolsOtherThreadsOnly) {
  // The caller is one of the pool's threads: 7 more for a pool of 8.
  ThreadPool pool(8);
  CallBoard board;
  Visits v(100000);
  RunInChunks(pool, 8, 100000, Visits::Part, &v, board, microseconds(0));
  EXPECT_EQ(pool.scheduled(), 7);
  // A one-thread pool: the caller alone, nothing scheduled.
  ThreadPool one(1);
  Visits w(1000);
  RunInChunks(one, 1, 1000, Visits::Part, &w, board, microseconds(0));
  EXPECT_EQ(one.scheduled(), 0);
  w.ExpectEachOnce();
}

TEST(CpuPool, APoolThatRunsNothingInTimeLeavesTheCallerAllChunks) {
  // The tasks run only after the call returned (a pool busy with other
  // work): the caller took every chunk, and the late tasks find none.
  LatePool pool;
  CallBoard board;
  auto v = std::make_unique<Visits>(5000);
  EXPECT_EQ(
      RunInChunks(pool, 4, 5000, Visits::Part, v.get(), board, microseconds(0)),
      0);
  v->ExpectEachOnce();
  EXPECT_EQ(v->threads.size(), 1u);
  ASSERT_EQ(pool.tasks.size(), 3u);
  v.reset();  // the caller's frame is gone, as in XLA
  for (auto& task : pool.tasks) task();
}

TEST(CpuPool, HelpersStayToTakeTheNextCallsChunks) {
  // The first call's helpers watch the board for a while (long here, so
  // that a slow machine cannot miss it); the second call, on a pool that
  // would run nothing in time, is helped by them, and schedules tasks only
  // for the helpers still lacking.
  CallBoard board;  // outlives the pool, whose helpers watch it
  ThreadPool pool(4);
  Visits first(40000);
  RunInChunks(pool, 4, 40000, Visits::Part, &first, board, milliseconds(500));
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(400);
  while (board.watching() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(board.watching(), 3);
  LatePool late;
  Visits second(1 << 22);
  EXPECT_EQ(RunInChunks(late, 4, 1 << 22, Visits::Part, &second, board,
                        milliseconds(500)),
            0);
  second.ExpectEachOnce();
  EXPECT_GT(second.threads.size(), 1u);  // not the caller alone
  EXPECT_LT(late.tasks.size(), 3u);      // watching helpers were counted
}

TEST(CpuPool, AThreadTakesItsSeatsGroupFirstThenTheRest) {
  // 12 chunks of 120 indices in 4 groups of 3: seat 6 takes group 2 (chunks
  // 6-8), then 3, 0 and 1; the same seat gets the same part on every call.
  std::vector<uint64_t> begins;
  struct Order {
    std::vector<uint64_t>* begins;
    static int32_t Part(const void* ctx, uint64_t begin, uint64_t) {
      static_cast<const Order*>(ctx)->begins->push_back(begin);
      return 0;
    }
  } order{&begins};
  ChunkedCall call(Order::Part, &order, 120, 12, 4);
  call.Work(6);
  EXPECT_EQ(begins, (std::vector<uint64_t>{60, 70, 80, 90, 100, 110, 0, 10, 20,
                                           30, 40, 50}));
  EXPECT_TRUE(call.Finished());
  EXPECT_FALSE(call.HasChunks());
  // Fewer chunks than workers: one group per chunk.
  ChunkedCall few(Order::Part, &order, 3, 3, 8);
  EXPECT_EQ(few.groups, 3u);
}

TEST(CpuPool, AThreadKeepsItsSeat) {
  const uint32_t mine = ThreadSeat();
  EXPECT_EQ(ThreadSeat(), mine);
  uint32_t other = mine;
  std::thread([&] { other = ThreadSeat(); }).join();
  EXPECT_NE(other, mine);
}

TEST(CpuPool, SpinComesFromTheEnvironmentWithADefault) {
  // Read once per process: the default here (the test runs without it).
  EXPECT_EQ(PoolSpin(), microseconds(100));
}

}  // namespace
}  // namespace numbax
