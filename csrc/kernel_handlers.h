// numba_cuda_kernel's FFI handler: a compiled Numba kernel launched from C++
// on XLA's stream, with no Python and no GIL per call.
#pragma once

#include <Python.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_driver.h"
#include "xla/ffi/api/ffi.h"

namespace numbax {

// Everything one launch needs, fixed when the program is instantiated.
struct LaunchPlan {
  std::vector<cuda::CUfunction> functions;  // indexed by device ordinal
  int64_t num_inputs = 0;
  int64_t num_outputs = 0;
  std::array<unsigned, 3> grid{1, 1, 1};
  std::array<unsigned, 3> block{1, 1, 1};
  unsigned shared_mem = 0;
  bool cooperative = false;
  bool empty_launch = false;  // a zero extent: zero the outputs instead
  // vmap: 0 when unbatched, else the number of slices along axis 0; each
  // slice is one launch of the unbatched kernel.
  int64_t batch = 0;
  std::vector<uint8_t> broadcast;  // per input: reuse slice 0 for every slice
  // vmap in one launch: the grid axis (1 or 2) that indexes the slice in
  // the generated batched kernel, or -1 for one launch per slice. Batches
  // above max_slices (CUDA's limit on that axis) take several launches.
  int fold_axis = -1;
  int64_t max_slices = 65535;
};

class KernelSite {
 public:
  static ::xla::ffi::TypeId id;

  // Resolves `key` through numbax's Python registry (takes the GIL).
  static ::xla::ffi::ErrorOr<std::unique_ptr<KernelSite>> Create(
      std::string_view key);
  ~KernelSite();

  const std::string& key() const { return key_; }
  const LaunchPlan& plan() const { return plan_; }

 private:
  KernelSite() = default;
  std::string key_;
  LaunchPlan plan_;
  PyObject* owner_ = nullptr;  // keeps the Numba dispatcher (and module) alive
};

// Sets the Python function that resolve keys of kernels:
//   (key) -> (owner, functions, n_in, n_out, grid, block, shared_mem,
//             cooperative, empty_launch, batch, broadcast, fold_axis,
//             max_slices)
void SetKernelResolver(PyObject* resolver);

}  // namespace numbax

extern "C" {
XLA_FFI_Error* NumbaxKernelInstantiateCuda(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxKernelExecuteCuda(XLA_FFI_CallFrame* frame);
}
