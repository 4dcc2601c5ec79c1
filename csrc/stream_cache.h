// The Numba stream objects numbax hands func, one per XLA stream.
//
// XLA runs a program on a handful of streams; building a Numba Stream for
// one is a Python call, so each is built once and kept (bounded). Runs with
// the GIL held; the cache needs no other lock.
#pragma once

#include <Python.h>

#include "python_hooks.h"

namespace numbax {

// The Numba stream object for an XLA stream on a device (cached, bounded).
// Returns a borrowed reference, or nullptr with a Python error set.
PyObject* StreamFor(Platform platform, int device, void* stream);

// Drops all cached streams.
void ClearStreamCache();

}  // namespace numbax
