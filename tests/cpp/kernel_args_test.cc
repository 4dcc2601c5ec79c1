// Tests for the packing of kernel parameters in Numba's array ABI
// (csrc/kernel_args.*). A mistake here makes a kernel read the wrong words
// as shapes or pointers, which on a GPU shows up as silent garbage or an
// illegal address far from the cause, so the layout is checked word by word.
#include "kernel_args.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

using numbax::KernelArgs;
using Words = std::vector<int64_t>;

// Device addresses are never dereferenced on the host; only their bits
// matter.
void* Addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
int64_t Word(uintptr_t a) { return static_cast<int64_t>(a); }

void Add(KernelArgs& args, void* data, const std::vector<int64_t>& shape,
         size_t itemsize) {
  args.AddArray(data, shape.data(), static_cast<int64_t>(shape.size()),
                itemsize);
}

// The parameter list must be exactly what cuLaunchKernel reads: one pointer
// per word, each pointing at that word.
void ExpectParamsMatchWords(KernelArgs& args) {
  void** params = args.params();
  const Words& words = args.words();
  ASSERT_EQ(args.size(), words.size());
  for (size_t i = 0; i < words.size(); ++i) {
    ASSERT_EQ(params[i], static_cast<const void*>(&words[i])) << "word " << i;
    int64_t through_param;
    std::memcpy(&through_param, params[i], sizeof(through_param));
    EXPECT_EQ(through_param, words[i]) << "word " << i;
  }
}

TEST(KernelArgs, StartsEmpty) {
  KernelArgs args;
  EXPECT_EQ(args.size(), 0u);
  EXPECT_TRUE(args.words().empty());
}

// Layouts below are written out literally: meminfo, parent, nitems,
// itemsize, data, shape..., strides in bytes...

TEST(KernelArgs, Rank1) {
  KernelArgs args;
  Add(args, Addr(0x7f0000001000), {7}, 2);
  EXPECT_EQ(args.words(), (Words{0, 0, 7, 2, Word(0x7f0000001000), 7, 2}));
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, Rank2) {
  KernelArgs args;
  Add(args, Addr(0x7f0000002000), {3, 4}, 4);
  EXPECT_EQ(args.words(),
            (Words{0, 0, 12, 4, Word(0x7f0000002000), 3, 4, 16, 4}));
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, Rank3) {
  KernelArgs args;
  Add(args, Addr(0x7f0000003000), {2, 3, 4}, 8);
  EXPECT_EQ(args.words(),
            (Words{0, 0, 24, 8, Word(0x7f0000003000), 2, 3, 4, 96, 32, 8}));
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, Rank0IsOneElementWithNoShape) {
  KernelArgs args;
  Add(args, Addr(0x7f0000004000), {}, 4);
  EXPECT_EQ(args.words(), (Words{0, 0, 1, 4, Word(0x7f0000004000)}));
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, EveryItemsize) {
  for (size_t itemsize : {1, 2, 4, 8, 16}) {
    SCOPED_TRACE(itemsize);
    const int64_t is = static_cast<int64_t>(itemsize);
    KernelArgs args;
    Add(args, Addr(0x1000), {2, 3, 5}, itemsize);
    EXPECT_EQ(args.words(),
              (Words{0, 0, 30, is, 0x1000, 2, 3, 5, 15 * is, 5 * is, is}));
  }
}

TEST(KernelArgs, SeveralArraysInSequence) {
  KernelArgs args;
  Add(args, Addr(0xa000), {5}, 4);
  Add(args, Addr(0xb000), {2, 3, 4}, 2);
  Add(args, Addr(0xc000), {}, 16);
  Add(args, Addr(0xd000), {6, 1}, 1);
  // 7 + 11 + 5 + 9 words, back to back with no padding between arrays.
  EXPECT_EQ(args.words(), (Words{0, 0, 5,  4,  0xa000, 5, 4,               //
                                 0, 0, 24, 2,  0xb000, 2, 3, 4, 24, 8, 2,  //
                                 0, 0, 1,  16, 0xc000,                     //
                                 0, 0, 6,  1,  0xd000, 6, 1, 1, 1}));
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, ZeroSizeArrays) {
  KernelArgs args;
  // Empty outputs decode with a null data pointer; it is passed as is.
  Add(args, nullptr, {0}, 4);
  EXPECT_EQ(args.words(), (Words{0, 0, 0, 4, 0, 0, 4}));

  args.Reset();
  Add(args, nullptr, {0, 5}, 4);
  EXPECT_EQ(args.words(), (Words{0, 0, 0, 4, 0, 0, 5, 20, 4}));

  // With the zero extent inside, only nitems, the shape and the innermost
  // stride are pinned down: no element is ever addressed, and numpy's and
  // the plain product's outer strides differ here.
  args.Reset();
  Add(args, Addr(0x2000), {3, 0, 2}, 8);
  const Words& w = args.words();
  ASSERT_EQ(w.size(), 11u);
  EXPECT_EQ((Words(w.begin(), w.begin() + 8)),
            (Words{0, 0, 0, 8, 0x2000, 3, 0, 2}));
  EXPECT_EQ(w[10], 8);
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, DataPointerBitsArePreserved) {
  // Addresses with the top bit set must survive the trip through int64.
  const uintptr_t high = ~uintptr_t{0} - 0xfff;
  KernelArgs args;
  Add(args, Addr(high), {1}, 1);
  void* back;
  std::memcpy(&back, &args.words()[4], sizeof(back));
  EXPECT_EQ(back, Addr(high));
}

TEST(KernelArgs, ParamsFollowWordsAfterGrowth) {
  // params() taken early would dangle once the word vector reallocates;
  // taking it again after more arrays must give a fresh, consistent list.
  KernelArgs args;
  Add(args, Addr(0x1000), {2}, 4);
  ExpectParamsMatchWords(args);
  for (int i = 0; i < 50; ++i) Add(args, Addr(0x2000 + i), {1, 2, 3}, 8);
  ASSERT_EQ(args.size(), 7u + 50u * 11u);
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, ResetKeepsCapacity) {
  KernelArgs args;
  auto pack = [&args] {
    Add(args, Addr(0x1000), {4, 4}, 4);
    Add(args, Addr(0x2000), {2, 3, 4}, 8);
    Add(args, Addr(0x3000), {9}, 1);
  };
  pack();
  const Words first = args.words();
  void** params = args.params();
  const int64_t* storage = args.words().data();
  const size_t capacity = args.words().capacity();

  args.Reset();
  EXPECT_EQ(args.size(), 0u);
  EXPECT_EQ(args.words().capacity(), capacity);

  // Steady state: the same launch packed again reuses both buffers, so the
  // hot path allocates nothing.
  pack();
  EXPECT_EQ(args.words(), first);
  EXPECT_EQ(args.words().data(), storage);
  EXPECT_EQ(args.params(), params);
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, ResetDropsPreviousArrays) {
  KernelArgs args;
  Add(args, Addr(0x1000), {2, 3, 4}, 8);
  Add(args, Addr(0x2000), {5}, 4);
  args.params();
  args.Reset();
  Add(args, Addr(0x3000), {6}, 2);
  EXPECT_EQ(args.words(), (Words{0, 0, 6, 2, 0x3000, 6, 2}));
  ExpectParamsMatchWords(args);
}

// Scalars of a fast launch (csrc/launch_args.cc) sit in 8-byte words after
// or between arrays; the driver reads each parameter's own size from the
// start of its word, so an int32 or float32 must be in the low bytes.
TEST(KernelArgs, ScalarWordsReadAtTheirOwnWidth) {
  KernelArgs args;
  const std::vector<int64_t> shape = {3};
  Add(args, Addr(0x1000), shape, 4);
  const int64_t minus_five = -5;  // an int32 parameter, from a masked int64
  args.AddWord(minus_five);
  const float f = 2.5f;
  int64_t float_word = 0;
  std::memcpy(&float_word, &f, sizeof f);
  args.AddWord(float_word);
  Add(args, Addr(0x2000), shape, 4);
  ExpectParamsMatchWords(args);
  void** params = args.params();
  const size_t array_words = 5 + 2 * shape.size();
  int32_t as_int32;
  std::memcpy(&as_int32, params[array_words], sizeof as_int32);
  EXPECT_EQ(as_int32, -5);
  float as_float;
  std::memcpy(&as_float, params[array_words + 1], sizeof as_float);
  EXPECT_EQ(as_float, 2.5f);
  EXPECT_EQ(args.words()[array_words + 2 + 4], Word(0x2000));  // next data
}

// A view (a slice or transpose) is packed with its own strides, which may
// be negative or zero, exactly as Numba packs a device array.
TEST(KernelArgs, StridedViewKeepsItsStrides) {
  KernelArgs args;
  const int64_t dims[] = {10, 3};
  const int64_t strides[] = {4, -40};
  args.AddStridedArray(Addr(0x3000), dims, strides, 2, 4);
  ExpectParamsMatchWords(args);
  EXPECT_EQ(args.words(), (Words{0, 0, 30, 4, Word(0x3000), 10, 3, 4, -40}));
}

TEST(NumbaArrayLayout, DecidesOnlyWhereItIsExact) {
  auto layout = [](std::vector<int64_t> d, std::vector<int64_t> s) {
    return numbax::NumbaArrayLayout(d.data(), s.data(),
                                    static_cast<int64_t>(d.size()), 4);
  };
  EXPECT_EQ(layout({3, 5}, {20, 4}), 'C');
  EXPECT_EQ(layout({3, 5}, {4, 12}), 'F');
  EXPECT_EQ(layout({3, 5}, {40, 8}), 'A');
  EXPECT_EQ(layout({4, 3}, {0, 4}), 'A');   // broadcast
  EXPECT_EQ(layout({1, 5}, {20, 4}), 'C');  // strictly C with a unit extent
  EXPECT_EQ(layout({1, 5}, {99, 4}), 0);    // unit extent, left to Numba
  EXPECT_EQ(layout({0, 5}, {20, 4}), 0);    // empty, left to Numba
  EXPECT_EQ(layout({}, {}), 'C');           // 0-d
}

// Per-slice launches pack once and move the data pointers: every slice's
// words must equal a fresh AddBatchSlice of that slice (the packing the
// handler did per launch before), and the parameter pointers handed to
// cuLaunchKernel must not move between slices.
numbax::BufferView View(uintptr_t address, xla::ffi::DataType dtype,
                        const std::vector<int64_t>& dims, size_t itemsize) {
  numbax::BufferView v;
  v.data = Addr(address);
  v.dtype = dtype;
  v.dims = dims.data();
  v.rank = static_cast<int64_t>(dims.size());
  int64_t count = 1;
  for (int64_t d : dims) count *= d;
  v.element_count = count;
  v.nbytes = static_cast<size_t>(count) * itemsize;
  return v;
}

TEST(SliceParams, EverySliceMatchesAFreshPacking) {
  const std::vector<int64_t> x_dims = {5, 3, 2}, w_dims = {1, 4},
                             out_dims = {5, 7};
  const std::vector<numbax::BufferView> buffers = {
      View(0x10000, xla::ffi::DataType::F32, x_dims, 4),
      View(0x20000, xla::ffi::DataType::F64, w_dims, 8),  // broadcast
      View(0x30000, xla::ffi::DataType::S16, out_dims, 2),
  };
  const std::vector<uint8_t> broadcast = {0, 1, 0};
  numbax::SliceParams slices;
  size_t bad = 99;
  ASSERT_TRUE(
      slices.Pack(buffers, 5, broadcast, numbax::ArrayAbi::kNumba, &bad));
  void** params = slices.params();
  for (int64_t s : {0, 3, 1, 4, 2}) {  // any order: each Select is absolute
    slices.Select(s);
    KernelArgs fresh;
    for (size_t i = 0; i < buffers.size(); ++i) {
      ASSERT_TRUE(
          numbax::AddBatchSlice(buffers[i], 5, s, broadcast[i] != 0, &fresh));
    }
    EXPECT_EQ(slices.args().words(), fresh.words()) << "slice " << s;
    EXPECT_EQ(slices.params(), params);
    for (size_t i = 0; i < fresh.size(); ++i) {
      EXPECT_EQ(params[i], &slices.args().words()[i]);
    }
  }
  // The offsets themselves: slice 4 of x (3*2 floats a slice), of out
  // (7 int16 a slice); w stays at slice 0.
  slices.Select(4);
  const Words& w = slices.args().words();
  EXPECT_EQ(w[4], Word(0x10000 + 4 * 24));
  EXPECT_EQ(w[9 + 4], Word(0x20000));
  EXPECT_EQ(w[9 + 7 + 4], Word(0x30000 + 4 * 14));
}

TEST(SliceParams, MemrefSlicesMoveBothPointers) {
  // numba-cuda-mlir's arrays carry the address twice (allocated, aligned):
  // a slice that moved only one would read one slice and write another.
  const std::vector<int64_t> x_dims = {4, 3}, w_dims = {1, 3},
                             out_dims = {4, 5};
  const std::vector<numbax::BufferView> buffers = {
      View(0x10000, xla::ffi::DataType::F32, x_dims, 4),
      View(0x20000, xla::ffi::DataType::F32, w_dims, 4),  // broadcast
      View(0x30000, xla::ffi::DataType::S32, out_dims, 4),
  };
  const std::vector<uint8_t> broadcast = {0, 1, 0};
  numbax::SliceParams slices;
  size_t bad = 99;
  ASSERT_TRUE(
      slices.Pack(buffers, 4, broadcast, numbax::ArrayAbi::kMemref, &bad));
  for (int64_t s : {3, 0, 2, 1}) {
    slices.Select(s);
    KernelArgs fresh;
    fresh.Reset(numbax::ArrayAbi::kMemref);
    for (size_t i = 0; i < buffers.size(); ++i) {
      ASSERT_TRUE(
          numbax::AddBatchSlice(buffers[i], 4, s, broadcast[i] != 0, &fresh));
    }
    EXPECT_EQ(slices.args().words(), fresh.words()) << "slice " << s;
  }
  slices.Select(3);
  const Words& w = slices.args().words();
  // x: 3 + 2 * 1 words; its two pointers at slice 3 (3 floats a slice).
  EXPECT_EQ(w[0], Word(0x10000 + 3 * 12));
  EXPECT_EQ(w[1], Word(0x10000 + 3 * 12));
  EXPECT_EQ(w[5], Word(0x20000));
  EXPECT_EQ(w[6], Word(0x20000));
  EXPECT_EQ(w[10], Word(0x30000 + 3 * 20));
  EXPECT_EQ(w[11], Word(0x30000 + 3 * 20));
}

TEST(SliceParams, RefusesABufferThatIsNotTheBatch) {
  const std::vector<int64_t> good = {4, 2}, short_dims = {3, 2};
  const std::vector<numbax::BufferView> buffers = {
      View(0x1000, xla::ffi::DataType::F32, good, 4),
      View(0x2000, xla::ffi::DataType::F32, short_dims, 4),
  };
  numbax::SliceParams slices;
  size_t bad = 99;
  EXPECT_FALSE(slices.Pack(buffers, 4, {0, 0}, numbax::ArrayAbi::kNumba, &bad));
  EXPECT_EQ(bad, 1u);
  // A broadcast buffer is read at slice 0 only, whatever its extent.
  EXPECT_TRUE(slices.Pack(buffers, 4, {0, 1}, numbax::ArrayAbi::kNumba, &bad));
}

// -- scalar parameters (numba_cuda_kernel's Python and NumPy scalars) ---------
//
// Numba's launch passes a scalar as its own C type (ctypes.c_<type>(value);
// a boolean as one byte, a float16 as its 16 bits) and a complex as two
// parameters, real then imaginary: each goes in the low bytes of one word,
// from which the driver reads the parameter's own size.

template <typename T>
numbax::ScalarParam Scalar(char kind, T value, int64_t position = 0) {
  numbax::ScalarParam p;
  const std::string bad =
      numbax::MakeScalarParam(position, kind, &value, sizeof value, &p);
  EXPECT_EQ(bad, "");
  return p;
}

template <typename T>
int64_t LowBytes(T value) {
  int64_t word = 0;
  std::memcpy(&word, &value, sizeof value);
  return word;
}

TEST(ScalarParam, IntegersKeepTheirOwnWidthInTheLowBytes) {
  numbax::ScalarParam p = Scalar('i', int16_t{-1});
  ASSERT_EQ(p.num_words, 1);
  EXPECT_EQ(p.words[0], 0xFFFF);  // what an int16 parameter reads: -1
  int16_t through;
  std::memcpy(&through, &p.words[0], sizeof through);
  EXPECT_EQ(through, -1);
  EXPECT_EQ(Scalar('i', int64_t{-5}).words[0], -5);
  EXPECT_EQ(Scalar('i', int32_t{-7}).words[0], LowBytes(int32_t{-7}));
  EXPECT_EQ(Scalar('u', uint8_t{200}).words[0], 200);
  EXPECT_EQ(Scalar('u', uint64_t{~0ull}).words[0], -1);
  EXPECT_EQ(Scalar('i', int8_t{-128}).words[0], 0x80);
}

TEST(ScalarParam, FloatsAreTheirBits) {
  EXPECT_EQ(Scalar('f', 1.5f).words[0], 0x3FC00000);
  EXPECT_EQ(Scalar('f', -2.25).words[0], LowBytes(-2.25));
  EXPECT_EQ(Scalar('f', uint16_t{0x3C00}).words[0], 0x3C00);  // float16 1.0
  float back;
  numbax::ScalarParam p = Scalar('f', 0.1f);
  std::memcpy(&back, &p.words[0], sizeof back);
  EXPECT_EQ(back, 0.1f);
}

TEST(ScalarParam, BooleansAreOneByteZeroOrOne) {
  EXPECT_EQ(Scalar('b', uint8_t{1}).words[0], 1);
  EXPECT_EQ(Scalar('b', uint8_t{0}).words[0], 0);
  EXPECT_EQ(Scalar('b', uint8_t{2}).words[0], 1);  // any nonzero byte: true
}

TEST(ScalarParam, ComplexIsTwoWordsRealThenImaginary) {
  const float c64[2] = {1.5f, -2.0f};
  numbax::ScalarParam p;
  ASSERT_EQ(numbax::MakeScalarParam(3, 'c', c64, sizeof c64, &p), "");
  EXPECT_EQ(p.position, 3);
  ASSERT_EQ(p.num_words, 2);
  EXPECT_EQ(p.words[0], 0x3FC00000);
  EXPECT_EQ(p.words[1], LowBytes(-2.0f));
  const double c128[2] = {0.25, 1e300};
  ASSERT_EQ(numbax::MakeScalarParam(0, 'c', c128, sizeof c128, &p), "");
  EXPECT_EQ(p.words[0], LowBytes(0.25));
  EXPECT_EQ(p.words[1], LowBytes(1e300));
}

TEST(ScalarParam, RefusesKindsAndSizesNumbaHasNoParameterFor) {
  numbax::ScalarParam p;
  const char bytes[16] = {};
  EXPECT_NE(numbax::MakeScalarParam(0, 'x', bytes, 4, &p), "");
  EXPECT_NE(numbax::MakeScalarParam(0, 'i', bytes, 3, &p), "");
  EXPECT_NE(numbax::MakeScalarParam(0, 'i', bytes, 16, &p), "");
  EXPECT_NE(numbax::MakeScalarParam(0, 'f', bytes, 1, &p), "");
  EXPECT_NE(numbax::MakeScalarParam(0, 'f', bytes, 16, &p), "");  // longdouble
  EXPECT_NE(numbax::MakeScalarParam(0, 'b', bytes, 2, &p), "");
  EXPECT_NE(numbax::MakeScalarParam(0, 'c', bytes, 4, &p), "");
  EXPECT_NE(numbax::MakeScalarParam(-1, 'i', bytes, 4, &p), "");
  EXPECT_NE(numbax::MakeScalarParam(0, 'i', nullptr, 4, &p), "");
}

TEST(ScalarParam, PositionsMustIncreaseAndStayInTheList) {
  std::vector<numbax::ScalarParam> s = {Scalar('i', int32_t{1}, 0),
                                        Scalar('i', int32_t{2}, 2)};
  EXPECT_EQ(numbax::CheckScalarPositions(s, 4), "");
  EXPECT_NE(numbax::CheckScalarPositions(s, 2), "");  // 2 is past the end
  std::swap(s[0], s[1]);
  EXPECT_NE(numbax::CheckScalarPositions(s, 4), "");
  s = {Scalar('i', int32_t{1}, 1), Scalar('i', int32_t{2}, 1)};
  EXPECT_NE(numbax::CheckScalarPositions(s, 4), "");
}

// kernel(x, alpha, y, n, out): buffers x, y, out; scalars at 1 and 3.
TEST(KernelArgs, ScalarsSitAtTheirPositionsAmongTheArrays) {
  const std::vector<numbax::ScalarParam> scalars = {Scalar('f', 2.5f, 1),
                                                    Scalar('i', int64_t{7}, 3)};
  const std::vector<int64_t> shape = {4};
  KernelArgs args;
  ASSERT_TRUE(numbax::AddParams(scalars, 3, &args, [&](size_t i) {
    Add(args, Addr(0x1000 * (i + 1)), shape, 4);
    return true;
  }));
  const Words x = {0, 0, 4, 4, Word(0x1000), 4, 4};
  const Words y = {0, 0, 4, 4, Word(0x2000), 4, 4};
  const Words out = {0, 0, 4, 4, Word(0x3000), 4, 4};
  Words want = x;
  want.push_back(LowBytes(2.5f));
  want.insert(want.end(), y.begin(), y.end());
  want.push_back(7);
  want.insert(want.end(), out.begin(), out.end());
  EXPECT_EQ(args.words(), want);
  ExpectParamsMatchWords(args);
}

TEST(KernelArgs, ScalarsFirstAndLastAndAComplexInBetween) {
  const float c[2] = {1.0f, 2.0f};
  numbax::ScalarParam complex_param;
  ASSERT_EQ(numbax::MakeScalarParam(2, 'c', c, sizeof c, &complex_param), "");
  const std::vector<numbax::ScalarParam> scalars = {
      Scalar('b', uint8_t{1}, 0), complex_param, Scalar('i', int16_t{3}, 4)};
  KernelArgs args;
  std::vector<size_t> order;
  ASSERT_TRUE(numbax::AddParams(scalars, 2, &args, [&](size_t i) {
    order.push_back(i);
    args.AddWord(100 + static_cast<int64_t>(i));
    return true;
  }));
  EXPECT_EQ(order, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(args.words(),
            (Words{1, 100, LowBytes(1.0f), LowBytes(2.0f), 101, 3}));
  // A buffer that fails stops the packing.
  KernelArgs failed;
  EXPECT_FALSE(
      numbax::AddParams(scalars, 2, &failed, [&](size_t i) { return i == 0; }));
}

TEST(SliceParams, ScalarsStayPutWhileTheSlicesMove) {
  const std::vector<int64_t> x_dims = {3, 2}, out_dims = {3, 2};
  const std::vector<numbax::BufferView> buffers = {
      View(0x10000, xla::ffi::DataType::F32, x_dims, 4),
      View(0x30000, xla::ffi::DataType::F32, out_dims, 4),
  };
  const std::vector<numbax::ScalarParam> scalars = {
      Scalar('f', 0.5, 1), Scalar('i', int32_t{-9}, 2)};
  numbax::SliceParams slices;
  size_t bad = 99;
  ASSERT_TRUE(
      slices.Pack(buffers, 3, {0, 0}, numbax::ArrayAbi::kNumba, &bad, scalars));
  for (int64_t s : {2, 0, 1}) {
    slices.Select(s);
    KernelArgs fresh;
    ASSERT_TRUE(
        numbax::AddParams(scalars, buffers.size(), &fresh, [&](size_t i) {
          return numbax::AddBatchSlice(buffers[i], 3, s, false, &fresh);
        }));
    EXPECT_EQ(slices.args().words(), fresh.words()) << "slice " << s;
  }
  slices.Select(2);
  const Words& w = slices.args().words();
  // x's slice takes 5 + 2 words, then the two scalars, then out's slice.
  EXPECT_EQ(w[4], Word(0x10000 + 2 * 8));
  EXPECT_EQ(w[7], LowBytes(0.5));
  EXPECT_EQ(w[8], LowBytes(int32_t{-9}));
  EXPECT_EQ(w[9 + 4], Word(0x30000 + 2 * 8));
}

}  // namespace
