#include "python_bridge.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "fast_launch.h"

namespace numbax {
namespace {

namespace ffi = ::xla::ffi;

PythonHooks g_hooks;

// See SetCallGuard: a flat tuple of (swap, value) pairs, or null.
PyObject* g_call_guard = nullptr;
constexpr Py_ssize_t kMaxGuardPairs = 4;

// Swaps the guard's values in; `saved` receives the previous values (new
// references). Returns the number of pairs swapped, or -1 with a Python
// error set (having swapped nothing back in).
Py_ssize_t EnterCallGuard(PyObject* guard, PyObject** saved) {
  if (!guard) return 0;
  const Py_ssize_t pairs = PyTuple_GET_SIZE(guard) / 2;
  for (Py_ssize_t i = 0; i < pairs; ++i) {
    saved[i] = PyObject_CallOneArg(PyTuple_GET_ITEM(guard, 2 * i),
                                   PyTuple_GET_ITEM(guard, 2 * i + 1));
    if (!saved[i]) {
      while (i-- > 0) {
        PyObject* r =
            PyObject_CallOneArg(PyTuple_GET_ITEM(guard, 2 * i), saved[i]);
        Py_XDECREF(r);
        Py_DECREF(saved[i]);
      }
      return -1;
    }
  }
  return pairs;
}

// Restores what EnterCallGuard saved, in reverse order, keeping any pending
// exception (func's) intact. Returns false if a restore itself failed.
bool ExitCallGuard(PyObject* guard, PyObject** saved, Py_ssize_t pairs) {
  if (pairs <= 0) return true;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  bool ok = true;
  for (Py_ssize_t i = pairs - 1; i >= 0; --i) {
    PyObject* r = PyObject_CallOneArg(PyTuple_GET_ITEM(guard, 2 * i), saved[i]);
    if (!r) {
      ok = false;
      PyErr_Clear();
    }
    Py_XDECREF(r);
    Py_DECREF(saved[i]);
  }
  PyErr_Restore(type, value, traceback);
  return ok;
}

struct CachedStream {
  int device;
  void* stream;
  PyObject* object;  // strong reference
};
std::vector<CachedStream>& StreamCache() {
  static auto* cache = new std::vector<CachedStream>();  // leaked on purpose
  return *cache;
}
constexpr size_t kMaxStreams = 64;

PyObject* ShapeTuple(const BufferView& view) {
  PyObject* shape = PyTuple_New(view.rank);
  if (!shape) return nullptr;
  for (int64_t i = 0; i < view.rank; ++i) {
    PyObject* d = PyLong_FromLongLong(view.dims[i]);
    if (!d) {
      Py_DECREF(shape);
      return nullptr;
    }
    PyTuple_SET_ITEM(shape, i, d);
  }
  return shape;
}

void CollectGarbage() {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject* gc = PyImport_ImportModule("gc");
  PyObject* r = gc ? PyObject_CallMethod(gc, "collect", nullptr) : nullptr;
  Py_XDECREF(r);
  Py_XDECREF(gc);
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
}

}  // namespace

ffi::TypeId CpuCallSite::id = {};
ffi::TypeId CudaCallSite::id = {};

void SetPythonHooks(const PythonHooks& hooks) {
  PyObject* all[] = {hooks.resolve,     hooks.device_array,
                     hooks.host_array,  hooks.device_stream,
                     hooks.host_stream, hooks.format_exception};
  for (PyObject* o : all) Py_XINCREF(o);
  g_hooks = hooks;
}

const PythonHooks& Hooks() { return g_hooks; }

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

BridgeCounters& Counters() {
  static BridgeCounters counters;
  return counters;
}

std::string TakePythonError() {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback && value) PyException_SetTraceback(value, traceback);
  std::string text;
  if (value && g_hooks.format_exception) {
    PyObject* s = PyObject_CallOneArg(g_hooks.format_exception, value);
    if (s && PyUnicode_Check(s)) {
      const char* utf8 = PyUnicode_AsUTF8(s);
      if (utf8) text = utf8;
    }
    Py_XDECREF(s);
    PyErr_Clear();  // the formatter itself must not leave an error behind
  }
  if (text.empty() && value) {
    PyObject* str = PyObject_Str(value);
    // backslashreplace: a lone surrogate must not make it unprintable.
    PyObject* s =
        str ? PyUnicode_AsEncodedString(str, "utf-8", "backslashreplace")
            : nullptr;
    Py_XDECREF(str);
    const char* utf8 = s ? PyBytes_AsString(s) : nullptr;
    text = std::string(type ? reinterpret_cast<PyTypeObject*>(type)->tp_name
                            : "Exception") +
           ": " + (utf8 ? utf8 : "<unprintable>");
    Py_XDECREF(s);
    PyErr_Clear();
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return text;
}

ffi::Error CallSite::Resolve(std::string_view key, Platform platform) {
  InterpreterUse use;
  if (!use.admitted()) {
    return ffi::Error::Internal(
        "numbax: the Python interpreter is not running (or is exiting)");
  }
  key_ = std::string(key);
  GilScope gil;
  ++Counters().resolves;
  ffi::Error error = ffi::Error::Success();
  PyObject* resolved = nullptr;
  if (!g_hooks.resolve) {
    error = ffi::Error::Internal(
        "numbax: the Python package was not imported in this process; "
        "`import numbax` and create the op before running the program");
  } else {
    resolved = PyObject_CallFunction(
        g_hooks.resolve, "s#s", key.data(), static_cast<Py_ssize_t>(key.size()),
        platform == Platform::kCuda ? "cuda" : "cpu");
    if (!resolved) {
      error = ffi::Error::InvalidArgument(TakePythonError());
    } else if (int fast = 0;
               !PyArg_ParseTuple(resolved, "OLLL|p", &func_, &num_inputs_,
                                 &num_outputs_, &num_scratch_, &fast)) {
      error = ffi::Error::Internal("numbax: bad resolve result: " +
                                   TakePythonError());
      func_ = nullptr;
    } else {
      Py_INCREF(func_);
      fast_launch_ = fast != 0;
      slots_.resize(
          static_cast<size_t>(num_inputs_ + num_outputs_ + num_scratch_));
      for (auto& slot : slots_) slot.reserve(kArraysPerSlot);
    }
  }
  Py_XDECREF(resolved);
  return error;
}

CallSite::~CallSite() {
  // XLA may destroy compiled programs after Python has shut down, or from a
  // thread that cannot take the GIL then: the references are leaked rather
  // than touched without an interpreter.
  InterpreterUse use;
  if (!use.admitted()) return;
  GilScope gil;
  ClearCache();
  Py_CLEAR(func_);
}

void CallSite::ClearCache() {
  for (auto& slot : slots_) {
    for (auto& c : slot) {
      Py_DECREF(c.array);
      Py_XDECREF(c.root);
    }
    slot.clear();
  }
}

PyObject* CallSite::ArrayFor(size_t slot_index, const BufferView& view,
                             Platform platform, int device, bool writable) {
  auto& slot = slots_[slot_index];
  for (size_t i = 0; i < slot.size(); ++i) {
    if (slot[i].data == view.data && slot[i].device == device &&
        slot[i].writable == writable) {
      ++Counters().array_hits;
      if (i != 0) std::swap(slot[i], slot[0]);  // keep the hottest first
      return slot[0].array;
    }
  }
  ++Counters().array_misses;
  PyObject* shape = ShapeTuple(view);
  if (!shape) return nullptr;
  const char* dtype = LookupDType(view.dtype)->name;
  const auto ptr =
      static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(view.data));
  // The simulator's inputs are read-only views (a write raises, naming the
  // input); the slot index names it.
  const int read_only_input = writable ? -1 : static_cast<int>(slot_index);
  PyObject* made = platform == Platform::kCuda
                       ? PyObject_CallFunction(g_hooks.device_array, "KOsi",
                                               ptr, shape, dtype, device)
                       : PyObject_CallFunction(g_hooks.host_array, "KOsi", ptr,
                                               shape, dtype, read_only_input);
  Py_DECREF(shape);
  if (!made) return nullptr;
  // A hook returns the array, or (array, root): see CachedArray::root.
  PyObject* array = made;
  PyObject* root = nullptr;
  if (PyTuple_Check(made) && PyTuple_GET_SIZE(made) == 2) {
    array = PyTuple_GET_ITEM(made, 0);
    root = PyTuple_GET_ITEM(made, 1);
    Py_INCREF(array);
    Py_INCREF(root);
    Py_DECREF(made);
  }
  if (slot.size() == kArraysPerSlot) {
    Py_DECREF(slot.back().array);
    Py_XDECREF(slot.back().root);
    slot.pop_back();
  }
  slot.insert(slot.begin(),
              CachedArray{view.data, device, writable, array, root,
                          Py_REFCNT(array), root ? Py_REFCNT(root) : 0});
  return array;
}

ffi::Error CallSite::CheckNothingKept(PyObject* const* args, size_t n,
                                      Platform platform) {
  // Only this call holds its arrays now (no other thread runs this site):
  // otherwise the counts include the other calls' references.
  if (active_calls_ != 1) return ffi::Error::Success();
  for (size_t i = 0; i < n && i < slots_.size(); ++i) {
    auto& slot = slots_[i];
    for (size_t j = 0; j < slot.size(); ++j) {
      CachedArray& c = slot[j];
      if (c.array != args[i]) continue;
      // +1: the reference this call holds in its argument vector.
      bool kept = Py_REFCNT(c.array) > c.array_refs + 1 ||
                  (c.root && Py_REFCNT(c.root) > c.root_refs);
      if (kept) {
        // A reference cycle (a caught exception's traceback) may hold it
        // only until the collector runs: rule that out before failing
        // (gc.collect() runs even where the program disabled automatic
        // collection, unlike PyGC_Collect).
        CollectGarbage();
        kept = Py_REFCNT(c.array) > c.array_refs + 1 ||
               (c.root && Py_REFCNT(c.root) > c.root_refs);
      }
      if (!kept) break;
      // Never hand the kept object to a later call: it would then alias
      // that call's buffer under the name func kept.
      PyObject* array = c.array;
      PyObject* root = c.root;
      slot.erase(slot.begin() + static_cast<std::ptrdiff_t>(j));
      Py_DECREF(array);  // argv still holds it
      Py_XDECREF(root);
      const int64_t in = num_inputs_, out = num_outputs_;
      const int64_t k = static_cast<int64_t>(i);
      const std::string name =
          k < in         ? "input " + std::to_string(k)
          : k < in + out ? "output " + std::to_string(k - in)
                         : "scratch buffer " + std::to_string(k - in - out);
      const std::string message =
          "numbax op '" + key_ + "': func kept a reference to its " + name +
          " (argument " + std::to_string(k) +
          ") or a view of it after returning. The arrays numbax passes "
          "are views of XLA's buffers, valid only during the call: XLA "
          "frees or reuses the memory afterwards, so reading the kept "
          "array later reads freed memory. Copy what you need "
          "(arr.copy_to_host()) or return it as an output instead "
          "(docs/reliability.md)";
      // In the simulator a kept view read later reads freed host memory and
      // can crash the process: the call fails. On a GPU such a read cannot
      // crash the process, and the count can include a reference that
      // Numba's launch holds for a while (a fresh process's first calls
      // under compute-sanitizer on the H200 were reported, func keeping
      // nothing; cause not found): a RuntimeWarning, the call succeeds.
      if (platform == Platform::kCpu) {
        return ffi::Error::InvalidArgument(message);
      }
      if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) < 0) {
        return ffi::Error::InvalidArgument(message + ": " + TakePythonError());
      }
      return ffi::Error::Success();
    }
  }
  return ffi::Error::Success();
}

PyObject* StreamFor(Platform platform, int device, void* stream) {
  auto& cache = StreamCache();
  for (auto& c : cache) {
    if (c.device == device && c.stream == stream) {
      ++Counters().stream_hits;
      return c.object;
    }
  }
  ++Counters().stream_misses;
  PyObject* object =
      platform == Platform::kCuda
          ? PyObject_CallFunction(g_hooks.device_stream, "Ki",
                                  static_cast<unsigned long long>(
                                      reinterpret_cast<uintptr_t>(stream)),
                                  device)
          : PyObject_CallNoArgs(g_hooks.host_stream);
  if (!object) return nullptr;
  if (cache.size() == kMaxStreams) {
    Py_DECREF(cache.front().object);
    cache.erase(cache.begin());
  }
  cache.push_back(CachedStream{device, stream, object});
  return object;
}

void ClearStreamCache() {
  for (auto& c : StreamCache()) Py_DECREF(c.object);
  StreamCache().clear();
}

ffi::Error CallSite::Invoke(const std::vector<BufferView>& buffers,
                            Platform platform, int device, void* stream) {
  ++Counters().calls;
  if (buffers.size() != slots_.size()) {
    ++Counters().errors;
    return ffi::Error::InvalidArgument(
        "numbax op '" + key_ + "': expected " + std::to_string(slots_.size()) +
        " buffers, got " + std::to_string(buffers.size()));
  }
  // argv[0] is scratch space that vectorcall may use (ARGUMENTS_OFFSET).
  // Every argument is held by a strong reference for the call: func may
  // release the GIL (Numba does, around driver calls), and another thread
  // running this call site may then evict these arrays from the cache.
  thread_local std::vector<PyObject*> argv;
  argv.assign(buffers.size() + 2, nullptr);
  struct Release {
    std::vector<PyObject*>& held;
    ~Release() {
      for (PyObject*& o : held) Py_CLEAR(o);
    }
  } release{argv};
  // Counts this call while it holds references to cached arrays (destroyed
  // before `release`, still under the GIL): see CheckNothingKept.
  struct CountActive {
    int& n;
    explicit CountActive(int& count) : n(count) { ++n; }
    ~CountActive() { --n; }
  } counted{active_calls_};
  const size_t num_inputs = static_cast<size_t>(num_inputs_);
  for (size_t i = 0; i < buffers.size(); ++i) {
    // In the simulator an input is read-only unless it is aliased to an
    // output (then it shares that output's buffer, which func may write).
    bool writable = true;
    if (platform == Platform::kCpu && i < num_inputs) {
      writable = false;
      for (size_t o = num_inputs; o < buffers.size(); ++o) {
        if (buffers[o].data == buffers[i].data) writable = true;
      }
    }
    PyObject* array = ArrayFor(i, buffers[i], platform, device, writable);
    if (!array) {
      ++Counters().errors;
      return ffi::Error::Internal(
          "numbax op '" + key_ + "': could not wrap buffer " +
          std::to_string(i) + " for Numba: " + TakePythonError());
    }
    Py_INCREF(array);
    argv[i + 1] = array;
  }
  PyObject* stream_object = StreamFor(platform, device, stream);
  if (!stream_object) {
    ++Counters().errors;
    return ffi::Error::Internal(
        "numbax op '" + key_ +
        "': could not wrap XLA's stream for Numba: " + TakePythonError());
  }
  Py_INCREF(stream_object);
  argv[buffers.size() + 1] = stream_object;
  // The guard is read once: a concurrent SetCallGuard never frees the old
  // tuple, so this one stays valid while func runs without the GIL.
  PyObject* guard = g_call_guard;
  PyObject* saved[kMaxGuardPairs];
  const Py_ssize_t guarded = EnterCallGuard(guard, saved);
  if (guarded < 0) {
    ++Counters().errors;
    return ffi::Error::Internal(
        "numbax op '" + key_ +
        "': could not enter the call guard: " + TakePythonError());
  }
  // Launches func makes on this thread see which arrays and stream are
  // numbax's (csrc/fast_launch.h).
  ActiveCall active;
  active.buffers = &buffers;
  active.arrays = argv.data() + 1;
  active.stream = stream;
  active.device = device;
  active.cuda = platform == Platform::kCuda;
  active.enabled = fast_launch_;
  PyObject* result;
  {
    ActiveCallScope scope(&active);
    result = PyObject_Vectorcall(
        func_, argv.data() + 1,
        (buffers.size() + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }
  if (!ExitCallGuard(guard, saved, guarded)) {
    Py_XDECREF(result);
    PyErr_Clear();
    ++Counters().errors;
    return ffi::Error::Internal("numbax op '" + key_ +
                                "': could not restore the thread's JAX "
                                "state after func returned");
  }
  if (!result) {
    ++Counters().errors;
    return ffi::Error::Internal("numbax op '" + key_ + "': func raised " +
                                TakePythonError());
  }
  const bool returned_value = result != Py_None;
  Py_DECREF(result);
  if (returned_value) {
    ++Counters().errors;
    return ffi::Error::InvalidArgument(
        "numbax op '" + key_ +
        "': func returned a value; it must write its results into the output "
        "arrays it is given and return None");
  }
  if (ffi::Error kept =
          CheckNothingKept(argv.data() + 1, buffers.size(), platform);
      kept.failure()) {
    ++Counters().errors;
    return kept;
  }
  return ffi::Error::Success();
}

}  // namespace numbax
