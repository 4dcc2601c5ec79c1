// numba_kernel's FFI handlers: a Numba @njit kernel, through the @cfunc
// wrapper numbax generated for it (src/numbax/cpu_kernel/wrapper.py), run
// on JAX's CPU backend from C++, with no Python and no GIL per call.
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "aliases.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace numbax {

// The generated wrapper: the buffers' data addresses (inputs, outputs, then
// the call's scalars), each buffer's extents, and the part [begin, end) of
// the call's range to run. Returns a WrapperStatus (cpu_kernel_chunks.h).
using CpuKernelWrapper = int32_t (*)(void* const* data,
                                     const int64_t* const* dims, uint64_t begin,
                                     uint64_t end);

// One numba_kernel custom call of a compiled program, built at XLA's
// instantiate stage from what the key resolves to.
class CpuKernelSite {
 public:
  static ::xla::ffi::TypeId id;

  // Resolves `key` through numbax's Python registry (takes the GIL).
  static ::xla::ffi::ErrorOr<std::unique_ptr<CpuKernelSite>> Create(
      std::string_view key);
  ~CpuKernelSite();

  const std::string& key() const { return key_; }
  CpuKernelWrapper wrapper() const { return wrapper_; }
  int64_t num_inputs() const { return num_inputs_; }
  int64_t num_outputs() const { return num_outputs_; }
  // Where each scalar's value lies (the wrapper reads it there).
  const std::vector<void*>& scalars() const { return scalar_ptrs_; }
  // -1: no launch range (the kernel runs once per slice).
  int64_t range() const { return range_; }
  // Leading batch axes of output 0 whose slices the wrapper loops over (0:
  // not vmapped per slice).
  int64_t batch_ndim() const { return batch_ndim_; }
  bool parallel() const { return parallel_; }
  // A kernel compiled with @njit(parallel=True): run one at a time.
  bool serialise() const { return serialise_; }
  const AliasList& aliases() const { return aliases_; }
  const std::vector<int64_t>& lead_units() const { return lead_; }
  const std::vector<int64_t>& trail_units() const { return trail_; }
  // No aliases and no unit axes to drop: the handler's per-call fast path.
  bool fast() const {
    return aliases_.empty() && lead_.empty() && trail_.empty();
  }

  // The error of a call whose wrapper returned `status`: names the op, and
  // holds the kernel's exception when a diagnostic re-run in Python may
  // say it (no aliased input, which the failed run may have changed).
  std::string FailureMessage(int32_t status, const std::vector<void*>& data,
                             const std::vector<const int64_t*>& dims,
                             const std::vector<int64_t>& ranks) const;

 private:
  CpuKernelSite() = default;
  std::string key_;
  CpuKernelWrapper wrapper_ = nullptr;
  int64_t num_inputs_ = 0;
  int64_t num_outputs_ = 0;
  std::vector<uint64_t> scalar_words_;
  std::vector<void*> scalar_ptrs_;
  int64_t range_ = -1;
  int64_t batch_ndim_ = 0;
  bool parallel_ = false;
  bool serialise_ = false;
  AliasList aliases_;
  std::vector<int64_t> lead_, trail_;
  PyObject* owner_ = nullptr;     // keeps the wrapper and kernel alive
  PyObject* diagnose_ = nullptr;  // re-runs a failed call in Python
};

// Sets the Python function that resolves numba_kernel keys:
//   (key) -> tuple, as cpu_kernel/op.py's plan builds it.
void SetCpuKernelResolver(PyObject* resolver);

}  // namespace numbax

extern "C" {
XLA_FFI_Error* NumbaxCpuKernelInstantiate(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCpuKernelExecute(XLA_FFI_CallFrame* frame);
}
