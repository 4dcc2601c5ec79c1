#include "kernel_args.h"

#include <cstring>

namespace numbax {

// Scalars are packed into the low bytes of 8-byte words.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "scalar kernel parameters are packed for little-endian hosts");

std::string MakeScalarParam(int64_t position, char kind, const void* bytes,
                            size_t size, ScalarParam* out) {
  if (position < 0) return "a scalar's position must be >= 0";
  if (bytes == nullptr && size != 0) return "a scalar has no bytes";
  ScalarParam p;
  p.position = position;
  switch (kind) {
    case 'b':
      if (size != 1) return "a bool scalar takes 1 byte";
      // Numba's boolean parameter is one byte holding 0 or 1.
      p.words[0] = *static_cast<const unsigned char*>(bytes) != 0 ? 1 : 0;
      p.num_words = 1;
      break;
    case 'i':
    case 'u':
      if (size != 1 && size != 2 && size != 4 && size != 8) {
        return "an integer scalar takes 1, 2, 4 or 8 bytes";
      }
      std::memcpy(&p.words[0], bytes, size);
      p.num_words = 1;
      break;
    case 'f':
      if (size != 2 && size != 4 && size != 8) {
        return "a float scalar takes 2, 4 or 8 bytes";
      }
      std::memcpy(&p.words[0], bytes, size);
      p.num_words = 1;
      break;
    case 'c':
      if (size != 8 && size != 16) {
        return "a complex scalar takes 8 or 16 bytes";
      }
      // Numba passes the real and the imaginary part as two parameters.
      std::memcpy(&p.words[0], bytes, size / 2);
      std::memcpy(&p.words[1], static_cast<const char*>(bytes) + size / 2,
                  size / 2);
      p.num_words = 2;
      break;
    default:
      return std::string("unknown scalar kind '") + kind +
             "' (expected b, i, u, f or c)";
  }
  *out = p;
  return "";
}

std::string CheckScalarPositions(const std::vector<ScalarParam>& scalars,
                                 int64_t num_params) {
  int64_t last = -1;
  for (const ScalarParam& s : scalars) {
    if (s.position <= last) {
      return "scalar positions must be strictly increasing";
    }
    if (s.position >= num_params) {
      return "a scalar's position is past the kernel's parameters";
    }
    if (s.num_words < 1 || s.num_words > 2) {
      return "a scalar takes 1 or 2 words";
    }
    last = s.position;
  }
  return "";
}

void KernelArgs::Reset(ArrayAbi abi) {
  words_.clear();
  abi_ = abi;
}

void KernelArgs::AddMemrefHeader(void* data, const int64_t* dims,
                                 int64_t rank) {
  const int64_t address =
      static_cast<int64_t>(reinterpret_cast<intptr_t>(data));
  words_.push_back(address);  // allocated pointer
  words_.push_back(address);  // aligned pointer
  words_.push_back(0);        // offset, in elements
  for (int64_t i = 0; i < rank; ++i) words_.push_back(dims[i]);
}

void KernelArgs::AddHeader(void* data, const int64_t* dims, int64_t rank,
                           size_t itemsize) {
  int64_t count = 1;
  for (int64_t i = 0; i < rank; ++i) count *= dims[i];
  words_.push_back(0);  // meminfo
  words_.push_back(0);  // parent
  words_.push_back(count);
  words_.push_back(static_cast<int64_t>(itemsize));
  words_.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(data)));
  for (int64_t i = 0; i < rank; ++i) words_.push_back(dims[i]);
}

void KernelArgs::AddArray(void* data, const int64_t* dims, int64_t rank,
                          size_t itemsize) {
  const bool memref = abi_ == ArrayAbi::kMemref;
  if (memref) {
    AddMemrefHeader(data, dims, rank);
  } else {
    AddHeader(data, dims, rank, itemsize);
  }
  // C-contiguous strides, innermost last: in bytes for Numba, in elements
  // for a memref.
  const size_t first_stride = words_.size();
  words_.resize(first_stride + static_cast<size_t>(rank));
  int64_t stride = memref ? 1 : static_cast<int64_t>(itemsize);
  for (int64_t i = rank - 1; i >= 0; --i) {
    words_[first_stride + static_cast<size_t>(i)] = stride;
    stride *= dims[i];
  }
}

void KernelArgs::AddStridedArray(void* data, const int64_t* dims,
                                 const int64_t* strides, int64_t rank,
                                 size_t itemsize) {
  if (abi_ == ArrayAbi::kMemref) {
    AddMemrefHeader(data, dims, rank);
    const int64_t size = itemsize ? static_cast<int64_t>(itemsize) : 1;
    for (int64_t i = 0; i < rank; ++i) words_.push_back(strides[i] / size);
    return;
  }
  AddHeader(data, dims, rank, itemsize);
  for (int64_t i = 0; i < rank; ++i) words_.push_back(strides[i]);
}

void** KernelArgs::params() {
  // Pointers are taken only once every word is in place, since growing the
  // word vector moves it.
  params_.resize(words_.size());
  for (size_t i = 0; i < words_.size(); ++i) params_[i] = &words_[i];
  return params_.data();
}

namespace {

// Where slices [start, start + count) of a batched view begin (slice 0 for
// every one when `reuse`: a broadcast input), and its dtype. False when the
// view is not a batch of `batch` slices, or the range is not inside it.
bool BatchStart(const BufferView& view, int64_t batch, int64_t start,
                int64_t count, bool reuse, const DTypeInfo** info,
                void** data) {
  *info = LookupDType(view.dtype);
  if (*info == nullptr || view.rank < 1 || view.dims == nullptr || batch < 1 ||
      start < 0 || count < 1 || start > batch - count) {
    return false;
  }
  const int64_t slices = view.dims[0];
  if (reuse ? slices < 1 : slices != batch) return false;
  const size_t slice_bytes = view.nbytes / static_cast<size_t>(slices);
  // Device addresses: integer arithmetic, never a host pointer's.
  const uintptr_t base = reinterpret_cast<uintptr_t>(view.data);
  const uintptr_t offset =
      reuse ? 0 : static_cast<uintptr_t>(start) * slice_bytes;
  *data = base ? reinterpret_cast<void*>(base + offset) : nullptr;
  return true;
}

}  // namespace

bool AddBatchSlice(const BufferView& view, int64_t batch, int64_t index,
                   bool reuse, KernelArgs* args) {
  const DTypeInfo* info;
  void* data;
  if (!BatchStart(view, batch, index, 1, reuse, &info, &data)) return false;
  args->AddArray(data, view.dims + 1, view.rank - 1, info->itemsize);
  return true;
}

bool AddBatchChunk(const BufferView& view, int64_t batch, int64_t start,
                   int64_t count, bool reuse, KernelArgs* args) {
  const DTypeInfo* info;
  void* data;
  if (view.rank > kMaxRank ||
      !BatchStart(view, batch, start, count, reuse, &info, &data)) {
    return false;
  }
  int64_t dims[kMaxRank];
  dims[0] = reuse ? 1 : count;
  for (int64_t i = 1; i < view.rank; ++i) dims[i] = view.dims[i];
  args->AddArray(data, dims, view.rank, info->itemsize);
  return true;
}

bool SliceParams::Pack(const std::vector<BufferView>& buffers, int64_t batch,
                       const std::vector<uint8_t>& broadcast, ArrayAbi abi,
                       size_t* bad, const std::vector<ScalarParam>& scalars) {
  args_.Reset(abi);
  moving_.clear();
  const bool packed = AddParams(scalars, buffers.size(), &args_, [&](size_t i) {
    const BufferView& view = buffers[i];
    const bool reuse = i < broadcast.size() && broadcast[i] != 0;
    const size_t first = args_.size();
    if (!AddBatchSlice(view, batch, 0, reuse, &args_)) {
      *bad = i;
      return false;
    }
    // AddBatchSlice checked dims[0] == batch >= 1 for a per-slice buffer.
    if (!reuse && batch > 1) {
      const size_t stride = view.nbytes / static_cast<size_t>(view.dims[0]);
      const uintptr_t base = reinterpret_cast<uintptr_t>(view.data);
      if (stride != 0 && view.data != nullptr) {
        if (abi == ArrayAbi::kMemref) {
          // The allocated and the aligned pointer (ArrayWords).
          moving_.push_back({first, base, stride});
          moving_.push_back({first + 1, base, stride});
        } else {
          // After meminfo, parent, nitems, itemsize: the data pointer.
          moving_.push_back({first + 4, base, stride});
        }
      }
    }
    return true;
  });
  if (!packed) return false;
  params_ = args_.params();
  return true;
}

void SliceParams::Select(int64_t index) {
  for (const Moving& m : moving_) {
    // Device addresses: integer arithmetic, never a host pointer's.
    const uintptr_t address = m.base + static_cast<uintptr_t>(index) * m.stride;
    args_.SetWord(m.word, static_cast<int64_t>(address));
  }
}

char NumbaArrayLayout(const int64_t* dims, const int64_t* strides, int64_t rank,
                      int64_t itemsize) {
  if (rank == 0) return 'C';
  bool unit = false, zero_stride = false;
  for (int64_t i = 0; i < rank; ++i) {
    if (dims[i] <= 0) return 0;  // empty (or invalid): not decided here
    unit |= dims[i] == 1;
    zero_stride |= strides[i] == 0;
  }
  // Strictly C-contiguous (every stride as C order gives it, unit extents
  // included) is C-contiguous for Numba too, and has no zero stride.
  bool c = true;
  int64_t sd = itemsize;
  for (int64_t i = rank - 1; i >= 0; --i) {
    if (strides[i] != sd) c = false;
    sd *= dims[i];
  }
  if (c) return 'C';
  // Numba skips unit extents when it checks contiguity: leave those to it.
  if (unit) return 0;
  // Without unit extents Numba's contiguity is the strict one; a zero
  // stride in a non-empty array is a broadcast, typed 'A'.
  if (zero_stride) return 'A';
  bool f = true;
  sd = itemsize;
  for (int64_t i = 0; i < rank; ++i) {
    if (strides[i] != sd) f = false;
    sd *= dims[i];
  }
  return f ? 'F' : 'A';
}

}  // namespace numbax
