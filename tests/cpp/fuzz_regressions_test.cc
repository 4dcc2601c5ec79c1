// What fuzzing (scripts/fuzz.sh, tests/fuzz/) found, kept as unit tests.
// The inputs themselves are replayed by scripts/fuzz.sh from
// tests/fuzz/regressions/.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "call_frame.h"
#include "kernel_args.h"

namespace {

namespace ffi = ::xla::ffi;
using numbax::AddBatchChunk;
using numbax::AddBatchSlice;
using numbax::BufferView;
using numbax::DecodeBuffer;
using numbax::KernelArgs;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

void* FakeDevicePtr(uintptr_t i) {
  return reinterpret_cast<void*>(uintptr_t{0xdead0000} + i * 0x1000);
}

ffi::Error Decode(ffi::DataType dtype, const std::vector<int64_t>& dims,
                  BufferView* view) {
  return DecodeBuffer(dtype, FakeDevicePtr(1), dims.data(),
                      static_cast<int64_t>(dims.size()), "input 0", view);
}

// kernel_args_fuzz, tests/fuzz/regressions/kernel_args_fuzz/
// int32-0xINT64_MAX-stride-overflow: a zero extent made the buffer empty,
// so the decoder accepted extents whose product overflows, and packing its
// byte strides for a kernel overflowed int64 (undefined behaviour).
TEST(FuzzRegression, EmptyBufferWithOverflowingExtentsIsRejected) {
  const std::vector<std::vector<int64_t>> shapes = {
      {0, kInt64Max},
      {0, int64_t{1} << 40, int64_t{1} << 40},
      {int64_t{1} << 40, 0, int64_t{1} << 40},
      {int64_t{1} << 62, 3, 0},
  };
  for (const auto& dims : shapes) {
    BufferView view;
    ffi::Error err = Decode(ffi::DataType::S32, dims, &view);
    ASSERT_TRUE(err.failure()) << dims.size();
    EXPECT_NE(err.message().find("input 0: byte size overflows"),
              std::string::npos)
        << err.message();
  }
}

TEST(FuzzRegression, EmptyBufferWithLargeButValidExtentsPacksExactly) {
  // 2^20 * 2^20 * 4 bytes fits: the empty buffer is accepted and every
  // stride is exact.
  const std::vector<int64_t> dims = {int64_t{1} << 20, 0, int64_t{1} << 20};
  BufferView view;
  ASSERT_TRUE(Decode(ffi::DataType::F32, dims, &view).success());
  EXPECT_EQ(view.element_count, 0);
  EXPECT_EQ(view.nbytes, 0u);
  EXPECT_EQ(view.data, nullptr);
  KernelArgs args;
  args.AddArray(view.data, view.dims, view.rank, 4);
  const std::vector<int64_t> expected = {0, 0, 0, 4, 0, int64_t{1} << 20, 0,
                                         int64_t{1} << 20,
                                         // strides: 0 * 2^20 * 4, 2^20 * 4, 4
                                         0, int64_t{1} << 22, 4};
  EXPECT_EQ(args.words(), expected);
}

TEST(FuzzRegression, LargestValidExtentProductIsAccepted) {
  const std::vector<int64_t> dims = {0, kInt64Max / 4};
  BufferView view;
  ASSERT_TRUE(Decode(ffi::DataType::F32, dims, &view).success());
  KernelArgs args;
  args.AddArray(view.data, view.dims, view.rank, 4);
  EXPECT_EQ(args.words()[7], (kInt64Max / 4) * 4);  // stride of axis 0
}

// Slicing for vmapped launches moved from the kernel handler into
// AddBatchSlice so that fuzzing reaches it; the handler read dims[0] of
// any buffer, with no check of its rank or extent.
// (A view points at its dims, as at XLA's call frame: they must outlive it.)
TEST(AddBatchSlice, RefusesBuffersThatCannotBeSliced) {
  const std::vector<int64_t> scalar_dims, three_dims = {3, 5},
                                          none_dims = {0, 5};
  KernelArgs args;
  BufferView scalar;
  ASSERT_TRUE(Decode(ffi::DataType::F32, scalar_dims, &scalar).success());
  EXPECT_FALSE(AddBatchSlice(scalar, 1, 0, false, &args));
  EXPECT_FALSE(AddBatchSlice(scalar, 1, 0, true, &args));

  BufferView three;
  ASSERT_TRUE(Decode(ffi::DataType::F32, three_dims, &three).success());
  EXPECT_FALSE(AddBatchSlice(three, 4, 3, false, &args));  // too few slices
  EXPECT_FALSE(AddBatchSlice(three, 2, 0, false, &args));  // not the batch
  EXPECT_FALSE(AddBatchSlice(three, 3, 3, false, &args));  // index past it
  EXPECT_FALSE(AddBatchSlice(three, 3, -1, false, &args));
  EXPECT_FALSE(AddBatchSlice(three, 0, 0, false, &args));

  BufferView none;
  ASSERT_TRUE(Decode(ffi::DataType::F32, none_dims, &none).success());
  EXPECT_FALSE(AddBatchSlice(none, 2, 0, true, &args));  // nothing to reuse
  EXPECT_EQ(args.size(), 0u);
}

TEST(AddBatchSlice, SlicesAndBroadcasts) {
  const std::vector<int64_t> dims = {3, 5}, one_dims = {1, 5};
  BufferView view;
  ASSERT_TRUE(Decode(ffi::DataType::F64, dims, &view).success());
  const int64_t base =
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(FakeDevicePtr(1)));
  for (int64_t s = 0; s < 3; ++s) {
    KernelArgs args;
    ASSERT_TRUE(AddBatchSlice(view, 3, s, false, &args));
    EXPECT_EQ(args.words(),
              (std::vector<int64_t>{0, 0, 5, 8, base + s * 40, 5, 8}));
  }
  BufferView one;
  ASSERT_TRUE(Decode(ffi::DataType::F64, one_dims, &one).success());
  KernelArgs args;
  ASSERT_TRUE(AddBatchSlice(one, 7, 6, true, &args));  // slice 0, reused
  EXPECT_EQ(args.words(), (std::vector<int64_t>{0, 0, 5, 8, base, 5, 8}));
}

// A folded vmap launch passes consecutive slices as one array that keeps
// the batch axis: [start, start + count) at the start slice's address.
TEST(AddBatchChunk, ChunksKeepTheBatchAxis) {
  const std::vector<int64_t> dims = {7, 5}, one_dims = {1, 5};
  BufferView view;
  ASSERT_TRUE(Decode(ffi::DataType::F64, dims, &view).success());
  const int64_t base =
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(FakeDevicePtr(1)));
  KernelArgs args;
  ASSERT_TRUE(AddBatchChunk(view, 7, 0, 7, false, &args));
  EXPECT_EQ(args.words(),
            (std::vector<int64_t>{0, 0, 35, 8, base, 7, 5, 40, 8}));
  args.Reset();
  ASSERT_TRUE(AddBatchChunk(view, 7, 3, 4, false, &args));
  EXPECT_EQ(args.words(),
            (std::vector<int64_t>{0, 0, 20, 8, base + 3 * 40, 4, 5, 40, 8}));
  // A broadcast input: slice 0 with a batch axis of 1, for every chunk.
  BufferView one;
  ASSERT_TRUE(Decode(ffi::DataType::F64, one_dims, &one).success());
  args.Reset();
  ASSERT_TRUE(AddBatchChunk(one, 7, 3, 4, true, &args));
  EXPECT_EQ(args.words(),
            (std::vector<int64_t>{0, 0, 5, 8, base, 1, 5, 40, 8}));
}

TEST(AddBatchChunk, RefusesChunksOutsideTheBuffer) {
  const std::vector<int64_t> scalar_dims, dims = {3, 5}, none_dims = {0, 5};
  KernelArgs args;
  BufferView scalar, three, none;
  ASSERT_TRUE(Decode(ffi::DataType::F32, scalar_dims, &scalar).success());
  ASSERT_TRUE(Decode(ffi::DataType::F32, dims, &three).success());
  ASSERT_TRUE(Decode(ffi::DataType::F32, none_dims, &none).success());
  EXPECT_FALSE(AddBatchChunk(scalar, 1, 0, 1, false, &args));
  EXPECT_FALSE(AddBatchChunk(three, 3, 2, 2, false, &args));  // past the end
  EXPECT_FALSE(AddBatchChunk(three, 3, -1, 2, false, &args));
  EXPECT_FALSE(AddBatchChunk(three, 3, 0, 0, false, &args));  // no slice
  EXPECT_FALSE(AddBatchChunk(three, 4, 0, 4, false, &args));  // not the batch
  EXPECT_FALSE(AddBatchChunk(three, 3, kInt64Max, 2, false, &args));
  EXPECT_FALSE(AddBatchChunk(none, 2, 0, 2, true, &args));  // nothing to reuse
  EXPECT_EQ(args.size(), 0u);
}

}  // namespace
