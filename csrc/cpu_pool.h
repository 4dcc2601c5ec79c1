// numba_kernel's parallel='xla': one call's range run in chunks on XLA's
// intra-op thread pool, the calling thread taking chunks too.
//
// XLA's pool threads park when idle, and a parked thread starts tens of
// microseconds after it is scheduled (on the 16-core H100 host: 25 us for
// the median of 15, 42 us for the last;
// benchmarks/results/pool-h100-2026-12-06), while OpenMP's threads, which
// Numba's prange uses, spin between parallel regions and start at once.
// So a helper that finished its call's chunks keeps watching a board of
// the calls in flight for a while (PoolSpin(), NUMBAX_CPU_POOL_SPIN_US) and
// takes chunks of the next call posted there; a call schedules tasks only
// for the helpers it lacks. The watch is bounded: the pool's own work waits
// at most that long for such a thread.
//
// A template over the pool (XLA's ffi::ThreadPool in the handler, a plain
// thread pool in tests/cpp/cpu_pool_test.cc), header-only so both share it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu_kernel_chunks.h"

namespace numbax {

// One pause of a spin-wait: tells the core (and a hyperthread sibling) that
// this thread is only waiting.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

// What a chunk runs: the wrapper over [begin, end); its status (0: ok).
using PartFn = int32_t (*)(const void* ctx, uint64_t begin, uint64_t end);

// A thread's seat: a small number, the same on every call. A thread takes
// the chunks of its seat's group first, so that call after call it runs
// the same part of the range and finds that part's data in its core's
// cache, as OpenMP's static schedule (prange's) does; then it takes what
// is left of the other groups, so a thread that starts late costs nothing.
inline uint32_t ThreadSeat() {
  static std::atomic<uint32_t> next{0};
  thread_local const uint32_t seat =
      next.fetch_add(1, std::memory_order_relaxed);
  return seat;
}

// Consecutive chunks [next, end) of a call, on a cache line of their own.
struct alignas(64) ChunkGroup {
  std::atomic<uint64_t> next{0};
  uint64_t end = 0;
};

// One call's range, cut into chunks in `groups` groups of consecutive
// chunks (one per worker). Shared by the caller and every thread that may
// take a chunk: a thread that comes after the last chunk was taken (the
// caller may have returned by then) finds none and touches nothing else
// (`ctx` is the caller's, valid only while chunks are left).
struct ChunkedCall {
  ChunkedCall(PartFn part_fn, const void* part_ctx, uint64_t range,
              uint64_t chunks, uint64_t workers)
      : part(part_fn),
        ctx(part_ctx),
        total(range),
        count(chunks),
        groups(std::max<uint64_t>(1, std::min(workers, chunks))),
        group(new ChunkGroup[groups]) {
    for (uint64_t g = 0; g < groups; ++g) {
      group[g].next.store(g * count / groups, std::memory_order_relaxed);
      group[g].end = (g + 1) * count / groups;
    }
  }

  const PartFn part;
  const void* const ctx;
  const uint64_t total, count, groups;
  const std::unique_ptr<ChunkGroup[]> group;
  std::atomic<uint64_t> done{0};
  std::atomic<int32_t> status{0};
  std::mutex mu;
  std::condition_variable all_done;

  bool HasChunks() const {
    for (uint64_t g = 0; g < groups; ++g) {
      if (group[g].next.load(std::memory_order_relaxed) < group[g].end) {
        return true;
      }
    }
    return false;
  }
  bool Finished() const {
    return done.load(std::memory_order_acquire) == count;
  }

  // Runs chunks until none is left: the seat's group first, then the
  // groups after it in turn.
  void Work(uint32_t seat) {
    for (uint64_t k = 0; k < groups; ++k) {
      ChunkGroup& g = group[(seat + k) % groups];
      for (;;) {
        const uint64_t i = g.next.fetch_add(1, std::memory_order_relaxed);
        if (i >= g.end) break;
        Run(i);
      }
    }
  }

  void Run(uint64_t i) {
    const ChunkBounds b = Chunk(total, count, i);
    if (int32_t s = part(ctx, b.begin, b.end)) {
      int32_t ok = 0;
      status.compare_exchange_strong(ok, s);
    }
    if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == count) {
      std::lock_guard<std::mutex> lock(mu);
      all_done.notify_all();
    }
  }

  // Waits for the chunks other threads took. They are running (a chunk is
  // taken only by a thread that runs it), so the wait is short: spin first,
  // since a blocked caller wakes late after the notify (a 1M-element op on
  // 16 cores took 102 us blocking, 83 us spinning); then block, so that a
  // thread the OS preempted mid-chunk costs no core.
  void Await() {
    constexpr auto kSpin = std::chrono::microseconds(100);
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (uint32_t i = 1; !Finished(); ++i) {
      CpuRelax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) {
        std::unique_lock<std::mutex> lock(mu);
        all_done.wait(lock, [this] { return Finished(); });
        return;
      }
    }
  }
};

// The calls in flight, and how many helpers are watching for new ones.
class CallBoard {
 public:
  void Post(const std::shared_ptr<ChunkedCall>& call) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(call);
    posted_.fetch_add(1, std::memory_order_release);
  }
  void Remove(const ChunkedCall* call) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(std::remove_if(calls_.begin(), calls_.end(),
                                [&](const std::shared_ptr<ChunkedCall>& c) {
                                  return c.get() == call;
                                }),
                 calls_.end());
  }
  // A call with chunks left, or null.
  std::shared_ptr<ChunkedCall> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : calls_) {
      if (c->HasChunks()) return c;
    }
    return nullptr;
  }
  uint64_t posted() const { return posted_.load(std::memory_order_acquire); }
  int64_t watching() const { return watching_.load(std::memory_order_acquire); }

  // Takes chunks of calls posted from now on, for up to `spin` after the
  // last chunk it ran.
  void Watch(std::chrono::microseconds spin) {
    if (spin.count() <= 0) return;
    uint64_t seen = posted();
    watching_.fetch_add(1, std::memory_order_acq_rel);
    auto until = std::chrono::steady_clock::now() + spin;
    for (uint32_t i = 1;; ++i) {
      const uint64_t now_posted = posted();
      if (now_posted != seen) {
        seen = now_posted;
        while (auto call = Take()) {
          watching_.fetch_sub(1, std::memory_order_acq_rel);
          call->Work(ThreadSeat());
          watching_.fetch_add(1, std::memory_order_acq_rel);
          until = std::chrono::steady_clock::now() + spin;
        }
      }
      CpuRelax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) break;
    }
    watching_.fetch_sub(1, std::memory_order_acq_rel);
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<ChunkedCall>> calls_;
  std::atomic<uint64_t> posted_{0};
  std::atomic<int64_t> watching_{0};
};

// The process's board. Never destroyed: pool threads may still be watching
// it while the process exits.
inline CallBoard& Board() {
  static CallBoard* board = new CallBoard;
  return *board;
}

// How long a helper watches for the next call: NUMBAX_CPU_POOL_SPIN_US
// microseconds (0: return to the pool at once), default 100; read once.
inline std::chrono::microseconds PoolSpin() {
  static const std::chrono::microseconds spin = [] {
    const char* env = std::getenv("NUMBAX_CPU_POOL_SPIN_US");
    if (env == nullptr || *env == '\0') return std::chrono::microseconds(100);
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end == env || *end != '\0' || v < 0) {
      return std::chrono::microseconds(100);
    }
    return std::chrono::microseconds(std::min<long long>(v, 1000000));
  }();
  return spin;
}

// range(total) in chunks: on the calling thread, on helpers already
// watching `board`, and on tasks scheduled on `pool` (`threads` threads,
// the caller presumably one of them) for the helpers lacking. A busy or
// one-thread pool delays the call, never deadlocks it: the caller takes
// chunks until none is left. Returns the first nonzero status of a chunk.
template <typename Pool>
int32_t RunInChunks(Pool& pool, int64_t threads, uint64_t total, PartFn part,
                    const void* ctx, CallBoard& board,
                    std::chrono::microseconds spin) {
  const uint64_t count = ChunkCount(total, threads);
  const uint64_t helpers = HelperCount(threads, count);
  if (helpers == 0) return part(ctx, 0, total);
  auto call =
      std::make_shared<ChunkedCall>(part, ctx, total, count, helpers + 1);
  board.Post(call);
  const uint64_t ready =
      static_cast<uint64_t>(std::max<int64_t>(board.watching(), 0));
  const std::thread::id caller = std::this_thread::get_id();
  for (uint64_t t = std::min(ready, helpers); t < helpers; ++t) {
    pool.Schedule([call, &board, spin, caller] {
      call->Work(ThreadSeat());
      // XLA runs a task it could not schedule on the caller: no watch there.
      if (std::this_thread::get_id() != caller) board.Watch(spin);
    });
  }
  call->Work(ThreadSeat());
  call->Await();
  board.Remove(call.get());
  return call->status.load();
}

}  // namespace numbax
