// Tests for packing array parameters as MLIR memrefs, the ABI of kernels
// compiled by numba-cuda-mlir (csrc/kernel_args.*, ArrayAbi::kMemref). MLIR's
// LLVM lowering expands a ranked memref into allocated pointer, aligned
// pointer, offset, sizes[rank] and strides[rank], offset and strides in
// elements. A kernel given Numba's layout instead reads the itemsize as a
// pointer, so each layout is written out word by word.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "call_frame.h"
#include "kernel_args.h"

namespace {

namespace ffi = ::xla::ffi;
using numbax::AddBatchChunk;
using numbax::AddBatchSlice;
using numbax::ArrayAbi;
using numbax::ArrayWords;
using numbax::BufferView;
using numbax::DecodeBuffer;
using numbax::KernelArgs;
using Words = std::vector<int64_t>;

void* Addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
int64_t Word(uintptr_t a) { return static_cast<int64_t>(a); }

void AddMemref(KernelArgs& args, uintptr_t data,
               const std::vector<int64_t>& shape, size_t itemsize) {
  args.AddArray(Addr(data), shape.data(), static_cast<int64_t>(shape.size()),
                itemsize);
}

TEST(MemrefArgs, Rank1) {
  KernelArgs args;
  args.Reset(ArrayAbi::kMemref);
  AddMemref(args, 0x7f0000001000, {7}, 4);
  // allocated, aligned, offset, size, stride (elements: 1, not 4 bytes)
  EXPECT_EQ(args.words(),
            (Words{Word(0x7f0000001000), Word(0x7f0000001000), 0, 7, 1}));
}

TEST(MemrefArgs, Rank2And3StridesInElements) {
  KernelArgs args;
  args.Reset(ArrayAbi::kMemref);
  AddMemref(args, 0x1000, {3, 5}, 8);
  EXPECT_EQ(args.words(), (Words{0x1000, 0x1000, 0, 3, 5, 5, 1}));
  args.Reset(ArrayAbi::kMemref);
  AddMemref(args, 0x2000, {2, 3, 4}, 2);
  EXPECT_EQ(args.words(), (Words{0x2000, 0x2000, 0, 2, 3, 4, 12, 4, 1}));
}

TEST(MemrefArgs, Rank0IsPointersAndOffsetOnly) {
  KernelArgs args;
  args.Reset(ArrayAbi::kMemref);
  args.AddArray(Addr(0x3000), nullptr, 0, 4);
  EXPECT_EQ(args.words(), (Words{0x3000, 0x3000, 0}));
}

TEST(MemrefArgs, WordCountIsThreePlusTwicePerRank) {
  for (int64_t rank = 0; rank <= 4; ++rank) {
    std::vector<int64_t> shape(static_cast<size_t>(rank), 2);
    for (ArrayAbi abi : {ArrayAbi::kNumba, ArrayAbi::kMemref}) {
      KernelArgs args;
      args.Reset(abi);
      args.AddArray(Addr(0x10), shape.data(), rank, 4);
      EXPECT_EQ(static_cast<int64_t>(args.size()), ArrayWords(abi, rank))
          << "rank " << rank;
    }
  }
  EXPECT_EQ(ArrayWords(ArrayAbi::kMemref, 2), 7);
  EXPECT_EQ(ArrayWords(ArrayAbi::kNumba, 2), 9);
}

TEST(MemrefArgs, StridedViewStridesBecomeElements) {
  KernelArgs args;
  args.Reset(ArrayAbi::kMemref);
  const int64_t dims[] = {4, 3}, byte_strides[] = {4, 16};  // a transpose
  args.AddStridedArray(Addr(0x5000), dims, byte_strides, 2, 4);
  EXPECT_EQ(args.words(), (Words{0x5000, 0x5000, 0, 4, 3, 1, 4}));
}

TEST(MemrefArgs, ResetChoosesTheAbiPerList) {
  KernelArgs args;
  args.Reset(ArrayAbi::kMemref);
  AddMemref(args, 0x1000, {2}, 4);
  EXPECT_EQ(args.abi(), ArrayAbi::kMemref);
  args.Reset();  // Numba's, as every list before numba-cuda-mlir
  EXPECT_EQ(args.abi(), ArrayAbi::kNumba);
  AddMemref(args, 0x1000, {2}, 4);
  EXPECT_EQ(args.words(), (Words{0, 0, 2, 4, 0x1000, 2, 4}));
}

TEST(MemrefArgs, SeveralArraysAndScalars) {
  KernelArgs args;
  args.Reset(ArrayAbi::kMemref);
  AddMemref(args, 0x1000, {6}, 4);
  args.AddWord(42);
  AddMemref(args, 0x2000, {2, 3}, 4);
  EXPECT_EQ(args.words(), (Words{0x1000, 0x1000, 0, 6, 1, 42, 0x2000, 0x2000, 0,
                                 2, 3, 3, 1}));
  void** params = args.params();
  EXPECT_EQ(*static_cast<int64_t*>(params[5]), 42);
}

ffi::Error Decode(ffi::DataType dtype, const std::vector<int64_t>& dims,
                  BufferView* view) {
  return DecodeBuffer(dtype, Addr(0x100000), dims.data(),
                      static_cast<int64_t>(dims.size()), "input 0", view);
}

// vmap packs slices through the same KernelArgs: one slice of a batched
// buffer is a memref at the slice's address, without the batch axis.
TEST(MemrefArgs, BatchSliceIsAMemrefAtTheSlice) {
  const std::vector<int64_t> dims = {3, 2, 5};
  BufferView view;
  ASSERT_TRUE(Decode(ffi::DataType::F32, dims, &view).success());
  KernelArgs args;
  args.Reset(ArrayAbi::kMemref);
  ASSERT_TRUE(AddBatchSlice(view, 3, 2, false, &args));
  const int64_t slice = 0x100000 + 2 * 2 * 5 * 4;
  EXPECT_EQ(args.words(), (Words{slice, slice, 0, 2, 5, 5, 1}));
  args.Reset(ArrayAbi::kMemref);
  ASSERT_TRUE(AddBatchSlice(view, 3, 2, true, &args));  // broadcast: slice 0
  EXPECT_EQ(args.words(), (Words{0x100000, 0x100000, 0, 2, 5, 5, 1}));
}

TEST(MemrefArgs, BatchChunkKeepsTheBatchAxis) {
  const std::vector<int64_t> dims = {4, 3};
  BufferView view;
  ASSERT_TRUE(Decode(ffi::DataType::F64, dims, &view).success());
  KernelArgs args;
  args.Reset(ArrayAbi::kMemref);
  ASSERT_TRUE(AddBatchChunk(view, 4, 1, 2, false, &args));
  const int64_t start = 0x100000 + 1 * 3 * 8;
  EXPECT_EQ(args.words(), (Words{start, start, 0, 2, 3, 3, 1}));
}

}  // namespace
