// Tests for the launch log and the re-bind decisions (csrc/launch_log.*,
// csrc/graph_rebind.*) that need no GPU: which packed words are addresses,
// which recordings may be re-bound, and which must never be.
#include "launch_log.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "graph_rebind.h"

namespace {

using numbax::AddressPatch;
using numbax::ArrayAbi;
using numbax::BufferView;
using numbax::LaunchLog;
using numbax::Rebinding;

std::vector<BufferView> Buffers(std::vector<uintptr_t> addresses,
                                size_t nbytes = 0x100) {
  std::vector<BufferView> out(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    out[i].data = reinterpret_cast<void*>(addresses[i]);
    out[i].nbytes = nbytes;
  }
  return out;
}

void* At(uintptr_t a) { return reinterpret_cast<void*>(a); }

const unsigned kGrid[3] = {4, 1, 1};
const unsigned kBlock[3] = {128, 1, 1};
const auto kFunction = reinterpret_cast<numbax::cuda::CUfunction>(0xf00);

// One launch of a kernel taking buffer 0 as a Numba array at word 0 (its
// data pointer at word 4) and an int scalar after it.
void LogOneLaunch(LaunchLog* log, const std::vector<BufferView>& buffers,
                  int64_t scalar, int64_t offset = 0) {
  const auto data =
      static_cast<int64_t>(reinterpret_cast<intptr_t>(buffers[0].data)) +
      offset;
  std::vector<int64_t> words = {0, 0, 64, 4, data, 64, 4, scalar};
  std::vector<AddressPatch> patches;
  numbax::AddArrayPatches(ArrayAbi::kNumba, 0, offset ? -1 : 0,
                          At(static_cast<uintptr_t>(data)), buffers, &patches);
  log->AfterLaunch(kFunction, false, kGrid, kBlock, 0, false, words, patches);
}

TEST(AddArrayPatches, NumbaDataWordAndMemrefPointers) {
  const auto buffers = Buffers({0x1000, 0x2000});
  std::vector<AddressPatch> patches;
  numbax::AddArrayPatches(ArrayAbi::kNumba, 10, 1, At(0x2000), buffers,
                          &patches);
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0].word, 14u);
  EXPECT_EQ(patches[0].slot, 1);
  EXPECT_EQ(patches[0].offset, 0);
  patches.clear();
  // A view at an odd offset into buffer 0: found by its address.
  numbax::AddArrayPatches(ArrayAbi::kMemref, 3, -2, At(0x1000 + 12), buffers,
                          &patches);
  ASSERT_EQ(patches.size(), 2u);
  EXPECT_EQ(patches[0].word, 3u);
  EXPECT_EQ(patches[1].word, 4u);
  EXPECT_EQ(patches[0].slot, 0);
  EXPECT_EQ(patches[0].offset, 12);
}

TEST(AddArrayPatches, ViewInTwoBuffersIsAmbiguous) {
  // An input aliased in place: two slots, one buffer.
  const auto buffers = Buffers({0x1000, 0x1000});
  std::vector<AddressPatch> patches;
  numbax::AddArrayPatches(ArrayAbi::kNumba, 0, -2, At(0x1008), buffers,
                          &patches);
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0].slot, numbax::kAmbiguousSlot);
  LaunchLog log;
  log.Begin(nullptr, nullptr, buffers);
  std::vector<int64_t> words = {0, 0, 1, 4, 0x1008, 1, 4};
  log.AfterLaunch(kFunction, false, kGrid, kBlock, 0, false, words, patches);
  EXPECT_FALSE(log.mapped());
}

TEST(LaunchLog, AddressAsScalarUnmaps) {
  const auto buffers = Buffers({0x1000, 0x2000});
  LaunchLog log;
  log.Begin(nullptr, nullptr, buffers);
  LogOneLaunch(&log, buffers, 7);
  EXPECT_TRUE(log.mapped()) << log.why();
  // An int that points into buffer 1 (device_ctypes_pointer.value).
  LogOneLaunch(&log, buffers, 0x2010);
  EXPECT_FALSE(log.mapped());
  EXPECT_NE(log.why().find("address"), std::string::npos);
}

TEST(LaunchLog, CooperativeAndUnmapKeepFirstReason) {
  const auto buffers = Buffers({0x1000});
  LaunchLog log;
  log.Begin(nullptr, nullptr, buffers);
  log.AfterLaunch(kFunction, false, kGrid, kBlock, 0, /*cooperative=*/true, {},
                  {});
  EXPECT_FALSE(log.mapped());
  const std::string first = log.why();
  log.Unmap("later");
  EXPECT_EQ(log.why(), first);
}

TEST(SameWork, AddressesApartOnly) {
  const auto a = Buffers({0x1000, 0x2000});
  const auto b = Buffers({0x5000, 0x2000});
  LaunchLog x, y, z, w;
  x.Begin(nullptr, nullptr, a);
  LogOneLaunch(&x, a, 7);
  y.Begin(nullptr, nullptr, b);
  LogOneLaunch(&y, b, 7);
  std::string why;
  EXPECT_TRUE(numbax::SameWork(x, y, &why)) << why;
  // Another scalar at the new addresses.
  z.Begin(nullptr, nullptr, b);
  LogOneLaunch(&z, b, 8);
  EXPECT_FALSE(numbax::SameWork(x, z, &why));
  EXPECT_NE(why.find("scalar"), std::string::npos);
  // Another launch count.
  w.Begin(nullptr, nullptr, b);
  LogOneLaunch(&w, b, 7);
  LogOneLaunch(&w, b, 7);
  EXPECT_FALSE(numbax::SameWork(x, w, &why));
}

TEST(BindWords, PatchesEveryAddressWithItsOffset) {
  const auto a = Buffers({0x1000, 0x2000});
  LaunchLog log;
  log.Begin(nullptr, nullptr, a);
  LogOneLaunch(&log, a, 7, /*offset=*/24);
  ASSERT_TRUE(log.mapped()) << log.why();
  std::vector<int64_t> words;
  numbax::BindWords(log.launches()[0], Buffers({0x9000, 0x2000}), &words);
  EXPECT_EQ(words[4], 0x9000 + 24);
  EXPECT_EQ(words[7], 7);
  EXPECT_EQ(words[2], 64);
}

// A buffer may be re-bound only once a second recording, made with it
// elsewhere, launched the same work.
TEST(Rebinding, OnlyConfirmedBuffersMove) {
  Rebinding r(0);
  const auto a = Buffers({0x1000, 0x2000});
  const auto b = Buffers({0x5000, 0x2000});
  const auto c = Buffers({0x7000, 0x2000});
  const auto d = Buffers({0x7000, 0x6000});
  EXPECT_FALSE(r.MayRebind(a));
  LaunchLog first;
  first.Begin(nullptr, nullptr, a);
  LogOneLaunch(&first, a, 7);
  ASSERT_TRUE(r.Learn(std::move(first)));
  EXPECT_TRUE(r.MayRebind(a));   // its own addresses
  EXPECT_FALSE(r.MayRebind(b));  // buffer 0 moved, unconfirmed
  LaunchLog second;
  second.Begin(nullptr, nullptr, b);
  LogOneLaunch(&second, b, 7);
  ASSERT_TRUE(r.Learn(std::move(second)));
  EXPECT_TRUE(r.MayRebind(c));   // buffer 0 confirmed
  EXPECT_FALSE(r.MayRebind(d));  // buffer 1 never moved yet
  EXPECT_FALSE(r.refused());
}

TEST(Rebinding, DifferentWorkRefusesForGood) {
  Rebinding r(0);
  const auto a = Buffers({0x1000});
  const auto b = Buffers({0x5000});
  LaunchLog first, second, third;
  first.Begin(nullptr, nullptr, a);
  LogOneLaunch(&first, a, 7);
  ASSERT_TRUE(r.Learn(std::move(first)));
  // A scalar that followed the address.
  second.Begin(nullptr, nullptr, b);
  LogOneLaunch(&second, b, 9);
  EXPECT_FALSE(r.Learn(std::move(second)));
  EXPECT_TRUE(r.refused());
  EXPECT_FALSE(r.MayRebind(a));
  third.Begin(nullptr, nullptr, b);
  LogOneLaunch(&third, b, 7);
  EXPECT_FALSE(r.Learn(std::move(third)));
}

TEST(Rebinding, UnmappedLogRefuses) {
  Rebinding r(0);
  const auto a = Buffers({0x1000});
  LaunchLog log;
  log.Begin(nullptr, nullptr, a);
  log.Unmap("a launch went through Numba's own launch");
  EXPECT_FALSE(r.Learn(std::move(log)));
  EXPECT_TRUE(r.refused());
  EXPECT_NE(r.why().find("Numba"), std::string::npos);
}

TEST(LaunchLog, ShiftPatchesMovesASlicesPatchesToTheWholeBuffer) {
  // A sequential vmap: func ran on slice 2 of buffer 0 (16-byte slices at
  // 0x1020) and on buffer 1 whole; its launch was patched against the
  // slice views and moves to the whole buffers.
  const auto whole = Buffers({0x1000, 0x2000});
  auto slice = Buffers({0x1020, 0x2000}, 0x10);
  LaunchLog log;
  log.Begin(nullptr, nullptr, whole);
  LogOneLaunch(&log, whole, 1);  // slice 0's launch: nothing to move
  const size_t first = log.launches().size();
  std::vector<AddressPatch> patches;
  numbax::AddArrayPatches(ArrayAbi::kNumba, 0, 0, At(0x1024), slice, &patches);
  numbax::AddArrayPatches(ArrayAbi::kNumba, 5, 1, At(0x2000), slice, &patches);
  std::vector<int64_t> words = {0, 0, 4, 4, 0x1024, 0, 0, 0, 0, 0x2000};
  log.AfterLaunch(kFunction, false, kGrid, kBlock, 0, false, words, patches);
  log.ShiftPatches(first, {0x20, 0});
  log.End();
  ASSERT_TRUE(log.mapped()) << log.why();
  ASSERT_EQ(log.launches().size(), 2u);
  EXPECT_EQ(log.launches()[0].patches[0].offset, 0);  // before `first`
  const auto& moved = log.launches()[1].patches;
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_EQ(moved[0].slot, 0);
  EXPECT_EQ(moved[0].offset, 0x24);  // 4 bytes into slice 2
  EXPECT_EQ(moved[1].slot, 1);
  EXPECT_EQ(moved[1].offset, 0);
  // Re-bound to buffers at new addresses, the word lands in slice 2 there.
  std::vector<int64_t> bound;
  numbax::BindWords(log.launches()[1], Buffers({0x5000, 0x6000}), &bound);
  EXPECT_EQ(bound[4], 0x5024);
  EXPECT_EQ(bound[9], 0x6000);
}

// A capture-mode func's device-to-host copy is noted only while a watch
// (a recording) is active on this thread, and only on that watch.
TEST(HostReadWatch, NotesCopiesOnlyWhileWatching) {
  EXPECT_FALSE(numbax::HostReadWatch::Note());  // no recording: a no-op
  {
    numbax::HostReadWatch outer;
    EXPECT_FALSE(outer.seen());
    {
      numbax::HostReadWatch inner;
      EXPECT_TRUE(numbax::HostReadWatch::Note());
      EXPECT_TRUE(inner.seen());
    }
    EXPECT_FALSE(outer.seen());  // the inner scope's copy was its own
    EXPECT_TRUE(numbax::HostReadWatch::Note());
    EXPECT_TRUE(outer.seen());
  }
  EXPECT_FALSE(numbax::HostReadWatch::Note());  // the watch ended
}

TEST(HostReadWatch, OtherThreadsAreNotWatched) {
  numbax::HostReadWatch watch;
  bool noted = true;
  std::thread other([&] { noted = numbax::HostReadWatch::Note(); });
  other.join();
  EXPECT_FALSE(noted);
  EXPECT_FALSE(watch.seen());
}

}  // namespace
