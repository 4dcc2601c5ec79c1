// Test support for the fast launch path (fast_launch.h): its C++ without a
// GPU, bound in numbax._core for tests/test_fast_launch.py.
//
// With dry runs on, a fast launch records what it would send to the driver
// (LastLaunch) instead of calling it. CallAsNumbax runs `func` as numbax
// runs a func: with `arrays` wrapping `buffers` published on this thread (a
// list of (address, dtype name, shape)). PackScalarForTest returns the
// parameter words the fast path packs for one scalar `value` packed as `how`
// (see compilers/numba_cuda_launch.py), as bytes (8, or 16 for complex). Each
// returns a new reference, or nullptr with a Python error set.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>

namespace numbax {

void SetDryRun(bool on);
PyObject* LastLaunch();
PyObject* CallAsNumbax(PyObject* func, PyObject* arrays, PyObject* buffers,
                       void* stream, int device, bool enabled,
                       bool cached_plans);
PyObject* PackScalarForTest(char how, PyObject* value);

// Benchmarks (python -m numbax.bench.launch_cost): the driver's own cost.
// Issues `count` launches of `function` (a CUfunction or CUkernel handle)
// back to back on `stream`, each with the parameter words `words` (every
// parameter one 8-byte word, as for a kernel taking arrays and 64-bit
// scalars), and returns the host seconds they took, or a negative value
// (-CUresult) if a launch failed. `mode`: 0 kernelParams with the GIL held,
// 1 kernelParams with the GIL released around each launch (as the fast path
// launches), 2 one parameter buffer (CU_LAUNCH_PARAM_BUFFER_POINTER).
double TimeDriverLaunches(uintptr_t function, const unsigned grid[3],
                          const unsigned block[3], const int64_t* words,
                          size_t word_count, uintptr_t stream, int count,
                          int mode);

}  // namespace numbax
