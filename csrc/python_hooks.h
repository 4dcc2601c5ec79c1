// The Python callables numbax's package installs into the C++ core.
//
// They build Numba objects around XLA's buffers and streams on cache misses
// (call_site.h, stream_cache.h), resolve keys at XLA's instantiate stage, and
// format exceptions (python_errors.h). The per-call path never calls them
// when the caches hit.
#pragma once

#include <Python.h>

namespace numbax {

// Where a call runs, which decides which hooks build its objects: Numba's
// device arrays and streams (kCuda) or the simulator's (kCpu).
enum class Platform { kCpu, kCuda };

struct PythonHooks {
  PyObject* resolve =
      nullptr;  // (key, platform) -> (func, n_in, n_out, n_scratch[,
                //                      fast_launch])
  PyObject* device_array =
      nullptr;  // (ptr, shape, dtype, device) -> DeviceNDArray
  PyObject* host_array = nullptr;     // (ptr, shape, dtype) -> simulator array
  PyObject* device_stream = nullptr;  // (stream_ptr, device) -> numba Stream
  PyObject* host_stream = nullptr;    // () -> simulator stream
  PyObject* format_exception = nullptr;  // (exc) -> str with traceback
};

// Replaces the hooks (holding new references; the old ones are leaked on
// purpose, since a handler may be mid-call on another thread).
void SetPythonHooks(const PythonHooks& hooks);

namespace detail {
extern PythonHooks g_python_hooks;
}  // namespace detail

// Inline: read on every cache miss, from several files.
inline const PythonHooks& Hooks() { return detail::g_python_hooks; }

}  // namespace numbax
