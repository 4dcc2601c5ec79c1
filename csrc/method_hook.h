// A C++ replacement for a method of a Python class.
//
// numbax replaces two methods of Numba's classes: the configured launcher's
// __call__ (fast_launch.h) and the dispatcher's __getitem__
// (configure_hook.h). Each replacement is a MethodHook: an object called
// through vectorcall, with the instance prepended as a function would be
// (METHOD_DESCRIPTOR: no bound method per call), holding the method it
// replaces (`original`) and the Python objects its C++ needs (`refs`).
// Everything here runs with the GIL held.
#pragma once

#include <Python.h>

#include <initializer_list>

namespace numbax {

struct MethodHook {
  PyObject_HEAD PyObject* original;  // the replaced method (owned)
  PyObject* refs[3];                 // what the hook uses (owned, or null)
  vectorcallfunc vectorcall;
};

// A new hook type named `name` (e.g. "numbax._core.LaunchHook"), or nullptr
// with a Python error set. Make one per kind of hook, once. A hook shows
// the replaced method's __name__, __qualname__ and __doc__, and the method
// as __wrapped__; the garbage collector sees what it holds.
PyTypeObject* NewMethodHookType(const char* name);

// A new hook of `type` (a new reference) calling `call`, or nullptr with a
// Python error set. The caller checks what it passes.
PyObject* NewMethodHook(PyTypeObject* type, vectorcallfunc call,
                        PyObject* original,
                        std::initializer_list<PyObject*> refs);

}  // namespace numbax
