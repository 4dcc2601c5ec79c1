// Experiment only (not part of numbax): ways to spread y = 2x + 1 over
// XLA's intra-op pool, with knobs as attributes.
#include <immintrin.h>
#include <sched.h>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <chrono>
static int64_t Now() { return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

static void Part(const float* x, float* y, uint64_t b, uint64_t e) {
  for (uint64_t i = b; i < e; ++i) y[i] = 2.0f * x[i] + 1.0f;
}

struct Job {
  const float* x; float* y; uint64_t n, count;
  std::atomic<uint64_t> next{0}, done{0};
  std::atomic<int64_t> left{0};       // tasks still to schedule (tree)
  std::atomic<int64_t> scheduling{0}; // Schedule calls in flight (tree)
  std::mutex mu; std::condition_variable cv;
  ffi::ThreadPool* pool = nullptr;
  int64_t wait_mode = 0, fanout = 0;
  int64_t t0 = 0; std::atomic<int> started{0}; int64_t starts[64] = {}; std::atomic<int64_t> last_end{0};
  void Mark() { int k = started.fetch_add(1); if (k < 64) starts[k] = Now() - t0; }
  void Work() {
    for (;;) {
      uint64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) return;
      uint64_t base = n / count, extra = n % count;
      uint64_t b = i * base + std::min(i, extra);
      Part(x, y, b, b + base + (i < extra ? 1 : 0));
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == count &&
          wait_mode == 0) {
        std::lock_guard<std::mutex> l(mu);
        cv.notify_all();
      }
    }
  }
  void Spawn(const std::shared_ptr<Job>& self, int k) {
    // schedule up to k more tasks, each spawning more itself (tree)
    for (int j = 0; j < k; ++j) {
      scheduling.fetch_add(1);
      if (left.fetch_sub(1) <= 0) {
        left.fetch_add(1);
        scheduling.fetch_sub(1);
        return;
      }
      pool->Schedule([self] { self->Mark(); self->Spawn(self, 2); self->Work(); });
      scheduling.fetch_sub(1);
    }
  }
};

static ffi::Error ParImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                      ffi::ResultBuffer<ffi::F32> y, int64_t* stats, int64_t cpw,
                      int64_t helpers, int64_t fanout, int64_t wait_mode) {
  const uint64_t n = x.element_count();
  const int64_t threads = pool.num_threads();
  int64_t h = helpers >= 0 ? helpers : std::max<int64_t>(0, threads + 1 + helpers);
  // helpers == -1 -> threads, -2 -> threads - 1
  h = std::min<int64_t>(h, threads);
  auto job = std::make_shared<Job>();
  job->t0 = Now();
  job->x = x.typed_data(); job->y = y->typed_data(); job->n = n;
  job->count = std::max<uint64_t>(1, std::min<uint64_t>(n, (h + 1) * cpw));
  job->pool = &pool; job->wait_mode = wait_mode; job->fanout = fanout;
  h = std::min<int64_t>(h, job->count - 1);
  if (fanout == 0) {
    for (int64_t t = 0; t < h; ++t) pool.Schedule([job] { job->Mark(); job->Work(); });
  } else {
    job->left = h;
    job->Spawn(job, 2);
  }
  const int64_t sched_end = Now() - job->t0;
  job->Work();
  const int64_t caller_end = Now() - job->t0;
  if (wait_mode == 0) {
    std::unique_lock<std::mutex> l(job->mu);
    job->cv.wait(l, [&] { return job->done.load() == job->count; });
  } else {
    for (uint64_t spins = 0; job->done.load(std::memory_order_acquire) != job->count; ++spins) {
      if (spins < 200000) _mm_pause(); else sched_yield();
    }
  }
  // tree: no Schedule may still be running against this call's pool
  job->left.store(-(1 << 30));
  while (job->scheduling.load() != 0) _mm_pause();
  if (stats) {
    const int64_t total = Now() - job->t0;
    const int k = std::min(job->started.load(), 60);
    stats[0] = sched_end; stats[1] = caller_end; stats[2] = total; stats[3] = k;
    for (int i = 0; i < k; ++i) stats[4 + i] = job->starts[i];
  }
  return ffi::Error::Success();
}
static ffi::Error Par(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                      ffi::ResultBuffer<ffi::F32> y, int64_t cpw,
                      int64_t helpers, int64_t fanout, int64_t wait_mode) {
  return ParImpl(pool, x, y, nullptr, cpw, helpers, fanout, wait_mode);
}
static ffi::Error ParStats(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                      ffi::ResultBuffer<ffi::F32> y, ffi::ResultBuffer<ffi::S64> st, int64_t cpw,
                      int64_t helpers, int64_t fanout, int64_t wait_mode) {
  return ParImpl(pool, x, y, st->typed_data(), cpw, helpers, fanout, wait_mode);
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PoolExpStats, ParStats,
    ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::S64>>().Attr<int64_t>("cpw").Attr<int64_t>("helpers")
        .Attr<int64_t>("fanout").Attr<int64_t>("wait_mode"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PoolExp, Par,
    ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::F32>>().Attr<int64_t>("cpw").Attr<int64_t>("helpers")
        .Attr<int64_t>("fanout").Attr<int64_t>("wait_mode"));

static ffi::Error Threads(ffi::ThreadPool pool, ffi::ResultBuffer<ffi::S32> out) {
  out->typed_data()[0] = static_cast<int32_t>(pool.num_threads());
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(PoolThreads, Threads,
    ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Ret<ffi::Buffer<ffi::S32>>());
