// The JAX-call guard: thread-local Python state swapped in around every
// call of a func, and restored after it.
//
// numbax uses it to make JAX refuse calls from inside func
// (src/numbax/runtime/guard.py) without a Python frame per call. Runs with the
// GIL held.
#pragma once

#include <Python.h>

namespace numbax {

// Installs the guard: `pairs` is a flat tuple (swap_0, value_0, swap_1,
// value_1, ...) where swap_i(value) sets a thread-local and returns the
// previous one. None or an empty tuple turns it off. Takes a new reference
// (the old one is leaked on purpose: a call on another thread may be using
// it without the GIL). Returns false, changing nothing, unless `pairs` is
// None or a tuple of at most kMaxGuardPairs pairs.
bool SetCallGuard(PyObject* pairs);

inline constexpr Py_ssize_t kMaxGuardPairs = 4;

// One call's use of the guard: Enter before func, Exit after it.
class GuardedCall {
 public:
  // Reads the guard installed now, once: a concurrent SetCallGuard never
  // frees the old tuple, so this one stays valid while func runs without
  // the GIL.
  GuardedCall();
  GuardedCall(const GuardedCall&) = delete;
  GuardedCall& operator=(const GuardedCall&) = delete;

  // Swaps the guard's values in. Returns false with a Python error set,
  // having swapped nothing back in (Exit is then not to be called).
  bool Enter();

  // Restores what Enter saved, in reverse order, keeping any pending
  // exception (func's) intact. Returns false if a restore itself failed.
  bool Exit();

 private:
  PyObject* guard_;
  PyObject* saved_[kMaxGuardPairs];
  Py_ssize_t pairs_ = 0;
};

}  // namespace numbax
