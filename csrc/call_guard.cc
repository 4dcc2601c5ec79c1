#include "call_guard.h"

namespace numbax {
namespace {

// See SetCallGuard: a flat tuple of (swap, value) pairs, or null.
PyObject* g_call_guard = nullptr;

}  // namespace

bool SetCallGuard(PyObject* pairs) {
  if (pairs == nullptr || pairs == Py_None) {
    g_call_guard = nullptr;
    return true;
  }
  if (!PyTuple_Check(pairs) || PyTuple_GET_SIZE(pairs) % 2 != 0 ||
      PyTuple_GET_SIZE(pairs) > 2 * kMaxGuardPairs) {
    return false;
  }
  if (PyTuple_GET_SIZE(pairs) == 0) {
    g_call_guard = nullptr;
    return true;
  }
  Py_INCREF(pairs);
  g_call_guard = pairs;
  return true;
}

GuardedCall::GuardedCall() : guard_(g_call_guard) {}

bool GuardedCall::Enter() {
  if (!guard_) return true;
  const Py_ssize_t pairs = PyTuple_GET_SIZE(guard_) / 2;
  for (Py_ssize_t i = 0; i < pairs; ++i) {
    saved_[i] = PyObject_CallOneArg(PyTuple_GET_ITEM(guard_, 2 * i),
                                    PyTuple_GET_ITEM(guard_, 2 * i + 1));
    if (!saved_[i]) {
      while (i-- > 0) {
        PyObject* r =
            PyObject_CallOneArg(PyTuple_GET_ITEM(guard_, 2 * i), saved_[i]);
        Py_XDECREF(r);
        Py_DECREF(saved_[i]);
      }
      return false;
    }
  }
  pairs_ = pairs;
  return true;
}

bool GuardedCall::Exit() {
  if (pairs_ <= 0) return true;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  bool ok = true;
  for (Py_ssize_t i = pairs_ - 1; i >= 0; --i) {
    PyObject* r =
        PyObject_CallOneArg(PyTuple_GET_ITEM(guard_, 2 * i), saved_[i]);
    if (!r) {
      ok = false;
      PyErr_Clear();
    }
    Py_XDECREF(r);
    Py_DECREF(saved_[i]);
  }
  pairs_ = 0;
  PyErr_Restore(type, value, traceback);
  return ok;
}

}  // namespace numbax
