// numba_kernel's chunking of a call's range over XLA's intra-op pool, and
// the text of a wrapper's status (csrc/cpu_kernel_chunks.h).
#include "cpu_kernel_chunks.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace numbax {
namespace {

TEST(CpuKernelChunks, CountIsAFewPerThreadNeverMoreThanTheRange) {
  EXPECT_EQ(ChunkCount(0, 8), 0u);
  EXPECT_EQ(ChunkCount(1, 8), 1u);
  EXPECT_EQ(ChunkCount(3, 8), 3u);
  EXPECT_EQ(ChunkCount(1000, 2), 16u);  // 2 pool threads x 8
  EXPECT_EQ(ChunkCount(1000, 16), 128u);
  // No pool (0 threads, or an error read as -1): the caller alone.
  EXPECT_EQ(ChunkCount(1000, 0), 8u);
  EXPECT_EQ(ChunkCount(1000, -1), 8u);
}

TEST(CpuKernelChunks, HelpersAreThePoolsOtherThreads) {
  // The op runs on one pool thread: the others help, never one more.
  EXPECT_EQ(HelperCount(16, 128), 15u);
  EXPECT_EQ(HelperCount(2, 16), 1u);
  // Never more helpers than chunks left after the caller's first.
  EXPECT_EQ(HelperCount(16, 3), 2u);
  // A one-thread pool, no pool, or one chunk: the caller alone.
  EXPECT_EQ(HelperCount(1, 8), 0u);
  EXPECT_EQ(HelperCount(0, 8), 0u);
  EXPECT_EQ(HelperCount(-1, 8), 0u);
  EXPECT_EQ(HelperCount(16, 1), 0u);
  EXPECT_EQ(HelperCount(16, 0), 0u);
}

TEST(CpuKernelChunks, ChunksCoverTheRangeExactlyOnceInOrder) {
  for (uint64_t total : {1ull, 2ull, 7ull, 64ull, 1000ull, 100003ull}) {
    for (int64_t threads : {0, 1, 3, 15, 127}) {
      const uint64_t n = ChunkCount(total, threads);
      ASSERT_GE(n, 1u);
      uint64_t next = 0, smallest = total, largest = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const ChunkBounds b = Chunk(total, n, i);
        EXPECT_EQ(b.begin, next) << total << " " << n << " " << i;
        EXPECT_GT(b.end, b.begin);
        smallest = std::min(smallest, b.end - b.begin);
        largest = std::max(largest, b.end - b.begin);
        next = b.end;
      }
      EXPECT_EQ(next, total);
      EXPECT_LE(largest - smallest, 1u);
    }
  }
}

TEST(CpuKernelChunks, HugeRangesDoNotOverflow) {
  const uint64_t total = (uint64_t{1} << 62) + 12345;
  const uint64_t n = ChunkCount(total, 31);
  const ChunkBounds last = Chunk(total, n, n - 1);
  EXPECT_EQ(last.end, total);
}

TEST(CpuKernelChunks, StatusTextSaysWhatFailed) {
  EXPECT_EQ(StatusText(1), "the kernel raised an exception");
  EXPECT_EQ(StatusText(7),
            "the kernel's wrapper returned the unknown status 7");
}

}  // namespace
}  // namespace numbax
