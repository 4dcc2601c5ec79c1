// libFuzzer harness for csrc/kernel_args.cc: kernel parameters packed in
// Numba's array ABI from buffers of arbitrary rank, dimensions and item
// size, as DecodeBuffer produces them, whole (AddArray) and sliced for a
// vmapped launch (AddBatchSlice). Every word is checked against an
// independent computation in 128-bit arithmetic.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "call_frame.h"
#include "fuzz_input.h"
#include "kernel_args.h"

namespace {

namespace ffi = ::xla::ffi;
using numbax::BufferView;
using numbax::KernelArgs;
using numbax_fuzz::FakeDevicePtr;
using numbax_fuzz::FuzzInput;

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

const ffi::DataType kTypes[] = {
    ffi::DataType::PRED, ffi::DataType::S8,  ffi::DataType::S16,
    ffi::DataType::S32,  ffi::DataType::S64, ffi::DataType::U8,
    ffi::DataType::U16,  ffi::DataType::U32, ffi::DataType::U64,
    ffi::DataType::F16,  ffi::DataType::F32, ffi::DataType::F64,
    ffi::DataType::BF16, ffi::DataType::C64, ffi::DataType::C128};

// The words AddArray must append for (data, dims[0:rank], itemsize).
void CheckArray(const std::vector<int64_t>& words, size_t at, void* data,
                const int64_t* dims, int64_t rank, size_t itemsize) {
  CHECK(words.size() == at + 5 + 2 * static_cast<size_t>(rank));
  __int128 count = 1;
  for (int64_t i = 0; i < rank; ++i) count *= dims[i];
  CHECK(words[at] == 0 && words[at + 1] == 0);
  CHECK(words[at + 2] == count);
  CHECK(words[at + 3] == static_cast<int64_t>(itemsize));
  CHECK(words[at + 4] ==
        static_cast<int64_t>(reinterpret_cast<uintptr_t>(data)));
  __int128 stride = itemsize;
  for (int64_t i = rank - 1; i >= 0; --i) {
    CHECK(words[at + 5 + i] == dims[i]);
    CHECK(words[at + 5 + rank + i] == stride);
    stride *= dims[i];
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  KernelArgs args;
  const int buffers = 1 + in.Byte() % 4;
  std::vector<std::vector<int64_t>> shapes(buffers);
  for (int b = 0; b < buffers; ++b) {
    const ffi::DataType dtype = kTypes[in.Byte() % 15];
    const int64_t rank = in.Byte() % (numbax::kMaxRank + 1);
    std::vector<int64_t>& dims = shapes[b];
    for (int64_t i = 0; i < rank; ++i) dims.push_back(in.Dim());
    void* ptr = FakeDevicePtr(in.Byte());
    BufferView view;
    if (numbax::DecodeBuffer(dtype, ptr, dims.data(), rank, "input 0", &view)
            .failure()) {
      continue;  // not a buffer XLA could hand over: never packed
    }
    const size_t itemsize = numbax::LookupDType(dtype)->itemsize;
    size_t at = args.size();
    args.AddArray(view.data, view.dims, view.rank, itemsize);
    CheckArray(args.words(), at, view.data, view.dims, view.rank, itemsize);

    // Slices for a vmapped launch, with the batch the buffer was built for
    // (its axis 0) or another one.
    const int64_t batch =
        in.Bool() && view.rank > 0 ? view.dims[0] : in.Byte() % 5;
    const int64_t index = batch > 0 ? in.Byte() % batch : 0;
    const bool reuse = in.Bool();
    at = args.size();
    const bool ok = numbax::AddBatchSlice(view, batch, index, reuse, &args);
    const bool sliceable = view.rank >= 1 && batch >= 1 &&
                           (reuse ? view.dims[0] >= 1 : view.dims[0] == batch);
    CHECK(ok == sliceable);
    if (ok) {
      const uintptr_t slice = view.nbytes / static_cast<size_t>(view.dims[0]);
      const uintptr_t base = reinterpret_cast<uintptr_t>(view.data);
      void* expected =
          base ? reinterpret_cast<void*>(base + (reuse ? 0 : index * slice))
               : nullptr;
      CheckArray(args.words(), at, expected, view.dims + 1, view.rank - 1,
                 itemsize);
      // The slice lies inside the buffer.
      CHECK(reuse || (index + 1) * slice <= view.nbytes);
    } else {
      CHECK(args.size() == at);
    }
  }
  void** params = args.params();
  for (size_t i = 0; i < args.size(); ++i) {
    CHECK(params[i] == &args.words()[i]);
  }
  if (in.Bool()) {
    args.Reset();
    CHECK(args.size() == 0);
  }
  return 0;
}
