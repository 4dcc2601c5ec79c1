// Tests for the graph cache's bookkeeping (csrc/graph_cache.*) that needs
// no GPU: which calls may record a graph of a per-slice kernel batch.
#include "graph_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using numbax::BufferView;
using numbax::GraphCache;

std::vector<BufferView> Buffers(std::vector<uintptr_t> addresses) {
  std::vector<BufferView> out(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    out[i].data = reinterpret_cast<void*>(addresses[i]);
  }
  return out;
}

// A graph is recorded only when the same buffers come back: the first
// call with new addresses never records, the second does, and a call site
// whose buffers move every call never records at all.
TEST(GraphCache, RepeatsLastMissPerDevice) {
  GraphCache cache;
  const auto a = Buffers({0x1000, 0x2000});
  const auto b = Buffers({0x1000, 0x3000});
  EXPECT_FALSE(cache.RepeatsLastMiss(0, a));
  EXPECT_TRUE(cache.RepeatsLastMiss(0, a));
  EXPECT_FALSE(cache.RepeatsLastMiss(0, b));  // moved: remembered anew
  EXPECT_FALSE(cache.RepeatsLastMiss(0, a));
  EXPECT_FALSE(cache.RepeatsLastMiss(0, b));
  EXPECT_TRUE(cache.RepeatsLastMiss(0, b));
  // Devices are remembered apart.
  EXPECT_FALSE(cache.RepeatsLastMiss(1, b));
  EXPECT_TRUE(cache.RepeatsLastMiss(1, b));
  EXPECT_TRUE(cache.RepeatsLastMiss(0, b));
  // A different number of buffers is never a repeat.
  EXPECT_FALSE(cache.RepeatsLastMiss(0, Buffers({0x1000})));
}

TEST(GraphCache, LaunchesNothingItWasNotGiven) {
  GraphCache cache;
  const numbax::cuda::Driver no_driver{};  // a launch would crash
  numbax::cuda::CUresult result = 0;
  EXPECT_FALSE(
      cache.LaunchFound(no_driver, 0, Buffers({0x1000}), nullptr, &result));
}

// A call site whose func read device memory on the host while recorded
// stays plain: clear_caches() drops graphs, not what func was seen to do.
TEST(GraphCache, PlainOnceMarkedEvenAfterClear) {
  numbax::GraphCache cache;
  EXPECT_FALSE(cache.Plain());
  cache.MarkPlain();
  EXPECT_TRUE(cache.Plain());
  cache.Clear();
  EXPECT_TRUE(cache.Plain());
}

}  // namespace
