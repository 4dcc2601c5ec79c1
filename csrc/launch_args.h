// A fast launch's arguments, as the fast path reads and packs them.
//
// Which arguments of a launch made inside a numbax call are the arrays
// numbax handed to func, or views (slices, reshapes) of them, and what
// Numba type each argument has (the plan key's codes, fast_launch.cc); then
// the arguments packed into kernel parameters as a recorded plan says.
// Everything here runs with the GIL held.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

#include "call_frame.h"
#include "kernel_args.h"
#include "launch_log.h"

namespace numbax {

// How a launch argument is passed, per position: slot >= 0 is buffer
// `slot`'s own array; kViewC/F/A a view of a buffer with that Numba layout
// (its geometry in the launch's ViewInfo); kOther anything else.
constexpr int kOther = -1;
constexpr int kViewC = -2;
constexpr int kViewF = -3;
constexpr int kViewA = -4;

// A slice or reshape of one of the call's buffers, as Numba would pack it.
struct ViewInfo {
  void* data = nullptr;
  int64_t rank = 0;
  size_t itemsize = 0;
  int64_t dims[kMaxRank];
  int64_t strides[kMaxRank];
};

// Reads a launch's kernel arguments `args[0..n)`: per argument its slot
// (appended to `slots`), a view's geometry (in `views`, grown to `n`) and
// its type as Numba's dispatcher sees it (appended to `codes`): an array
// numbax handed to func (`arrays[j]` wraps `buffers[j]`), or a view of one,
// is (layout, dtype, rank), exactly Numba's array type; anything else its
// Python type. False when an int does not fit int64 (Numba types it as
// another type, or refuses it): not a launch for the fast path.
bool ReadLaunchArguments(PyObject* const* args, Py_ssize_t n,
                         const std::vector<BufferView>& buffers,
                         PyObject* const* arrays, std::vector<int>* slots,
                         std::vector<ViewInfo>* views,
                         std::vector<uint64_t>* codes);

enum class PackResult {
  kPacked,
  kForeignArgument,  // a value Numba's packing would refuse too
  kPlanError,        // the plan and the arguments disagree (a bug)
};

// Packs the arguments ReadLaunchArguments read, per `packing` (a char per
// argument: 'A' or 'M' an array, else a scalar as PackScalar packs it),
// into `packed` (Reset to the plan's ABI by the caller). With `patches`,
// also says which packed words are buffer addresses (launch_log.h).
PackResult PackLaunchArguments(const std::string& packing,
                               PyObject* const* args, Py_ssize_t n,
                               const std::vector<int>& slots,
                               const std::vector<ViewInfo>& views,
                               const std::vector<BufferView>& buffers,
                               KernelArgs* packed,
                               std::vector<AddressPatch>* patches = nullptr);

// Appends one scalar `value` packed as `how` ('i' int, 'b' bool, 'f'
// float32, 'd' float64: one 8-byte word; 'c' complex64, 'z' complex128:
// two). False, with a Python error set or not, when it cannot be.
bool PackScalar(char how, PyObject* value, KernelArgs* packed);

}  // namespace numbax
