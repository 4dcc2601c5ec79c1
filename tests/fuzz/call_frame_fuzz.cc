// libFuzzer harness for csrc/call_frame.cc: XLA call frames built from
// arbitrary bytes (argument and result types, dtypes, ranks, dimensions,
// null pointers, expected counts) through DecodeBuffer and
// DecodeCallBuffers. The decoder must reject what it cannot describe
// without ever reading through a data pointer (those here are fake device
// addresses: a host read faults), and what it accepts must be consistent:
// every decoded view is then packed into kernel parameters as the kernel
// handler does.
//
//   bash scripts/fuzz.sh            # builds and runs every harness
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "call_frame.h"
#include "fuzz_input.h"
#include "kernel_args.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace {

namespace ffi = ::xla::ffi;
using numbax::BufferView;
using numbax_fuzz::FakeDevicePtr;
using numbax_fuzz::FuzzInput;

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct Frame {
  std::deque<std::vector<int64_t>> dims;
  std::deque<XLA_FFI_Buffer> buffers;
  std::vector<XLA_FFI_ArgType> arg_types;
  std::vector<void*> arg_ptrs;
  std::vector<XLA_FFI_RetType> ret_types;
  std::vector<void*> ret_ptrs;
  XLA_FFI_Buffer blank{};  // what a non-buffer argument points at
};

XLA_FFI_Buffer* MakeBuffer(FuzzInput& in, Frame& f) {
  // Any code XLA_FFI_DataType can represent (its values fit in 6 bits), the
  // defined ones (0-33) most often. Codes outside the enum's range cannot
  // come from XLA, and loading them is undefined in XLA's own header.
  const uint8_t dtype = in.Byte() % 4 == 0 ? in.Byte() % 64 : in.Byte() % 34;
  void* data = in.Byte() % 8 == 0 ? nullptr : FakeDevicePtr(in.Byte());
  int64_t rank;
  switch (in.Byte() % 8) {
    case 0:
      rank = in.Take<int64_t>();
      break;  // anything at all
    case 1:
      rank = -static_cast<int64_t>(in.Byte() % 3);
      break;
    case 2:
      rank = 30 + in.Byte() % 8;
      break;  // around the limit
    default:
      rank = in.Byte() % 5;
  }
  // XLA's dims hold exactly `rank` entries. For ranks the decoder must
  // refuse, fewer are allocated (capped): reading past them is a heap
  // overflow that AddressSanitizer reports.
  const size_t allocated =
      rank <= 0 ? 0 : static_cast<size_t>(rank < 40 ? rank : 40);
  f.dims.emplace_back();
  for (size_t i = 0; i < allocated; ++i) f.dims.back().push_back(in.Dim());
  const bool null_dims = in.Byte() % 16 == 0 || allocated == 0;
  f.buffers.push_back(XLA_FFI_Buffer{
      XLA_FFI_Buffer_STRUCT_SIZE, nullptr, static_cast<XLA_FFI_DataType>(dtype),
      data, rank, null_dims ? nullptr : f.dims.back().data()});
  return &f.buffers.back();
}

void CheckView(const BufferView& v) {
  const numbax::DTypeInfo* info = numbax::LookupDType(v.dtype);
  CHECK(info != nullptr);
  CHECK(v.rank >= 0 && v.rank <= numbax::kMaxRank);
  CHECK(v.rank == 0 || v.dims != nullptr);
  int64_t count = 1;
  for (int64_t i = 0; i < v.rank; ++i) {
    CHECK(v.dims[i] >= 0);
    count *= v.dims[i];  // cannot overflow: the decoder checked
  }
  CHECK(count == v.element_count);
  CHECK(v.nbytes == static_cast<size_t>(count) * info->itemsize);
  CHECK((v.nbytes == 0) == (v.data == nullptr));
}

void Pack(const std::vector<BufferView>& views, FuzzInput& in) {
  numbax::KernelArgs args;
  size_t words = 0;
  for (const BufferView& v : views) {
    const size_t itemsize = numbax::LookupDType(v.dtype)->itemsize;
    args.AddArray(v.data, v.dims, v.rank, itemsize);
    words += 5 + 2 * static_cast<size_t>(v.rank);
    // The handler's batched (vmap) launch: one slice of axis 0 per launch.
    const int64_t batch = in.Byte() % 4;
    if (batch > 0) {
      for (int64_t s = 0; s < batch; ++s) {
        if (numbax::AddBatchSlice(v, batch, s, in.Bool(), &args)) {
          words += 5 + 2 * static_cast<size_t>(v.rank - 1);
        }
      }
    }
  }
  CHECK(args.size() == words);
  void** params = args.params();
  for (size_t i = 0; i < args.size(); ++i) {
    CHECK(params[i] == &args.words()[i]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  Frame f;
  const size_t n_args = in.Byte() % 6;
  const size_t n_rets = in.Byte() % 5;
  for (size_t i = 0; i < n_args; ++i) {
    if (in.Byte() % 10 == 0) {  // not a buffer (0: the enum's only other value)
      f.arg_types.push_back(static_cast<XLA_FFI_ArgType>(0));
      f.arg_ptrs.push_back(&f.blank);
    } else {
      f.arg_types.push_back(XLA_FFI_ArgType_BUFFER);
      f.arg_ptrs.push_back(MakeBuffer(in, f));
    }
  }
  for (size_t i = 0; i < n_rets; ++i) {
    if (in.Byte() % 10 == 0) {
      f.ret_types.push_back(static_cast<XLA_FFI_RetType>(0));
      f.ret_ptrs.push_back(&f.blank);
    } else {
      f.ret_types.push_back(XLA_FFI_RetType_BUFFER);
      f.ret_ptrs.push_back(MakeBuffer(in, f));
    }
  }
  XLA_FFI_Args args{XLA_FFI_Args_STRUCT_SIZE, nullptr,
                    static_cast<int64_t>(n_args), f.arg_types.data(),
                    f.arg_ptrs.data()};
  XLA_FFI_Rets rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr,
                    static_cast<int64_t>(n_rets), f.ret_types.data(),
                    f.ret_ptrs.data()};
  const size_t arg_offset = in.Byte() % (n_args + 1);
  const size_t ret_offset = in.Byte() % (n_rets + 1);
  ffi::RemainingArgs remaining_args(&args, arg_offset);
  ffi::RemainingRets remaining_rets(&rets, ret_offset);
  auto expected = [&in](size_t actual) -> int64_t {
    switch (in.Byte() % 4) {
      case 0:
        return -1;
      case 1:
        return static_cast<int64_t>(in.Byte() % 8);
      default:
        return static_cast<int64_t>(actual);
    }
  };
  const int64_t expected_in = expected(n_args - arg_offset);
  const int64_t expected_out = expected(n_rets - ret_offset);

  std::vector<BufferView> views(in.Byte() % 3);  // stale entries: cleared
  ffi::Error err = numbax::DecodeCallBuffers(remaining_args, remaining_rets,
                                             expected_in, expected_out, &views);
  if (err.failure()) {
    CHECK(!err.message().empty());
    CHECK(views.size() <= n_args + n_rets);
  } else {
    CHECK(views.size() == (n_args - arg_offset) + (n_rets - ret_offset));
    for (const BufferView& v : views) CheckView(v);
    Pack(views, in);
  }

  // DecodeBuffer alone, on the first buffer's raw fields.
  if (!f.buffers.empty()) {
    const XLA_FFI_Buffer& b = f.buffers.front();
    BufferView view;
    ffi::Error one =
        numbax::DecodeBuffer(static_cast<ffi::DataType>(b.dtype), b.data,
                             b.dims, b.rank, "input 0", &view);
    if (one.success()) CheckView(view);
  }
  return 0;
}
