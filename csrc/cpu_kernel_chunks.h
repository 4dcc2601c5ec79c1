// How numba_kernel's CPU handler splits a call's index range into chunks,
// and what a wrapper's status means: pure functions, unit-tested alone
// (tests/cpp/cpu_kernel_chunks_test.cc).
//
// A call covers range(total): the launch range (launch_dims), times the
// slices of a vmapped batch. With parallel='xla' the range is cut into
// chunks that XLA's intra-op pool threads and the calling thread take in
// turn; the generated wrapper runs the kernel over [begin, end).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace numbax {

// How many chunks to cut range(total) into for a pool of `threads`: a few
// per thread, so that a thread that starts late (a parked pool thread wakes
// tens of microseconds after it is scheduled) or a pool busy with other ops
// leaves its share to the others; never more chunks than indices, never
// fewer than one. 8 per thread measured a little faster than 4, 2 or 1 on 2
// and 16 cores (benchmarks/results/pool-h100-2026-12-06).
inline uint64_t ChunkCount(uint64_t total, int64_t threads) {
  if (total == 0) return 0;
  const uint64_t workers = static_cast<uint64_t>(std::max<int64_t>(threads, 1));
  return std::min<uint64_t>(total, workers * 8);
}

// How many tasks to schedule on a pool of `threads` for `chunks` chunks.
// XLA runs the op itself on one of the pool's threads, so `threads - 1`
// others can help: one task more waits in the queue until the op is done
// (it finds nothing left), or, where the caller is not a pool thread, puts
// one thread more than cores to work (measured: 10-30% slower on 2 and 16
// cores). None for a pool of one thread, or for one chunk.
inline uint64_t HelperCount(int64_t threads, uint64_t chunks) {
  if (threads <= 1 || chunks <= 1) return 0;
  return std::min<uint64_t>(static_cast<uint64_t>(threads - 1), chunks - 1);
}

// [begin, end) of chunk `i` of `chunks` over range(total): consecutive,
// covering the range exactly once, sizes differing by at most one.
struct ChunkBounds {
  uint64_t begin;
  uint64_t end;
};
inline ChunkBounds Chunk(uint64_t total, uint64_t chunks, uint64_t i) {
  const uint64_t base = total / chunks, extra = total % chunks;
  const uint64_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

// The statuses a generated wrapper returns (cpu_kernel/wrapper.py).
enum class WrapperStatus : int32_t { kOk = 0, kRaised = 1 };

// What failed, for the error XLA raises, when no diagnostic re-run could
// say more: `status` as the wrapper returned it.
inline std::string StatusText(int32_t status) {
  if (status == static_cast<int32_t>(WrapperStatus::kRaised)) {
    return "the kernel raised an exception";
  }
  return "the kernel's wrapper returned the unknown status " +
         std::to_string(status);
}

}  // namespace numbax
