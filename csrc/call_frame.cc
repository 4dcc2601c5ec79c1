#include "call_frame.h"

#include <cstdio>
#include <limits>
#include <string>

namespace numbax {

const DTypeInfo* LookupDType(ffi::DataType dtype) {
  using T = ffi::DataType;
  static const DTypeInfo kBool{"bool", 1, T::PRED}, kI8{"int8", 1, T::S8},
      kI16{"int16", 2, T::S16}, kI32{"int32", 4, T::S32},
      kI64{"int64", 8, T::S64}, kU8{"uint8", 1, T::U8},
      kU16{"uint16", 2, T::U16}, kU32{"uint32", 4, T::U32},
      kU64{"uint64", 8, T::U64}, kF16{"float16", 2, T::F16},
      kF32{"float32", 4, T::F32}, kF64{"float64", 8, T::F64},
      kBF16{"bfloat16", 2, T::BF16}, kC64{"complex64", 8, T::C64},
      kC128{"complex128", 16, T::C128};
  switch (dtype) {
    case T::PRED:
      return &kBool;
    case T::S8:
      return &kI8;
    case T::S16:
      return &kI16;
    case T::S32:
      return &kI32;
    case T::S64:
      return &kI64;
    case T::U8:
    // Every 8-bit float XLA has (and the oldest supported jaxlib's headers
    // name): kernels get its bits as uint8, one byte per element.
    case T::F8E5M2:
    case T::F8E4M3:
    case T::F8E4M3FN:
    case T::F8E4M3B11FNUZ:
    case T::F8E5M2FNUZ:
    case T::F8E4M3FNUZ:
    case T::F8E3M4:
    case T::F8E8M0FNU:
      return &kU8;
    case T::U16:
      return &kU16;
    case T::U32:
      return &kU32;
    case T::U64:
      return &kU64;
    case T::F16:
      return &kF16;
    case T::F32:
      return &kF32;
    case T::F64:
      return &kF64;
    case T::BF16:
      return &kBF16;
    case T::C64:
      return &kC64;
    case T::C128:
      return &kC128;
    default:
      return nullptr;
  }
}

bool CheckBuffer(ffi::DataType dtype, void* data, const int64_t* dims,
                 int64_t rank, BufferView* out) {
  const DTypeInfo* info = LookupDType(dtype);
  if (info == nullptr || rank < 0 || rank > kMaxRank ||
      (rank > 0 && dims == nullptr)) {
    return false;
  }
  // The product of the non-zero extents, in bytes, bounds every byte stride
  // of the buffer, so it must fit even when a zero extent makes the buffer
  // empty (see DecodeBuffer). Overflow-checked multiplications, not
  // divisions: this runs for every buffer of every call.
  int64_t bytes = static_cast<int64_t>(info->itemsize);
  int64_t count = 1;  // cannot overflow where `bytes` did not
  bool empty = false;
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t d = dims[i];
    if (d < 0) return false;
    if (d == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(bytes, d, &bytes)) return false;
    count *= d;
  }
  const size_t nbytes = empty ? 0 : static_cast<size_t>(bytes);
  if (nbytes > 0 && data == nullptr) return false;
  out->data = nbytes > 0 ? data : nullptr;
  out->dtype = info->as;
  out->dims = dims;
  out->rank = rank;
  out->element_count = empty ? 0 : count;
  out->nbytes = nbytes;
  return true;
}

ffi::Error DecodeBuffer(ffi::DataType dtype, void* data, const int64_t* dims,
                        int64_t rank, const char* what, BufferView* out) {
  if (CheckBuffer(dtype, data, dims, rank, out)) return ffi::Error::Success();
  // Something is wrong: the same checks again, to say what.
  const DTypeInfo* info = LookupDType(dtype);
  if (info == nullptr) {
    return ffi::Error::InvalidArgument(
        std::string(what) + ": unsupported XLA element type code " +
        std::to_string(static_cast<int>(dtype)) +
        " (a sub-byte type, a token or a type numbax does not know)");
  }
  if (rank < 0 || rank > kMaxRank) {
    return ffi::Error::InvalidArgument(std::string(what) + ": rank " +
                                       std::to_string(rank) +
                                       " is outside [0, 32]");
  }
  if (rank > 0 && dims == nullptr) {
    return ffi::Error::InvalidArgument(std::string(what) +
                                       ": null dimensions for a ranked buffer");
  }
  const int64_t max_elements = std::numeric_limits<int64_t>::max() /
                               static_cast<int64_t>(info->itemsize);
  // The product of the non-zero extents bounds every byte stride of the
  // buffer, so it must fit even when a zero extent makes the buffer empty:
  // strides of a {0, 2^40, 2^40} float32 buffer would overflow (fuzzing
  // found this; tests/cpp/fuzz_regressions_test.cc).
  int64_t extents = 1;
  bool empty = false;
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t d = dims[i];
    if (d < 0) {
      return ffi::Error::InvalidArgument(std::string(what) + ": dimension " +
                                         std::to_string(i) + " is negative");
    }
    if (d == 0) {
      empty = true;
      continue;
    }
    if (extents > max_elements / d) {
      return ffi::Error::InvalidArgument(std::string(what) +
                                         ": byte size overflows");
    }
    extents *= d;
  }
  const int64_t count = empty ? 0 : extents;
  const size_t nbytes = static_cast<size_t>(count) * info->itemsize;
  if (nbytes > 0 && data == nullptr) {
    return ffi::Error::InvalidArgument(
        std::string(what) + ": null data pointer for a non-empty buffer");
  }
  out->data = nbytes > 0 ? data : nullptr;
  out->dtype = info->as;
  out->dims = dims;
  out->rank = rank;
  out->element_count = count;
  out->nbytes = nbytes;
  return ffi::Error::Success();
}

namespace {

// Arguments decode to AnyBuffer, results to Result<AnyBuffer>.
ffi::AnyBuffer Unwrap(const ffi::AnyBuffer& b) { return b; }
ffi::AnyBuffer Unwrap(ffi::Result<ffi::AnyBuffer> b) { return *b.operator->(); }

template <typename Remaining>
ffi::Error DecodeAll(const Remaining& list, const char* kind,
                     std::vector<BufferView>* out) {
  // The buffer's name ("argument 2") is formatted only for an error: this
  // runs for every buffer of every call.
  char what[48];
  auto name = [&](size_t i) {
    std::snprintf(what, sizeof(what), "%s %zu", kind, i);
    return what;
  };
  for (size_t i = 0; i < list.size(); ++i) {
    auto buffer = list.template get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) {
      return ffi::Error::InvalidArgument(
          std::string(name(i)) +
          " is not a buffer: " + buffer.error().message());
    }
    const ffi::AnyBuffer any = Unwrap(*buffer);
    const auto dims = any.dimensions();
    const auto rank = static_cast<int64_t>(dims.size());
    BufferView view;
    if (DecodeBuffer(any.element_type(), any.untyped_data(), dims.begin(), rank,
                     "", &view)
            .failure()) {
      // Decoding is deterministic: again, with the name, for the message.
      return DecodeBuffer(any.element_type(), any.untyped_data(), dims.begin(),
                          rank, name(i), &view);
    }
    out->push_back(view);
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error DecodeCallBuffers(const ffi::RemainingArgs& args,
                             const ffi::RemainingRets& rets,
                             int64_t expected_inputs, int64_t expected_outputs,
                             std::vector<BufferView>* out) {
  out->clear();
  if (expected_inputs >= 0 &&
      static_cast<int64_t>(args.size()) != expected_inputs) {
    return ffi::Error::InvalidArgument(
        "expected " + std::to_string(expected_inputs) + " inputs, got " +
        std::to_string(args.size()));
  }
  if (expected_outputs >= 0 &&
      static_cast<int64_t>(rets.size()) != expected_outputs) {
    return ffi::Error::InvalidArgument(
        "expected " + std::to_string(expected_outputs) + " outputs, got " +
        std::to_string(rets.size()));
  }
  if (ffi::Error err = DecodeAll(args, "input", out); err.failure()) return err;
  return DecodeAll(rets, "output", out);
}

ffi::Error DropUnitAxes(const std::vector<int64_t>& lead,
                        const std::vector<int64_t>& trail,
                        std::vector<BufferView>* buffers) {
  if (lead.empty() && trail.empty()) return ffi::Error::Success();
  for (const auto* counts : {&lead, &trail}) {
    if (!counts->empty() && counts->size() != buffers->size()) {
      return ffi::Error::InvalidArgument(
          "expected " + std::to_string(counts->size()) + " buffers, got " +
          std::to_string(buffers->size()));
    }
  }
  for (size_t i = 0; i < buffers->size(); ++i) {
    const BufferView& b = (*buffers)[i];
    const int64_t head = lead.empty() ? 0 : lead[i];
    const int64_t tail = trail.empty() ? 0 : trail[i];
    bool units = head >= 0 && tail >= 0 && head + tail <= b.rank;
    for (int64_t d = 0; units && d < head; ++d) units = b.dims[d] == 1;
    for (int64_t d = b.rank - tail; units && d < b.rank; ++d) {
      units = b.dims[d] == 1;
    }
    if (!units) {
      return ffi::Error::InvalidArgument(
          "buffer " + std::to_string(i) + " (rank " + std::to_string(b.rank) +
          ") lacks the unit axes of a partitioned call (" +
          std::to_string(head) + " leading, " + std::to_string(tail) +
          " trailing)");
    }
  }
  for (size_t i = 0; i < buffers->size(); ++i) {
    BufferView& b = (*buffers)[i];
    const int64_t head = lead.empty() ? 0 : lead[i];
    const int64_t tail = trail.empty() ? 0 : trail[i];
    b.dims += head;
    b.rank -= head + tail;
  }
  return ffi::Error::Success();
}

ffi::Error SliceCount(const std::vector<BufferView>& buffers,
                      const std::vector<int64_t>& sliced, size_t first_output,
                      int64_t* batch) {
  if (sliced.size() != buffers.size()) {
    return ffi::Error::InvalidArgument(
        "expected " + std::to_string(sliced.size()) + " buffers, got " +
        std::to_string(buffers.size()));
  }
  size_t lead = buffers.size();
  for (size_t i = first_output; i < buffers.size() && lead == buffers.size();
       ++i) {
    if (sliced[i]) lead = i;
  }
  for (size_t i = 0; i < buffers.size() && lead == buffers.size(); ++i) {
    if (sliced[i]) lead = i;
  }
  if (lead == buffers.size()) {
    *batch = 1;  // nothing sliced: one call with every buffer whole
    return ffi::Error::Success();
  }
  if (buffers[lead].rank < 1) {
    return ffi::Error::InvalidArgument(
        "buffer " + std::to_string(lead) +
        " is 0-d, so it has no axis of slices for a sequential vmap");
  }
  *batch = buffers[lead].dims[0];
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!sliced[i]) continue;
    if (buffers[i].rank < 1 || buffers[i].dims[0] != *batch) {
      return ffi::Error::InvalidArgument(
          "buffer " + std::to_string(i) + " (rank " +
          std::to_string(buffers[i].rank) + ") does not hold " +
          std::to_string(*batch) +
          " slices along axis 0 for a sequential vmap");
    }
  }
  return ffi::Error::Success();
}

void SelectSlice(const std::vector<BufferView>& buffers,
                 const std::vector<int64_t>& sliced, int64_t batch, int64_t s,
                 std::vector<BufferView>* out, std::vector<int64_t>* offsets) {
  out->resize(buffers.size());
  offsets->assign(buffers.size(), 0);
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferView& b = buffers[i];
    BufferView& v = (*out)[i];
    v = b;
    if (!sliced[i]) continue;
    // Every slice holds the same bytes: the buffer's divided by the batch.
    const size_t slice_bytes = b.nbytes / static_cast<size_t>(batch);
    const int64_t offset = s * static_cast<int64_t>(slice_bytes);
    v.data = b.data == nullptr ? nullptr : static_cast<char*>(b.data) + offset;
    v.dims = b.dims + 1;
    v.rank = b.rank - 1;
    v.element_count = b.element_count / batch;
    v.nbytes = slice_bytes;
    (*offsets)[i] = offset;
  }
}

}  // namespace numbax
