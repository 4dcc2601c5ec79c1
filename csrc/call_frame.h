// Decoding of XLA's buffers from an FFI call frame into plain views.
//
// This is the only place that reads XLA's raw buffer descriptors. Everything
// it hands on has been checked: a known dtype, a rank numbax supports,
// non-negative extents whose byte size does not overflow, and a data pointer
// that is non-null whenever the buffer holds any bytes (XLA may pass null for
// an empty buffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace numbax {

namespace ffi = ::xla::ffi;

// How numbax hands a buffer of each supported XLA element type to Numba.
struct DTypeInfo {
  const char* name;  // numpy dtype name ("float32", "bfloat16", ...)
  size_t itemsize;   // bytes per element
  // The element type the buffer reaches kernels as: the type itself, or U8
  // for the 8-bit floats (float8_*), which Numba has no array type for and
  // which kernels get as a bit view of the same shape (zero copy).
  ffi::DataType as;
};

// The dtype's description, or nullptr when numbax cannot hand such a buffer
// to Numba (sub-byte types: int4, uint4, float4_e2m1fn, ...; tokens;
// unknown codes). Every float8 type maps to uint8's description.
const DTypeInfo* LookupDType(ffi::DataType dtype);

// Numba's arrays take at most this many dimensions in numbax.
constexpr int64_t kMaxRank = 32;

struct BufferView {
  void* data = nullptr;
  // The element type kernels see (DTypeInfo::as): U8 for a float8 buffer.
  ffi::DataType dtype = ffi::DataType::INVALID;
  const int64_t* dims = nullptr;  // owned by XLA's call frame
  int64_t rank = 0;
  int64_t element_count = 0;
  size_t nbytes = 0;
};

// The buffers' data addresses, into `out` (its capacity reused).
inline void AddressesOf(const std::vector<BufferView>& buffers,
                        std::vector<void*>* out) {
  out->resize(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) (*out)[i] = buffers[i].data;
}

// Whether `buffers` lie exactly at `addresses`, in order.
inline bool AtAddresses(const std::vector<void*>& addresses,
                        const std::vector<BufferView>& buffers) {
  if (addresses.size() != buffers.size()) return false;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (addresses[i] != buffers[i].data) return false;
  }
  return true;
}

// Checks one buffer's fields as XLA passed them and fills `out`. `what`
// names the buffer in errors ("input 2", "output 0").
ffi::Error DecodeBuffer(ffi::DataType dtype, void* data, const int64_t* dims,
                        int64_t rank, const char* what, BufferView* out);

// DecodeBuffer's checks without an error to build: true (and `out`
// filled) exactly when DecodeBuffer succeeds. For per-call paths that fall
// back to DecodeBuffer only to say what is wrong.
bool CheckBuffer(ffi::DataType dtype, void* data, const int64_t* dims,
                 int64_t rank, BufferView* out);

// Decodes every argument then every result into `out` (cleared first, its
// capacity kept: a reused vector allocates nothing after the first call).
// Fails, without touching memory behind the pointers, on any argument that
// is not a valid buffer, or when the counts differ from the expected ones
// (pass -1 to accept any count).
ffi::Error DecodeCallBuffers(const ffi::RemainingArgs& args,
                             const ffi::RemainingRets& rets,
                             int64_t expected_inputs, int64_t expected_outputs,
                             std::vector<BufferView>* out);

// Drops the unit axes numbax added to a partitioned call's buffers
// (src/numbax/trace/sharding_rules.py): XLA's batch partitioner splits the same
// number of leading axes of every buffer and passes a buffer with fewer
// axes than that whole, so numbax gives the buffers it splits `lead[i]`
// leading axes of extent 1 (and an input with no axis besides the split
// ones `trail[i]` at the end), the others none. Each of `lead` and `trail`
// is empty (nothing added) or holds one count per buffer. Only the views
// change (dims advance past the leading unit axes, the rank shrinks);
// fails, changing nothing, where a buffer lacks them.
ffi::Error DropUnitAxes(const std::vector<int64_t>& lead,
                        const std::vector<int64_t>& trail,
                        std::vector<BufferView>* buffers);

// jax.vmap of a callable with vmap_method='sequential' (callable/vmap.py):
// one call holds the whole batch (its shard, in a partitioned program), and
// func runs once per slice. `sliced[i]` is 1 where buffer i holds one slice
// per batch element along axis 0, 0 where every slice gets it whole (an
// unbatched input, a scratch buffer). The batch is axis 0 of the first
// sliced buffer at or after `first_output` (outputs are always sliced),
// else of the first sliced one; every sliced buffer must hold that many.
// Fails naming the buffer otherwise, or when `sliced` does not hold one
// flag per buffer.
ffi::Error SliceCount(const std::vector<BufferView>& buffers,
                      const std::vector<int64_t>& sliced, size_t first_output,
                      int64_t* batch);

// Views of slice `s` of the sliced buffers (axis 0 dropped, data advanced
// to the slice), the others whole, into `out`; `offsets` gets each view's
// byte offset into its buffer. Views only: dims point into the buffers'
// own. `batch` > 0, as SliceCount found it.
void SelectSlice(const std::vector<BufferView>& buffers,
                 const std::vector<int64_t>& sliced, int64_t batch, int64_t s,
                 std::vector<BufferView>* out, std::vector<int64_t>* offsets);

}  // namespace numbax
