// Test support for the fast launch path (fast_launch.h): its C++ without a
// GPU, bound in numbax._core for tests/test_fast_launch.py.
//
// With dry runs on, a fast launch records what it would send to the driver
// (LastLaunch) instead of calling it. CallAsNumbax runs `func` as numbax
// runs a func: with `arrays` wrapping `buffers` published on this thread (a
// list of (address, dtype name, shape)). PackScalarForTest returns the
// parameter words the fast path packs for one scalar `value` packed as `how`
// (see _fast_launch.py), as bytes (8, or 16 for complex). Each returns a new
// reference, or nullptr with a Python error set.
#pragma once

#include <Python.h>

namespace numbax {

void SetDryRun(bool on);
PyObject* LastLaunch();
PyObject* CallAsNumbax(PyObject* func, PyObject* arrays, PyObject* buffers,
                       void* stream, int device, bool enabled);
PyObject* PackScalarForTest(char how, PyObject* value);

}  // namespace numbax
