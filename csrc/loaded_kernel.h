// The loaded kernel of a numba_cuda_kernel call site: the compiled kernel's
// CUfunction in each visible device's context, with everything else one
// launch needs, fixed when XLA instantiates the program.
//
// numbax's Python side (src/numbax/kernel/loaded.py) builds it as a
// numbax._core.LoadedKernel, by keyword only: a field one side has and the
// other lacks fails at construction (TypeError), instead of shifting the
// others; a value no launch can take fails there too (ValueError).
// The call site copies it out once, at instantiate; the per-call path
// reads only this struct.
#pragma once

#include <Python.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "aliases.h"
#include "cuda_driver.h"
#include "kernel_args.h"

namespace nanobind {
class module_;
}  // namespace nanobind

namespace numbax {

struct LoadedKernel {
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
  // How the kernel takes its array parameters: Numba's ABI, or MLIR memrefs
  // for a numba-cuda-mlir kernel.
  ArrayAbi abi = ArrayAbi::kNumba;
  // input_output_aliases, (input, output) pairs: where XLA hands an aliased
  // output a buffer of its own, the input is copied into it first
  // (aliases.h). A vmapped call's pairs are whole batched buffers.
  AliasList aliases;
  // A call XLA partitions (src/numbax/trace/sharding_rules.py) gets each
  // device's shards, not the global arrays these fields were made for:
  // - lead_units, trail_units: per buffer (inputs, then outputs), the unit
  //   axes numbax added for XLA's partitioner at the start and at the end,
  //   dropped before anything else (call_frame.h); empty when none were;
  // - the batch of a vmapped call (batch > 0) is the leading extent of
  //   output 0 as the call receives it, not `batch`;
  // - grid_from: per grid axis, -1 (the axis is `grid`'s), or the axis of
  //   output 0 whose extent (as received) that grid axis covers, one
  //   thread each in blocks of `block`: the launch covers the local shard.
  std::vector<int64_t> lead_units;
  std::vector<int64_t> trail_units;
  std::array<int, 3> grid_from{-1, -1, -1};
  // Python or NumPy scalars passed by value, sorted by position among the
  // kernel's parameters; the buffers fill the other positions in order.
  std::vector<ScalarParam> scalars;
  // The op's name in profiles (its name=, else the kernel's qualified
  // name): each call is an NVTX range with this name (nvtx.h). Empty: the
  // call site's key names the range.
  std::string name;
};

// Registers numbax._core.LoadedKernel on the extension module.
void BindLoadedKernel(nanobind::module_& m);

// Reads a numbax._core.LoadedKernel (the kernel resolver's result): copies
// it into `loaded` and returns its owner (a borrowed reference: the
// object that keeps the kernel's module loaded). Returns nullptr, with
// `error` saying why, when `object` is something else. Call with the GIL
// held.
PyObject* ReadLoadedKernel(PyObject* object, LoadedKernel* loaded,
                           std::string* error);

}  // namespace numbax
