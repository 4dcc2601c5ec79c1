#include "interpreter.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace numbax {
namespace {
std::atomic<int64_t> g_interpreter_uses{0};
std::atomic<bool> g_exiting{false};
}  // namespace

InterpreterUse::InterpreterUse() {
  // Counted before the flag is read, and PrepareForExit sets the flag
  // before it reads the count (both sequentially consistent): either this
  // use sees the flag, or PrepareForExit waits for it.
  g_interpreter_uses.fetch_add(1);
  admitted_ = !g_exiting.load() && PythonIsAlive();
  if (!admitted_) g_interpreter_uses.fetch_sub(1);
}

InterpreterUse::~InterpreterUse() {
  if (admitted_) g_interpreter_uses.fetch_sub(1);
}

int PrepareForExit(double timeout_s) {
  g_exiting.store(true);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_s);
  int64_t left = g_interpreter_uses.load();
  if (left == 0) return 0;
  Py_BEGIN_ALLOW_THREADS while ((left = g_interpreter_uses.load()) > 0 &&
                                std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Py_END_ALLOW_THREADS return static_cast<int>(left);
}

bool PythonIsAlive() {
  if (!Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsFinalizing();
#else
  return !_Py_IsFinalizing();
#endif
}

GilScope::GilScope() {
  thread_local bool thread_state_kept = false;
  if (!thread_state_kept) {
    thread_state_kept = true;
    PyGILState_STATE first = PyGILState_Ensure();
    if (first == PyGILState_UNLOCKED) {
      // A new thread state, held from now on: drop only the GIL.
      PyEval_SaveThread();
    } else {
      PyGILState_Release(first);  // a Python thread: it has its own state
    }
  }
  state_ = PyGILState_Ensure();
}

GilScope::~GilScope() {
  // When the interpreter finalises while func waits for the GIL (it had
  // released it: a sleep, a simulator kernel, Numba's own threads), Python
  // ends this thread with pthread_exit, whose forced unwinding runs this
  // destructor without the GIL. Releasing then would abort the process.
  if (!PyGILState_Check()) return;
  PyGILState_Release(state_);
}

}  // namespace numbax
