// Tests for a re-bound graph's updates (csrc/graph_rebind.*) against a fake
// driver table, so they need no GPU: which graphs may be adopted, that a
// node the driver refused to update is updated on the next call, and that
// the graph is destroyed by the driver that made it.
#include "graph_rebind.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "launch_log.h"

namespace {

namespace cuda = numbax::cuda;
using numbax::AddressPatch;
using numbax::ArrayAbi;
using numbax::BufferView;
using numbax::LaunchLog;
using numbax::Rebinding;

const unsigned kGrid[3] = {4, 1, 1};
const unsigned kBlock[3] = {128, 1, 1};
const auto kFunction = reinterpret_cast<cuda::CUfunction>(0xf00);
const auto kGraph = reinterpret_cast<cuda::CUgraph>(0x9a);
const auto kExec = reinterpret_cast<cuda::CUgraphExec>(0xe1);
constexpr size_t kWords = 8;
constexpr cuda::CUresult kOutOfMemory = 2;

// What the fake driver was asked to do.
struct FakeGraphs {
  size_t nodes = 1;                        // nodes the recorded graph holds
  int failing_sets = 0;                    // the next N node updates fail
  std::vector<std::vector<int64_t>> sets;  // each update's words, in order
  int execs_destroyed = 0;
  int graphs_destroyed = 0;
};
FakeGraphs fake;

cuda::CUresult GetNodes(cuda::CUgraph, cuda::CUgraphNode*, size_t* count) {
  *count = fake.nodes;
  return cuda::CUDA_SUCCESS;
}

cuda::CUresult GetParams(cuda::CUgraphNode, cuda::KernelNodeParams* p) {
  *p = cuda::KernelNodeParams{};
  p->func = kFunction;
  for (int i = 0; i < 3; ++i) {
    p->grid[i] = kGrid[i];
    p->block[i] = kBlock[i];
  }
  return cuda::CUDA_SUCCESS;
}

cuda::CUresult Instantiate(cuda::CUgraphExec* exec, cuda::CUgraph,
                           unsigned long long) {
  *exec = kExec;
  return cuda::CUDA_SUCCESS;
}

cuda::CUresult SetParams(cuda::CUgraphExec, cuda::CUgraphNode,
                         const cuda::KernelNodeParams* p) {
  std::vector<int64_t> words(kWords);
  for (size_t w = 0; w < kWords; ++w) {
    words[w] = *static_cast<const int64_t*>(p->kernel_params[w]);
  }
  fake.sets.push_back(words);
  if (fake.failing_sets > 0) {
    --fake.failing_sets;
    return kOutOfMemory;
  }
  return cuda::CUDA_SUCCESS;
}

cuda::CUresult DestroyExec(cuda::CUgraphExec) {
  ++fake.execs_destroyed;
  return cuda::CUDA_SUCCESS;
}

cuda::CUresult DestroyGraph(cuda::CUgraph) {
  ++fake.graphs_destroyed;
  return cuda::CUDA_SUCCESS;
}

cuda::Driver FakeDriver() {
  cuda::Driver d{};
  d.cuGraphGetNodes = GetNodes;
  d.cuGraphKernelNodeGetParams = GetParams;
  d.cuGraphInstantiateWithFlags = Instantiate;
  d.cuGraphExecKernelNodeSetParams = SetParams;
  d.cuGraphExecDestroy = DestroyExec;
  d.cuGraphDestroy = DestroyGraph;
  return d;
}

std::vector<BufferView> Buffer(uintptr_t address) {
  std::vector<BufferView> out(1);
  out[0].data = reinterpret_cast<void*>(address);
  out[0].nbytes = 0x100;
  return out;
}

// A recording of one launch taking buffer 0 as a Numba array (its data
// pointer at word 4) and the scalar 7.
LaunchLog Recording(const std::vector<BufferView>& buffers) {
  LaunchLog log;
  log.Begin(nullptr, nullptr, buffers);
  const auto data =
      static_cast<int64_t>(reinterpret_cast<intptr_t>(buffers[0].data));
  std::vector<int64_t> words = {0, 0, 64, 4, data, 64, 4, 7};
  std::vector<AddressPatch> patches;
  numbax::AddArrayPatches(ArrayAbi::kNumba, 0, 0, buffers[0].data, buffers,
                          &patches);
  log.AfterLaunch(kFunction, false, kGrid, kBlock, 0, false, words, patches);
  return log;
}

// A Rebinding whose buffer 0 is confirmed to move, holding the graph of
// its second recording (at 0x5000).
void Confirm(Rebinding* r, const cuda::Driver& driver) {
  ASSERT_TRUE(r->Learn(Recording(Buffer(0x1000))));
  ASSERT_TRUE(r->Learn(Recording(Buffer(0x5000))));
  ASSERT_EQ(r->AdoptGraph(driver, kGraph), "");
  ASSERT_TRUE(r->BoundTo(Buffer(0x5000)));
}

class RebindingGraph : public ::testing::Test {
 protected:
  void SetUp() override { fake = FakeGraphs{}; }
};

TEST_F(RebindingGraph, UpdatesOnlyNodesWhoseBuffersMoved) {
  const cuda::Driver driver = FakeDriver();
  Rebinding r(0);
  Confirm(&r, driver);
  EXPECT_EQ(r.Rebind(driver, Buffer(0x5000)), cuda::CUDA_SUCCESS);
  EXPECT_TRUE(fake.sets.empty());
  EXPECT_EQ(r.Rebind(driver, Buffer(0x7000)), cuda::CUDA_SUCCESS);
  ASSERT_EQ(fake.sets.size(), 1u);
  EXPECT_EQ(fake.sets[0][4], 0x7000);
  EXPECT_EQ(fake.sets[0][7], 7);
}

// The driver refused an update, so the node's parameters are unknown. The
// same buffers on the next call must be set again, never taken as done:
// the node would launch on the previous call's (maybe freed) buffers.
TEST_F(RebindingGraph, NodeTheDriverRefusedIsSetAgain) {
  const cuda::Driver driver = FakeDriver();
  Rebinding r(0);
  Confirm(&r, driver);
  fake.failing_sets = 1;
  EXPECT_EQ(r.Rebind(driver, Buffer(0x7000)), kOutOfMemory);
  EXPECT_FALSE(r.BoundTo(Buffer(0x7000)));
  EXPECT_FALSE(r.BoundTo(Buffer(0x5000)));
  EXPECT_EQ(r.Rebind(driver, Buffer(0x7000)), cuda::CUDA_SUCCESS);
  ASSERT_EQ(fake.sets.size(), 2u);
  EXPECT_EQ(fake.sets[1][4], 0x7000);
  EXPECT_TRUE(r.BoundTo(Buffer(0x7000)));
  // In sync again: a repeat needs no update.
  EXPECT_EQ(r.Rebind(driver, Buffer(0x7000)), cuda::CUDA_SUCCESS);
  EXPECT_EQ(fake.sets.size(), 2u);
}

// A node the log never saw (another thread launching onto the recording
// stream while func ran) would keep its recorded addresses on every
// re-bind: such a graph is not adopted, and stays the caller's.
TEST_F(RebindingGraph, GraphWithUnloggedWorkIsNotAdopted) {
  const cuda::Driver driver = FakeDriver();
  Rebinding r(0);
  ASSERT_TRUE(r.Learn(Recording(Buffer(0x1000))));
  fake.nodes = 2;
  const std::string why = r.AdoptGraph(driver, kGraph);
  EXPECT_NE(why.find("holds 2 nodes but func launched 1"), std::string::npos)
      << why;
  EXPECT_FALSE(r.has_graph());
  EXPECT_EQ(fake.graphs_destroyed, 0);
}

TEST_F(RebindingGraph, DriverWithoutNodeListingAdoptsNothing) {
  cuda::Driver driver = FakeDriver();
  driver.cuGraphGetNodes = nullptr;
  Rebinding r(0);
  ASSERT_TRUE(r.Learn(Recording(Buffer(0x1000))));
  EXPECT_NE(r.AdoptGraph(driver, kGraph), "");
  EXPECT_FALSE(r.has_graph());
}

// The graph and its executable graph are destroyed once, by the driver
// that made them.
TEST_F(RebindingGraph, DestroyedByItsOwnDriver) {
  const cuda::Driver driver = FakeDriver();
  {
    Rebinding r(0);
    Confirm(&r, driver);
  }
  EXPECT_EQ(fake.execs_destroyed, 1);
  EXPECT_EQ(fake.graphs_destroyed, 1);
}

}  // namespace
