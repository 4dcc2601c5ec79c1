// The Python interpreter as XLA's threads meet it: whether it may be
// entered, the GIL for a scope, and numbax's exit handling.
//
// XLA calls handlers, and destroys their state, from its own threads, at
// any time, including while Python finalises. Every handler that touches
// Python does so inside an InterpreterUse, then a GilScope.
#pragma once

#include <Python.h>

namespace numbax {

// The error a handler's instantiate stage returns when it cannot enter
// Python (not yet imported in an embedding, finalising, or exiting).
inline constexpr const char* kInterpreterNotRunning =
    "numbax: the Python interpreter is not running (or is exiting)";

// True when it is safe to take the GIL from this thread.
bool PythonIsAlive();

// Counts a handler's use of the interpreter for its scope, so that
// numbax's exit hook (PrepareForExit, run by atexit before Python
// finalises) can wait for the uses in flight and refuse new ones: a thread
// that waits for the GIL while Python finalises is ended with pthread_exit,
// whose unwinding through XLA's frames aborts the process. Construct it
// before taking the GIL; admitted() false means: do not touch Python.
class InterpreterUse {
 public:
  InterpreterUse();
  ~InterpreterUse();
  InterpreterUse(const InterpreterUse&) = delete;
  InterpreterUse& operator=(const InterpreterUse&) = delete;
  bool admitted() const { return admitted_; }

 private:
  bool admitted_;
};

// From now on handlers refuse to run Python (their calls fail with an
// error, as after finalisation); waits up to `timeout_s` seconds, with the
// GIL released, for the uses in flight. Returns how many were still in
// flight at the timeout (0 normally). Call with the GIL held.
int PrepareForExit(double timeout_s);

// Holds the GIL for a scope, on any thread. XLA calls handlers from its own
// threads; each keeps one Python thread state for its whole life instead of
// one per call, which would cost microseconds per call and would empty
// every threading.local (Numba caches its current context in one).
// Callers check PythonIsAlive() first (InterpreterUse does).
class GilScope {
 public:
  GilScope();
  ~GilScope();
  GilScope(const GilScope&) = delete;
  GilScope& operator=(const GilScope&) = delete;

 private:
  PyGILState_STATE state_;
};

}  // namespace numbax
