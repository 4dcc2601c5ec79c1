// Tests for the decoding of XLA's buffer descriptors (csrc/call_frame.*).
//
// The call frames here are built by hand from the C API structs, the way
// XLA lays them out, so that malformed frames XLA itself would never send
// can be fed to the decoder too.
#include "call_frame.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace {

namespace ffi = ::xla::ffi;
using numbax::BufferView;
using numbax::DecodeBuffer;
using numbax::DecodeCallBuffers;
using numbax::LookupDType;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Stand-ins for device addresses. Nothing in the decoder may read through a
// data pointer (on a GPU call they point at device memory), and a host read
// of these faults, so any such read fails the test loudly.
void* FakeDevicePtr(uintptr_t i) {
  return reinterpret_cast<void*>(uintptr_t{0xdead0000} + i * 0x1000);
}

ffi::DataType Code(int code) { return static_cast<ffi::DataType>(code); }

// Owns everything a hand-made call frame points at. Deques keep the
// addresses of earlier elements stable while more are added.
class FakeFrame {
 public:
  XLA_FFI_Buffer* AddInput(ffi::DataType dtype, void* data,
                           std::vector<int64_t> dims) {
    XLA_FFI_Buffer* b = MakeBuffer(dtype, data, std::move(dims));
    AddRawInput(XLA_FFI_ArgType_BUFFER, b);
    return b;
  }
  XLA_FFI_Buffer* AddOutput(ffi::DataType dtype, void* data,
                            std::vector<int64_t> dims) {
    XLA_FFI_Buffer* b = MakeBuffer(dtype, data, std::move(dims));
    AddRawOutput(XLA_FFI_RetType_BUFFER, b);
    return b;
  }
  void AddRawInput(XLA_FFI_ArgType type, void* arg) {
    arg_types_.push_back(type);
    arg_ptrs_.push_back(arg);
  }
  void AddRawOutput(XLA_FFI_RetType type, void* ret) {
    ret_types_.push_back(type);
    ret_ptrs_.push_back(ret);
  }

  ffi::RemainingArgs Args(size_t offset = 0) {
    args_ = XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr,
                         static_cast<int64_t>(arg_types_.size()),
                         arg_types_.data(), arg_ptrs_.data()};
    return ffi::RemainingArgs(&args_, offset);
  }
  ffi::RemainingRets Rets(size_t offset = 0) {
    rets_ = XLA_FFI_Rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr,
                         static_cast<int64_t>(ret_types_.size()),
                         ret_types_.data(), ret_ptrs_.data()};
    return ffi::RemainingRets(&rets_, offset);
  }

  ffi::Error Decode(int64_t expected_inputs, int64_t expected_outputs,
                    std::vector<BufferView>* out) {
    return DecodeCallBuffers(Args(), Rets(), expected_inputs, expected_outputs,
                             out);
  }

 private:
  XLA_FFI_Buffer* MakeBuffer(ffi::DataType dtype, void* data,
                             std::vector<int64_t> dims) {
    dims_.push_back(std::move(dims));
    std::vector<int64_t>& d = dims_.back();
    // XLA may pass null dims for a scalar; do the same, so that rank-0
    // buffers exercise that case.
    buffers_.push_back(XLA_FFI_Buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr,
                                      static_cast<XLA_FFI_DataType>(dtype),
                                      data, static_cast<int64_t>(d.size()),
                                      d.empty() ? nullptr : d.data()});
    return &buffers_.back();
  }

  std::deque<std::vector<int64_t>> dims_;
  std::deque<XLA_FFI_Buffer> buffers_;
  std::vector<XLA_FFI_ArgType> arg_types_;
  std::vector<void*> arg_ptrs_;
  std::vector<XLA_FFI_RetType> ret_types_;
  std::vector<void*> ret_ptrs_;
  XLA_FFI_Args args_{};
  XLA_FFI_Rets rets_{};
};

::testing::AssertionResult Fails(const ffi::Error& err,
                                 const std::string& needle) {
  if (err.success()) {
    return ::testing::AssertionFailure() << "succeeded, expected an error";
  }
  if (err.errc() != ffi::ErrorCode::kInvalidArgument) {
    return ::testing::AssertionFailure()
           << "error code " << static_cast<int>(*err.errc())
           << " is not INVALID_ARGUMENT: " << err.message();
  }
  if (err.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message \"" << err.message() << "\" lacks \"" << needle << "\"";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Succeeds(const ffi::Error& err) {
  if (err.success()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "failed: " << err.message();
}

struct Supported {
  ffi::DataType dtype;
  const char* name;
  size_t itemsize;
  ffi::DataType as;  // what kernels see
};

// Spelled out independently of call_frame.cc: these names are what the Python
// side matches against numpy's dtype names.
const Supported kSupported[] = {
    {ffi::DataType::PRED, "bool", 1, ffi::DataType::PRED},
    {ffi::DataType::S8, "int8", 1, ffi::DataType::S8},
    {ffi::DataType::S16, "int16", 2, ffi::DataType::S16},
    {ffi::DataType::S32, "int32", 4, ffi::DataType::S32},
    {ffi::DataType::S64, "int64", 8, ffi::DataType::S64},
    {ffi::DataType::U8, "uint8", 1, ffi::DataType::U8},
    {ffi::DataType::U16, "uint16", 2, ffi::DataType::U16},
    {ffi::DataType::U32, "uint32", 4, ffi::DataType::U32},
    {ffi::DataType::U64, "uint64", 8, ffi::DataType::U64},
    {ffi::DataType::F16, "float16", 2, ffi::DataType::F16},
    {ffi::DataType::F32, "float32", 4, ffi::DataType::F32},
    {ffi::DataType::F64, "float64", 8, ffi::DataType::F64},
    {ffi::DataType::BF16, "bfloat16", 2, ffi::DataType::BF16},
    {ffi::DataType::C64, "complex64", 8, ffi::DataType::C64},
    {ffi::DataType::C128, "complex128", 16, ffi::DataType::C128},
    // The 8-bit floats reach kernels as their bits: uint8 of the same shape.
    {ffi::DataType::F8E5M2, "uint8", 1, ffi::DataType::U8},
    {ffi::DataType::F8E4M3, "uint8", 1, ffi::DataType::U8},
    {ffi::DataType::F8E4M3FN, "uint8", 1, ffi::DataType::U8},
    {ffi::DataType::F8E4M3B11FNUZ, "uint8", 1, ffi::DataType::U8},
    {ffi::DataType::F8E5M2FNUZ, "uint8", 1, ffi::DataType::U8},
    {ffi::DataType::F8E4M3FNUZ, "uint8", 1, ffi::DataType::U8},
    {ffi::DataType::F8E3M4, "uint8", 1, ffi::DataType::U8},
    {ffi::DataType::F8E8M0FNU, "uint8", 1, ffi::DataType::U8},
};

// -------------------------------------------------------------- LookupDType

TEST(LookupDType, SupportedTypesHaveNumpyNameAndItemsize) {
  for (const Supported& s : kSupported) {
    SCOPED_TRACE(s.name);
    const numbax::DTypeInfo* info = LookupDType(s.dtype);
    ASSERT_NE(info, nullptr);
    EXPECT_STREQ(info->name, s.name);
    EXPECT_EQ(info->itemsize, s.itemsize);
    EXPECT_EQ(info->as, s.as);
    // XLA's own idea of the width must agree, or byte sizes computed here
    // would disagree with the buffers XLA allocated.
    EXPECT_EQ(info->itemsize, ffi::ByteWidth(s.dtype));
  }
}

TEST(LookupDType, OnlyTheSupportedCodesAreKnown) {
  // Every value the one-byte DataType can hold, so a code added to XLA
  // later (or a garbage byte) can never slip through as some dtype.
  for (int code = 0; code < 256; ++code) {
    bool supported = false;
    for (const Supported& s : kSupported) {
      supported |= static_cast<int>(s.dtype) == code;
    }
    EXPECT_EQ(LookupDType(Code(code)) != nullptr, supported) << "code " << code;
  }
}

TEST(LookupDType, UnsupportedCodesAreRejectedByDecodeNamingTheCode) {
  const ffi::DataType kUnsupported[] = {
      ffi::DataType::INVALID,
      ffi::DataType::TOKEN,
      ffi::DataType::S1,
      ffi::DataType::S2,
      ffi::DataType::S4,
      ffi::DataType::U1,
      ffi::DataType::U2,
      ffi::DataType::U4,
      ffi::DataType::F4E2M1FN,
      // Codes XLA uses for tuples and opaque values, never FFI buffers.
      Code(13),
      Code(14),
      Code(255),
  };
  const int64_t dims[] = {4};
  for (ffi::DataType dtype : kUnsupported) {
    const int code = static_cast<int>(dtype);
    SCOPED_TRACE(code);
    EXPECT_EQ(LookupDType(dtype), nullptr);
    BufferView view;
    ffi::Error err =
        DecodeBuffer(dtype, FakeDevicePtr(1), dims, 1, "input 3", &view);
    EXPECT_TRUE(Fails(err, "code " + std::to_string(code)));
    EXPECT_TRUE(Fails(err, "input 3"));
  }
}

// ------------------------------------------------------------- DecodeBuffer

TEST(DecodeBuffer, ScalarWithNullDims) {
  BufferView view;
  ASSERT_TRUE(Succeeds(DecodeBuffer(ffi::DataType::F32, FakeDevicePtr(1),
                                    nullptr, 0, "input 0", &view)));
  EXPECT_EQ(view.data, FakeDevicePtr(1));
  EXPECT_EQ(view.dtype, ffi::DataType::F32);
  EXPECT_EQ(view.rank, 0);
  EXPECT_EQ(view.dims, nullptr);
  EXPECT_EQ(view.element_count, 1);
  EXPECT_EQ(view.nbytes, 4u);
}

TEST(DecodeBuffer, Ranks0To3EveryDType) {
  const std::vector<int64_t> shapes[] = {{}, {7}, {2, 3}, {2, 3, 5}};
  const int64_t counts[] = {1, 7, 6, 30};
  for (const Supported& s : kSupported) {
    for (size_t k = 0; k < 4; ++k) {
      SCOPED_TRACE(std::string(s.name) + " rank " + std::to_string(k));
      const std::vector<int64_t>& shape = shapes[k];
      BufferView view;
      ASSERT_TRUE(Succeeds(
          DecodeBuffer(s.dtype, FakeDevicePtr(k + 1), shape.data(),
                       static_cast<int64_t>(shape.size()), "input 0", &view)));
      EXPECT_EQ(view.data, FakeDevicePtr(k + 1));
      EXPECT_EQ(view.dtype, s.as);  // a float8 buffer decodes as U8
      EXPECT_EQ(view.rank, static_cast<int64_t>(k));
      // A view into XLA's frame, not a copy: the frame outlives the call.
      EXPECT_EQ(view.dims, shape.data());
      EXPECT_EQ(view.element_count, counts[k]);
      EXPECT_EQ(view.nbytes, static_cast<size_t>(counts[k]) * s.itemsize);
    }
  }
}

TEST(DecodeBuffer, ZeroSizeWithNullDataIsAccepted) {
  const std::vector<int64_t> shapes[] = {{0}, {3, 0}, {0, 4}, {2, 0, 5}};
  for (const std::vector<int64_t>& shape : shapes) {
    SCOPED_TRACE(shape.size());
    BufferView view;
    view.data = FakeDevicePtr(9);  // must be overwritten
    ASSERT_TRUE(Succeeds(
        DecodeBuffer(ffi::DataType::C128, nullptr, shape.data(),
                     static_cast<int64_t>(shape.size()), "output 0", &view)));
    EXPECT_EQ(view.data, nullptr);
    EXPECT_EQ(view.element_count, 0);
    EXPECT_EQ(view.nbytes, 0u);
    EXPECT_EQ(view.rank, static_cast<int64_t>(shape.size()));
  }
}

TEST(DecodeBuffer, ZeroSizeWithDataReportsNull) {
  // An empty buffer's pointer is meaningless (XLA may hand over anything);
  // reporting null keeps it from being mistaken for usable memory.
  const int64_t dims[] = {4, 0};
  BufferView view;
  ASSERT_TRUE(Succeeds(DecodeBuffer(ffi::DataType::F32, FakeDevicePtr(1), dims,
                                    2, "input 0", &view)));
  EXPECT_EQ(view.data, nullptr);
  EXPECT_EQ(view.nbytes, 0u);
}

TEST(DecodeBuffer, NonEmptyWithNullDataIsRejected) {
  const int64_t dims[] = {2, 3};
  BufferView view;
  EXPECT_TRUE(Fails(
      DecodeBuffer(ffi::DataType::S32, nullptr, dims, 2, "output 1", &view),
      "output 1: null data"));
  // A scalar holds bytes too.
  EXPECT_TRUE(Fails(
      DecodeBuffer(ffi::DataType::S32, nullptr, nullptr, 0, "input 0", &view),
      "null data"));
}

TEST(DecodeBuffer, NegativeDimensionIsRejected) {
  BufferView view;
  const int64_t dims[] = {2, -1, 3};
  EXPECT_TRUE(Fails(DecodeBuffer(ffi::DataType::F32, FakeDevicePtr(1), dims, 3,
                                 "input 0", &view),
                    "dimension 1 is negative"));
  // A zero extent earlier must not hide a negative one behind it: the
  // product would be 0 and look like a valid empty buffer.
  const int64_t after_zero[] = {0, -5};
  EXPECT_TRUE(Fails(DecodeBuffer(ffi::DataType::F32, nullptr, after_zero, 2,
                                 "input 0", &view),
                    "dimension 1 is negative"));
  const int64_t most_negative[] = {std::numeric_limits<int64_t>::min()};
  EXPECT_TRUE(Fails(DecodeBuffer(ffi::DataType::U8, FakeDevicePtr(1),
                                 most_negative, 1, "input 0", &view),
                    "dimension 0 is negative"));
}

TEST(DecodeBuffer, NullDimsForRankedBufferIsRejected) {
  BufferView view;
  for (int64_t rank : {1, 2, 32}) {
    EXPECT_TRUE(Fails(DecodeBuffer(ffi::DataType::F32, FakeDevicePtr(1),
                                   nullptr, rank, "input 0", &view),
                      "null dimensions"))
        << "rank " << rank;
  }
}

TEST(DecodeBuffer, RankLimits) {
  const std::vector<int64_t> ones(64, 1);
  BufferView view;
  ASSERT_TRUE(
      Succeeds(DecodeBuffer(ffi::DataType::F64, FakeDevicePtr(1), ones.data(),
                            numbax::kMaxRank, "input 0", &view)));
  EXPECT_EQ(view.rank, 32);
  EXPECT_EQ(view.nbytes, 8u);
  EXPECT_TRUE(Fails(DecodeBuffer(ffi::DataType::F64, FakeDevicePtr(1),
                                 ones.data(), 33, "input 0", &view),
                    "rank 33"));
  EXPECT_TRUE(Fails(DecodeBuffer(ffi::DataType::F64, FakeDevicePtr(1),
                                 ones.data(), 64, "input 0", &view),
                    "rank 64"));
  // Checked before the dims are read: a huge rank must not walk off them.
  EXPECT_TRUE(Fails(DecodeBuffer(ffi::DataType::F64, FakeDevicePtr(1),
                                 ones.data(), kInt64Max, "input 0", &view),
                    "rank"));
  EXPECT_TRUE(Fails(DecodeBuffer(ffi::DataType::F64, FakeDevicePtr(1),
                                 ones.data(), -1, "input 0", &view),
                    "rank -1"));
}

TEST(DecodeBuffer, LargestRepresentableSizeIsAccepted) {
  BufferView view;
  const int64_t f32_max[] = {kInt64Max / 4};
  ASSERT_TRUE(Succeeds(DecodeBuffer(ffi::DataType::F32, FakeDevicePtr(1),
                                    f32_max, 1, "input 0", &view)));
  EXPECT_EQ(view.element_count, kInt64Max / 4);
  EXPECT_EQ(view.nbytes, static_cast<size_t>(kInt64Max / 4) * 4);

  const int64_t i8_2d[] = {int64_t{1} << 31, int64_t{1} << 31};
  ASSERT_TRUE(Succeeds(DecodeBuffer(ffi::DataType::S8, FakeDevicePtr(1), i8_2d,
                                    2, "input 0", &view)));
  EXPECT_EQ(view.nbytes, size_t{1} << 62);
}

TEST(DecodeBuffer, ByteSizeOverflowIsRejected) {
  struct Case {
    ffi::DataType dtype;
    std::vector<int64_t> dims;
  };
  const Case cases[] = {
      // Bytes overflow though the element count fits.
      {ffi::DataType::F32, {kInt64Max / 4 + 1}},
      {ffi::DataType::C128, {kInt64Max / 16 + 1}},
      {ffi::DataType::C128, {int64_t{1} << 30, int64_t{1} << 30, 8}},
      // Element counts that wrap to exactly 0 (mod 2^64), which a naive
      // product would take for an empty buffer.
      {ffi::DataType::S8, {int64_t{1} << 32, int64_t{1} << 32}},
      {ffi::DataType::PRED, {int64_t{1} << 62, 4}},
      {ffi::DataType::U8, {kInt64Max, 2}},
      {ffi::DataType::F64, {3, 5, kInt64Max / 8}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.dtype));
    BufferView view;
    EXPECT_TRUE(Fails(
        DecodeBuffer(c.dtype, FakeDevicePtr(1), c.dims.data(),
                     static_cast<int64_t>(c.dims.size()), "input 2", &view),
        "input 2: byte size overflows"));
  }
}

// CheckBuffer (numba_kernel's per-call path) accepts exactly what
// DecodeBuffer accepts, and fills the view the same way.
TEST(CheckBuffer, AgreesWithDecodeBuffer) {
  struct Case {
    ffi::DataType dtype;
    void* data;
    std::vector<int64_t> dims;
  };
  std::vector<Case> cases = {
      {ffi::DataType::F32, FakeDevicePtr(1), {}},
      {ffi::DataType::F32, FakeDevicePtr(1), {4096}},
      {ffi::DataType::C128, FakeDevicePtr(2), {2, 3, 5}},
      {ffi::DataType::F8E4M3FN, FakeDevicePtr(3), {7}},
      {ffi::DataType::F32, nullptr, {3}},
      {ffi::DataType::F32, nullptr, {3, 0}},
      {ffi::DataType::F32, FakeDevicePtr(4), {0, 4}},
      {ffi::DataType::F32, FakeDevicePtr(1), {-1}},
      {ffi::DataType::F32, FakeDevicePtr(1), {kInt64Max / 4}},
      {ffi::DataType::F32, FakeDevicePtr(1), {kInt64Max / 4 + 1}},
      {ffi::DataType::S8,
       FakeDevicePtr(1),
       {int64_t{1} << 31, int64_t{1} << 31}},
      {ffi::DataType::S8,
       FakeDevicePtr(1),
       {int64_t{1} << 32, int64_t{1} << 32}},
      {ffi::DataType::F32,
       FakeDevicePtr(1),
       {0, int64_t{1} << 40, int64_t{1} << 40}},
      {ffi::DataType::U8, FakeDevicePtr(1), {kInt64Max, 2}},
      {ffi::DataType::F64, FakeDevicePtr(1), {3, 5, kInt64Max / 8}},
      {Code(255), FakeDevicePtr(1), {4}},
      {ffi::DataType::TOKEN, FakeDevicePtr(1), {4}},
      {ffi::DataType::F32, FakeDevicePtr(1), std::vector<int64_t>(33, 1)},
      {ffi::DataType::F32, FakeDevicePtr(1), std::vector<int64_t>(32, 1)},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE(k);
    const Case& c = cases[k];
    const int64_t rank = static_cast<int64_t>(c.dims.size());
    BufferView decoded, checked;
    const bool ok =
        !DecodeBuffer(c.dtype, c.data, c.dims.data(), rank, "input 0", &decoded)
             .failure();
    ASSERT_EQ(
        numbax::CheckBuffer(c.dtype, c.data, c.dims.data(), rank, &checked),
        ok);
    if (!ok) continue;
    EXPECT_EQ(checked.data, decoded.data);
    EXPECT_EQ(checked.dtype, decoded.dtype);
    EXPECT_EQ(checked.dims, decoded.dims);
    EXPECT_EQ(checked.rank, decoded.rank);
    EXPECT_EQ(checked.element_count, decoded.element_count);
    EXPECT_EQ(checked.nbytes, decoded.nbytes);
  }
  // A ranked buffer with null dimensions.
  BufferView view;
  EXPECT_FALSE(numbax::CheckBuffer(ffi::DataType::F32, FakeDevicePtr(1),
                                   nullptr, 2, &view));
}

// -------------------------------------------------------- DecodeCallBuffers

TEST(DecodeCallBuffers, InputsThenOutputsInOrder) {
  FakeFrame frame;
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {2, 3});
  frame.AddInput(ffi::DataType::S64, FakeDevicePtr(2), {});
  frame.AddInput(ffi::DataType::U8, FakeDevicePtr(3), {4, 5, 6});
  frame.AddOutput(ffi::DataType::C64, FakeDevicePtr(4), {7});
  frame.AddOutput(ffi::DataType::BF16, FakeDevicePtr(5), {1, 8});

  std::vector<BufferView> out;
  ASSERT_TRUE(Succeeds(frame.Decode(3, 2, &out)));
  ASSERT_EQ(out.size(), 5u);
  const ffi::DataType dtypes[] = {ffi::DataType::F32, ffi::DataType::S64,
                                  ffi::DataType::U8, ffi::DataType::C64,
                                  ffi::DataType::BF16};
  const int64_t ranks[] = {2, 0, 3, 1, 2};
  const size_t nbytes[] = {24, 8, 120, 56, 16};
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(out[i].data, FakeDevicePtr(i + 1));
    EXPECT_EQ(out[i].dtype, dtypes[i]);
    EXPECT_EQ(out[i].rank, ranks[i]);
    EXPECT_EQ(out[i].nbytes, nbytes[i]);
  }
  EXPECT_EQ(out[2].dims[0], 4);
  EXPECT_EQ(out[2].dims[2], 6);
  EXPECT_EQ(out[4].dims[1], 8);
}

TEST(DecodeCallBuffers, EmptyFrame) {
  FakeFrame frame;
  std::vector<BufferView> out(3);
  ASSERT_TRUE(Succeeds(frame.Decode(0, 0, &out)));
  EXPECT_TRUE(out.empty());
}

TEST(DecodeCallBuffers, MinusOneAcceptsAnyCount) {
  FakeFrame frame;
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {1});
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(2), {1});
  frame.AddOutput(ffi::DataType::F32, FakeDevicePtr(3), {1});
  std::vector<BufferView> out;
  ASSERT_TRUE(Succeeds(frame.Decode(-1, -1, &out)));
  EXPECT_EQ(out.size(), 3u);
  ASSERT_TRUE(Succeeds(frame.Decode(2, -1, &out)));
  ASSERT_TRUE(Succeeds(frame.Decode(-1, 1, &out)));
  EXPECT_EQ(out.size(), 3u);
}

TEST(DecodeCallBuffers, WrongInputCountIsRejected) {
  FakeFrame frame;
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {1});
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(2), {1});
  frame.AddOutput(ffi::DataType::F32, FakeDevicePtr(3), {1});
  // Stale views from an earlier call must not survive a failed one.
  std::vector<BufferView> out(4);
  EXPECT_TRUE(Fails(frame.Decode(3, 1, &out), "expected 3 inputs, got 2"));
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(Fails(frame.Decode(1, 1, &out), "expected 1 inputs, got 2"));
  EXPECT_TRUE(Fails(frame.Decode(0, 1, &out), "expected 0 inputs, got 2"));
}

TEST(DecodeCallBuffers, Float8BuffersDecodeAsTheirBytes) {
  // fp8 in, fp8 out: kernels get uint8 views of the same shape and address.
  FakeFrame frame;
  frame.AddInput(ffi::DataType::F8E4M3FN, FakeDevicePtr(1), {3, 5});
  frame.AddOutput(ffi::DataType::F8E5M2, FakeDevicePtr(2), {7});
  std::vector<BufferView> out;
  ASSERT_TRUE(Succeeds(frame.Decode(1, 1, &out)));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].dtype, ffi::DataType::U8);
  EXPECT_EQ(out[0].data, FakeDevicePtr(1));
  EXPECT_EQ(out[0].rank, 2);
  EXPECT_EQ(out[0].nbytes, 15u);
  EXPECT_EQ(out[1].dtype, ffi::DataType::U8);
  EXPECT_EQ(out[1].nbytes, 7u);
}

TEST(DecodeCallBuffers, WrongOutputCountIsRejected) {
  FakeFrame frame;
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {1});
  frame.AddOutput(ffi::DataType::F32, FakeDevicePtr(2), {1});
  std::vector<BufferView> out(4);
  EXPECT_TRUE(Fails(frame.Decode(1, 2, &out), "expected 2 outputs, got 1"));
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(Fails(frame.Decode(1, 0, &out), "expected 0 outputs, got 1"));
}

TEST(DecodeCallBuffers, ErrorsNameTheBuffer) {
  {
    FakeFrame frame;
    frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {1});
    frame.AddInput(ffi::DataType::S4, FakeDevicePtr(2), {1});
    std::vector<BufferView> out;
    EXPECT_TRUE(Fails(frame.Decode(2, 0, &out),
                      "input 1: unsupported XLA element type code 21"));
  }
  {
    // Outputs are numbered from 0, not after the inputs.
    FakeFrame frame;
    frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {1});
    frame.AddInput(ffi::DataType::F32, FakeDevicePtr(2), {1});
    frame.AddOutput(ffi::DataType::F32, FakeDevicePtr(3), {1});
    frame.AddOutput(ffi::DataType::F32, nullptr, {2, 2});
    std::vector<BufferView> out;
    EXPECT_TRUE(Fails(frame.Decode(2, 2, &out), "output 1: null data"));
  }
}

TEST(DecodeCallBuffers, TokenBufferIsRejected) {
  // XLA passes tokens as buffers of element type TOKEN; they carry no data a
  // kernel could use.
  FakeFrame frame;
  frame.AddInput(ffi::DataType::TOKEN, nullptr, {});
  std::vector<BufferView> out;
  EXPECT_TRUE(Fails(frame.Decode(1, 0, &out), "input 0: unsupported"));
  EXPECT_TRUE(Fails(frame.Decode(1, 0, &out), "code 17"));
}

TEST(DecodeCallBuffers, MalformedBufferFieldsAreRejected) {
  const std::vector<int64_t> ones(40, 1);
  struct Case {
    const char* name;
    void (*mutate)(XLA_FFI_Buffer*, const int64_t* ones);
    const char* needle;
  };
  const Case cases[] = {
      {"negative dim",
       [](XLA_FFI_Buffer* b, const int64_t*) { b->dims[1] = -3; },
       "input 0: dimension 1 is negative"},
      {"null dims",
       [](XLA_FFI_Buffer* b, const int64_t*) { b->dims = nullptr; },
       "input 0: null dimensions"},
      {"rank 33",
       [](XLA_FFI_Buffer* b, const int64_t* ones) {
         b->rank = 33;
         b->dims = const_cast<int64_t*>(ones);
       },
       "input 0: rank 33"},
      // The dims pointer is bogus: only the rank check stands between it and
      // a read.
      {"negative rank",
       [](XLA_FFI_Buffer* b, const int64_t*) {
         b->rank = -1;
         b->dims = static_cast<int64_t*>(FakeDevicePtr(7));
       },
       "input 0: rank -1"},
      {"overflow",
       [](XLA_FFI_Buffer* b, const int64_t*) {
         b->dims[0] = kInt64Max;
         b->dims[1] = kInt64Max;
       },
       "input 0: byte size overflows"},
      {"null data",
       [](XLA_FFI_Buffer* b, const int64_t*) { b->data = nullptr; },
       "input 0: null data"},
      {"garbage dtype",
       [](XLA_FFI_Buffer* b, const int64_t*) {
         // Unassigned but inside the C enum's range (0..63), so storing it
         // is well defined.
         b->dtype = static_cast<XLA_FFI_DataType>(50);
       },
       "input 0: unsupported XLA element type code 50"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FakeFrame frame;
    c.mutate(frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {2, 3}),
             ones.data());
    frame.AddOutput(ffi::DataType::F32, FakeDevicePtr(2), {2, 3});
    std::vector<BufferView> out;
    EXPECT_TRUE(Fails(frame.Decode(1, 1, &out), c.needle));
  }
}

TEST(DecodeCallBuffers, NonBufferArgumentIsRejected) {
  // XLA_FFI_ArgType has only BUFFER (1) today; anything else (a kind added
  // by a newer XLA, or a corrupt frame) must be refused, and its pointer,
  // here null, never read as a buffer. 0 is the only other value the C enum
  // can hold without the test itself being undefined behaviour in C++ (its
  // range is that of a 1-bit field), which UBSan's enum check would flag.
  FakeFrame frame;
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {1});
  frame.AddRawInput(static_cast<XLA_FFI_ArgType>(0), nullptr);
  frame.AddOutput(ffi::DataType::F32, FakeDevicePtr(2), {1});
  std::vector<BufferView> out;
  EXPECT_TRUE(Fails(frame.Decode(2, 1, &out), "input 1 is not a buffer"));
}

TEST(DecodeCallBuffers, NonBufferResultIsRejected) {
  FakeFrame frame;
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(1), {1});
  frame.AddRawOutput(static_cast<XLA_FFI_RetType>(0), nullptr);
  std::vector<BufferView> out;
  EXPECT_TRUE(Fails(frame.Decode(1, 1, &out), "output 0 is not a buffer"));
}

TEST(DecodeCallBuffers, RespectsRemainingOffsets) {
  // Handlers that bind leading arguments explicitly pass the rest on; counts
  // and error indices are relative to what remains.
  FakeFrame frame;
  frame.AddInput(ffi::DataType::S32, FakeDevicePtr(1), {1});
  frame.AddInput(ffi::DataType::F32, FakeDevicePtr(2), {5});
  frame.AddOutput(ffi::DataType::F64, FakeDevicePtr(3), {1});
  frame.AddOutput(ffi::DataType::F64, FakeDevicePtr(4), {6});
  std::vector<BufferView> out;
  ASSERT_TRUE(
      Succeeds(DecodeCallBuffers(frame.Args(1), frame.Rets(1), 1, 1, &out)));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].data, FakeDevicePtr(2));
  EXPECT_EQ(out[0].element_count, 5);
  EXPECT_EQ(out[1].data, FakeDevicePtr(4));
  EXPECT_EQ(out[1].element_count, 6);
  EXPECT_TRUE(Fails(DecodeCallBuffers(frame.Args(1), frame.Rets(1), 2, 1, &out),
                    "expected 2 inputs, got 1"));
  ASSERT_TRUE(
      Succeeds(DecodeCallBuffers(frame.Args(2), frame.Rets(2), 0, 0, &out)));
  EXPECT_TRUE(out.empty());
}

TEST(DecodeCallBuffers, ReusedVectorKeepsItsStorage) {
  FakeFrame big;
  for (int i = 0; i < 6; ++i) {
    big.AddInput(ffi::DataType::F32, FakeDevicePtr(i + 1), {i + 1});
  }
  big.AddOutput(ffi::DataType::F32, FakeDevicePtr(10), {3});
  FakeFrame small;
  small.AddInput(ffi::DataType::S8, FakeDevicePtr(20), {2});
  small.AddOutput(ffi::DataType::S8, FakeDevicePtr(21), {2});

  std::vector<BufferView> out;
  ASSERT_TRUE(Succeeds(big.Decode(6, 1, &out)));
  ASSERT_EQ(out.size(), 7u);
  const BufferView* storage = out.data();
  const size_t capacity = out.capacity();

  ASSERT_TRUE(Succeeds(small.Decode(1, 1, &out)));
  ASSERT_EQ(out.size(), 2u);  // nothing left over from the bigger frame
  EXPECT_EQ(out[0].data, FakeDevicePtr(20));
  EXPECT_EQ(out[1].data, FakeDevicePtr(21));
  EXPECT_EQ(out.data(), storage);
  EXPECT_EQ(out.capacity(), capacity);

  ASSERT_TRUE(Succeeds(big.Decode(6, 1, &out)));
  EXPECT_EQ(out.size(), 7u);
  EXPECT_EQ(out.data(), storage);
  EXPECT_EQ(out.capacity(), capacity);
  EXPECT_EQ(out[6].data, FakeDevicePtr(10));
}

}  // namespace

// A partitioned call's buffers carry unit axes numbax added for XLA's batch
// partitioner (src/numbax/trace/sharding_rules.py): dropped from the views
// only.
namespace units {

BufferView View(const int64_t* dims, int64_t rank) {
  BufferView v;
  v.data = FakeDevicePtr(1);
  v.dtype = ffi::DataType::F32;
  v.dims = dims;
  v.rank = rank;
  return v;
}

TEST(DropUnitAxes, NothingToDropLeavesTheViews) {
  const int64_t dims[] = {4, 3};
  std::vector<BufferView> buffers = {View(dims, 2)};
  EXPECT_TRUE(numbax::DropUnitAxes({}, {}, &buffers).success());
  EXPECT_EQ(buffers[0].dims, dims);
  EXPECT_EQ(buffers[0].rank, 2);
}

TEST(DropUnitAxes, LeadingAndTrailingUnitAxesAreDropped) {
  const int64_t split[] = {1, 1, 8, 5, 1};  // 2 leading, 1 trailing
  const int64_t whole[] = {5};
  std::vector<BufferView> buffers = {View(split, 5), View(whole, 1)};
  EXPECT_TRUE(numbax::DropUnitAxes({2, 0}, {1, 0}, &buffers).success());
  EXPECT_EQ(buffers[0].dims, split + 2);
  EXPECT_EQ(buffers[0].rank, 2);
  EXPECT_EQ(buffers[0].dims[0], 8);
  EXPECT_EQ(buffers[1].dims, whole);
  EXPECT_EQ(buffers[1].rank, 1);
}

TEST(DropUnitAxes, MissingUnitAxesFailWithoutChangingAnything) {
  const int64_t a[] = {1, 8};
  const int64_t b[] = {2, 8};  // not a unit axis
  std::vector<BufferView> buffers = {View(a, 2), View(b, 2)};
  const ffi::Error err = numbax::DropUnitAxes({1, 1}, {}, &buffers);
  ASSERT_TRUE(err.failure());
  EXPECT_NE(err.message().find("buffer 1"), std::string::npos);
  EXPECT_EQ(buffers[0].dims, a);  // the first was not touched either
  EXPECT_EQ(buffers[0].rank, 2);
}

TEST(DropUnitAxes, CountsMustMatchTheBuffers) {
  const int64_t a[] = {1, 8};
  std::vector<BufferView> buffers = {View(a, 2)};
  EXPECT_TRUE(numbax::DropUnitAxes({1, 0}, {}, &buffers).failure());
  EXPECT_TRUE(numbax::DropUnitAxes({}, {0, 0}, &buffers).failure());
  EXPECT_TRUE(numbax::DropUnitAxes({3}, {}, &buffers).failure());  // > rank
}

}  // namespace units

// A sequential vmap's call (src/numbax/callable/vmap.py): func runs once per
// slice, on views of slice s of the sliced buffers and the others whole.
namespace slices {

BufferView View(void* data, const int64_t* dims, int64_t rank,
                int64_t elements) {
  BufferView v;
  v.data = data;
  v.dtype = ffi::DataType::F32;
  v.dims = dims;
  v.rank = rank;
  v.element_count = elements;
  v.nbytes = static_cast<size_t>(elements) * 4;
  return v;
}

TEST(SliceCount, TheBatchIsAxis0OfTheFirstSlicedOutput) {
  const int64_t x[] = {5, 3};  // input, sliced
  const int64_t w[] = {7};     // input, whole
  const int64_t out[] = {5, 3};
  const int64_t tmp[] = {3};  // scratch, whole
  std::vector<BufferView> buffers = {
      View(FakeDevicePtr(1), x, 2, 15), View(FakeDevicePtr(2), w, 1, 7),
      View(FakeDevicePtr(3), out, 2, 15), View(FakeDevicePtr(4), tmp, 1, 3)};
  int64_t batch = -1;
  ASSERT_TRUE(numbax::SliceCount(buffers, {1, 0, 1, 0}, 2, &batch).success());
  EXPECT_EQ(batch, 5);
  // Nothing sliced: one call with every buffer whole.
  ASSERT_TRUE(numbax::SliceCount(buffers, {0, 0, 0, 0}, 2, &batch).success());
  EXPECT_EQ(batch, 1);
}

TEST(SliceCount, EverySlicedBufferMustHoldTheBatch) {
  const int64_t five[] = {5, 3};
  const int64_t four[] = {4, 3};
  std::vector<BufferView> buffers = {View(FakeDevicePtr(1), four, 2, 12),
                                     View(FakeDevicePtr(2), five, 2, 15)};
  int64_t batch = 0;
  ffi::Error err = numbax::SliceCount(buffers, {1, 1}, 1, &batch);
  ASSERT_TRUE(err.failure());
  EXPECT_NE(err.message().find("buffer 0"), std::string::npos);
  EXPECT_NE(err.message().find("5 slices"), std::string::npos);
  // A 0-d sliced buffer has no axis of slices.
  std::vector<BufferView> scalar = {View(FakeDevicePtr(1), nullptr, 0, 1)};
  EXPECT_TRUE(numbax::SliceCount(scalar, {1}, 0, &batch).failure());
  // One flag per buffer.
  EXPECT_TRUE(numbax::SliceCount(buffers, {1}, 1, &batch).failure());
}

TEST(SelectSlice, SlicedBuffersAdvanceWholeOnesStay) {
  const int64_t x[] = {4, 2, 3};  // 4 slices of 2 x 3 float32 (24 bytes)
  const int64_t w[] = {6};
  auto* base = static_cast<char*>(FakeDevicePtr(1));
  std::vector<BufferView> buffers = {View(base, x, 3, 24),
                                     View(FakeDevicePtr(2), w, 1, 6)};
  std::vector<BufferView> views;
  std::vector<int64_t> offsets;
  numbax::SelectSlice(buffers, {1, 0}, 4, 3, &views, &offsets);
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].data, base + 3 * 24);
  EXPECT_EQ(views[0].dims, x + 1);  // the buffer's own extents, no copy
  EXPECT_EQ(views[0].rank, 2);
  EXPECT_EQ(views[0].element_count, 6);
  EXPECT_EQ(views[0].nbytes, 24u);
  EXPECT_EQ(views[1].data, FakeDevicePtr(2));
  EXPECT_EQ(views[1].rank, 1);
  EXPECT_EQ(views[1].nbytes, 24u);
  EXPECT_EQ(offsets, (std::vector<int64_t>{72, 0}));
  // Slice 0 starts at the buffer.
  numbax::SelectSlice(buffers, {1, 0}, 4, 0, &views, &offsets);
  EXPECT_EQ(views[0].data, base);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 0}));
}

}  // namespace slices
