// Kernel parameters in Numba's ABI, packed for cuLaunchKernel.
//
// Numba passes each array argument as 5 + 2*ndim separate 8-byte parameters:
// meminfo (0), parent (0), nitems, itemsize, data pointer, shape[ndim] and
// strides[ndim] in bytes. numbax's buffers are C-contiguous.
//
// numba-cuda-mlir lowers each array to an MLIR memref instead, expanded by
// MLIR's LLVM lowering into 3 + 2*ndim parameters: allocated pointer, aligned
// pointer, offset in elements, sizes[ndim] and strides[ndim] in elements.
// KernelArgs packs either, chosen per parameter list (Reset).
//
// A Python or NumPy scalar given to a numba_cuda_kernel is a parameter of its
// own, passed by value (ScalarParam): its C type in one 8-byte word, or two
// for a complex, at its position among the kernel's parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "call_frame.h"

namespace numbax {

// Which compiler's array parameters a kernel expects. The values are part
// of numbax._core.LoadedKernel's `abi` field: keep them stable.
enum class ArrayAbi : int {
  kNumba = 0,   // numba-cuda: 5 + 2*rank words, strides in bytes
  kMemref = 1,  // numba-cuda-mlir: 3 + 2*rank words, strides in elements
};

// The number of parameter words one array of `rank` takes under `abi`.
inline int64_t ArrayWords(ArrayAbi abi, int64_t rank) {
  return (abi == ArrayAbi::kMemref ? 3 : 5) + 2 * rank;
}

// A scalar kernel parameter passed by value: where it goes among the
// kernel's parameters (inputs, then outputs, in the kernel's order) and its
// words as Numba's launch packs it (MakeScalarParam). Fixed for a call site:
// the value is part of the op's key.
struct ScalarParam {
  int64_t position = 0;
  int num_words = 0;  // 1, or 2 for a complex (real, then imaginary part)
  int64_t words[2] = {0, 0};
};

// Packs a scalar of NumPy kind `kind` ('b' bool, 'i' signed or 'u' unsigned
// integer, 'f' float, 'c' complex) held in `size` bytes at `bytes` (the
// host's order, as NumPy stores it) as Numba's launch passes it: its own C
// type in the low bytes of one word (a bool as one byte, 0 or 1; a float16
// as its 16 bits), a complex as two words, the real part's C type each.
// The driver reads each parameter's own size from the start of its word.
// Returns an empty string, or why the kind and size make no parameter.
std::string MakeScalarParam(int64_t position, char kind, const void* bytes,
                            size_t size, ScalarParam* out);

class KernelArgs {
 public:
  // Starts a new parameter list whose arrays are packed in `abi`; keeps
  // capacity, so steady-state packing allocates nothing.
  void Reset(ArrayAbi abi = ArrayAbi::kNumba);
  ArrayAbi abi() const { return abi_; }

  // Appends one array. `data` may differ from view.data (a slice of a
  // batched buffer); `dims`/`rank` describe the array the kernel sees.
  void AddArray(void* data, const int64_t* dims, int64_t rank, size_t itemsize);

  // Appends one array with explicit byte strides (a view: a slice or a
  // reshape of a buffer), as Numba packs it (a memref gets them in elements:
  // every stride must then be a multiple of itemsize, as any array view's
  // is).
  void AddStridedArray(void* data, const int64_t* dims, const int64_t* strides,
                       int64_t rank, size_t itemsize);

  // Appends one scalar parameter, held in an 8-byte word: the driver reads
  // the parameter's own size from the word's start (its low bytes).
  void AddWord(int64_t word) { words_.push_back(word); }

  // Appends a scalar parameter's words.
  void AddScalar(const ScalarParam& scalar) {
    for (int i = 0; i < scalar.num_words; ++i) AddWord(scalar.words[i]);
  }

  // The kernelParams array for cuLaunchKernel: one pointer per 8-byte word.
  // Valid until the next Reset/AddArray.
  void** params();

  size_t size() const { return words_.size(); }
  const std::vector<int64_t>& words() const { return words_; }

  // Overwrites word `index` in place (the pointers params() returned stay
  // valid: the words do not move).
  void SetWord(size_t index, int64_t word) { words_[index] = word; }

 private:
  // meminfo, parent, nitems, itemsize, data, shape[rank]: every array's
  // words before its strides.
  void AddHeader(void* data, const int64_t* dims, int64_t rank,
                 size_t itemsize);
  // allocated pointer, aligned pointer, offset (0: numbax passes the
  // array's own start as both pointers), sizes[rank].
  void AddMemrefHeader(void* data, const int64_t* dims, int64_t rank);

  ArrayAbi abi_ = ArrayAbi::kNumba;
  std::vector<int64_t> words_;
  std::vector<void*> params_;
};

// Numba's layout for a device array of this geometry ('C', 'F' or 'A'),
// computed as numba-cuda's dummyarray flags and DeviceNDArray._numba_type_
// do, or 0 where numbax does not decide: an empty array, or one with a unit
// extent that is not strictly C-contiguous (contiguity rules have corner
// cases there). The fast launch path keys plans on it, so a wrong answer
// would launch a kernel compiled for another layout: it must be exact
// where it answers (tests/test_fast_launch.py compares it with Numba's).
char NumbaArrayLayout(const int64_t* dims, const int64_t* strides, int64_t rank,
                      int64_t itemsize);

// Appends the kernel's parameters: buffer i through add_buffer(i) (false:
// stop, returning false), in order, with each of `scalars` (sorted by
// position) at its position among them. Allocates nothing.
template <typename AddBuffer>
bool AddParams(const std::vector<ScalarParam>& scalars, size_t num_buffers,
               KernelArgs* args, AddBuffer&& add_buffer) {
  size_t s = 0;
  for (size_t b = 0; b < num_buffers; ++b) {
    while (s < scalars.size() &&
           scalars[s].position == static_cast<int64_t>(b + s)) {
      args->AddScalar(scalars[s++]);
    }
    if (!add_buffer(b)) return false;
  }
  for (; s < scalars.size(); ++s) args->AddScalar(scalars[s]);
  return true;
}

// Whether `scalars` can sit among `num_buffers` buffers: positions strictly
// increasing, each before the end of the parameter list. Returns an empty
// string, or why not.
std::string CheckScalarPositions(const std::vector<ScalarParam>& scalars,
                                 int64_t num_params);

// Appends slice `index` of a buffer batched along axis 0 for a vmapped
// launch of `batch` slices: the kernel sees the remaining axes, at the
// slice's address. With `reuse` (a broadcast input) every index gets slice
// 0. Returns false, appending nothing, when the buffer cannot be sliced so
// (rank 0, an unknown dtype, or not `batch` slices; `reuse` needs >= 1):
// launching then would read or write outside it.
bool AddBatchSlice(const BufferView& view, int64_t batch, int64_t index,
                   bool reuse, KernelArgs* args);

// Appends slices [start, start + count) of a buffer batched along axis 0,
// as one array of `count` slices (the kernel keeps the batch axis), for a
// folded launch. With `reuse` (a broadcast input) the array is slice 0 with
// a batch axis of 1. Returns false, appending nothing, when the buffer
// cannot be sliced so (see AddBatchSlice).
bool AddBatchChunk(const BufferView& view, int64_t batch, int64_t start,
                   int64_t count, bool reuse, KernelArgs* args);

// The parameters of every per-slice launch of a batched call that does not
// fold: packed once, for slice 0, and moved from slice to slice by
// rewriting only the data pointer of each buffer that is not broadcast
// (its slice size further on). Everything else (shapes, strides, the
// parameter pointers handed to cuLaunchKernel) is the same for every
// slice, so a launch costs the driver call and a few stores. The driver
// copies the parameters when a launch is issued (or recorded into a
// graph), so rewriting them for the next slice never changes an issued
// launch.
class SliceParams {
 public:
  // Packs slice 0 of every buffer of a batch of `batch` slices (slice 0
  // for good for a `broadcast` input). Returns false, with `*bad` set to
  // the first buffer that cannot be sliced so (see AddBatchSlice).
  // Arrays are packed in `abi` (a memref moves both of its pointers);
  // `scalars` sit at their positions, the same for every slice.
  bool Pack(const std::vector<BufferView>& buffers, int64_t batch,
            const std::vector<uint8_t>& broadcast, ArrayAbi abi, size_t* bad,
            const std::vector<ScalarParam>& scalars = {});

  // Points every per-slice buffer at slice `index` (0 <= index < batch).
  void Select(int64_t index);

  void** params() { return params_; }
  const KernelArgs& args() const { return args_; }

 private:
  struct Moving {
    size_t word;     // the data pointer's word in args_
    uintptr_t base;  // slice 0's address
    size_t stride;   // bytes per slice
  };
  KernelArgs args_;
  std::vector<Moving> moving_;
  void** params_ = nullptr;
};

}  // namespace numbax
