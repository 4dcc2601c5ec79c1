// Numba's `kernel[grid, block, stream]` without its Python frame.
//
// numba-cuda's CUDADispatcher.__getitem__ is a Python method that checks
// the key's length and calls `self.configure(*key)`, an lru_cache over
// (dispatcher, grid, block, stream, shared memory) returning the
// _LaunchConfiguration. Every launch written `kernel[...](...)` pays that
// frame and a bound method before the cache lookup (about 0.4 us on an
// H200 host, 10% of a fast launch). A ConfigureHook replaces
// __getitem__ and calls the same lru_cache wrapper directly, with the
// dispatcher prepended: the same cache, the same objects, the same errors.
// Anything it does not recognise goes to Numba's __getitem__ unchanged.
#pragma once

#include <Python.h>

namespace numbax {

// A new ConfigureHook (a new reference), or nullptr with a Python error set.
// `original` is CUDADispatcher.__getitem__, `configure` the lru_cache
// wrapper in CUDADispatcher.__dict__["configure"], `cls` CUDADispatcher:
// only its exact instances with no `configure` of their own take the
// direct call (a subclass or an instance may override configure).
PyObject* NewConfigureHook(PyObject* original, PyObject* configure,
                           PyObject* cls);

}  // namespace numbax
