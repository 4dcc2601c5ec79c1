#include "call_site.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "call_guard.h"
#include "counters.h"
#include "fast_launch.h"
#include "interpreter.h"
#include "python_errors.h"
#include "stream_cache.h"

namespace numbax {
namespace {

std::atomic<int> g_bridge_stop{0};

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

// Reads the resolver's aliases, a sequence of (input, output) int pairs,
// into `out`; false (a Python error set) for anything else.
bool ReadAliases(PyObject* object, AliasList* out) {
  out->clear();
  if (object == nullptr || object == Py_None) return true;
  PyObject* seq = PySequence_Fast(object, "aliases must be a sequence");
  if (!seq) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long input = 0, output = 0;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "LL", &input,
                          &output)) {
      Py_DECREF(seq);
      return false;
    }
    out->push_back({input, output});
  }
  Py_DECREF(seq);
  return true;
}

// Reads the resolver's unit axes per buffer (a sequence of ints, or None
// for none) into `out`; false (a Python error set) otherwise.
bool ReadUnits(PyObject* object, std::vector<int64_t>* out) {
  out->clear();
  if (object == nullptr || object == Py_None) return true;
  PyObject* seq = PySequence_Fast(object, "unit axes must be a sequence");
  if (!seq) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return false;
    }
    out->push_back(v);
  }
  Py_DECREF(seq);
  return true;
}

}  // namespace

void SetBridgeStop(BridgeStop stop) {
  g_bridge_stop.store(static_cast<int>(stop), std::memory_order_relaxed);
}

BridgeStop GetBridgeStop() {
  return static_cast<BridgeStop>(g_bridge_stop.load(std::memory_order_relaxed));
}

ffi::TypeId CpuCallSite::id = {};
ffi::TypeId CudaCallSite::id = {};

ffi::Error CallSite::Resolve(std::string_view key, Platform platform) {
  InterpreterUse use;
  if (!use.admitted()) {
    return ffi::Error::Internal(kInterpreterNotRunning);
  }
  key_ = std::string(key);
  GilScope gil;
  ++Counters().resolves;
  ffi::Error error = ffi::Error::Success();
  PyObject* resolved = nullptr;
  int fast = 0;
  PyObject* aliases = nullptr;  // borrowed from `resolved`
  const char* name = nullptr;   // borrowed from `resolved`; None: no name
  PyObject* lead = nullptr;     // borrowed from `resolved`
  PyObject* trail = nullptr;    // borrowed from `resolved`
  PyObject* sliced = nullptr;   // borrowed from `resolved`
  if (!Hooks().resolve) {
    error = ffi::Error::Internal(
        "numbax: the Python package was not imported in this process; "
        "`import numbax` and create the op before running the program");
  } else {
    resolved = PyObject_CallFunction(
        Hooks().resolve, "s#s", key.data(), static_cast<Py_ssize_t>(key.size()),
        platform == Platform::kCuda ? "cuda" : "cpu");
    if (!resolved) {
      error = ffi::Error::InvalidArgument(TakePythonError());
    } else if (!PyArg_ParseTuple(resolved, "OLLL|pOzOOO", &func_, &num_inputs_,
                                 &num_outputs_, &num_scratch_, &fast, &aliases,
                                 &name, &lead, &trail, &sliced) ||
               !ReadAliases(aliases, &aliases_) ||
               !ReadUnits(lead, &lead_units_) ||
               !ReadUnits(trail, &trail_units_) ||
               !ReadUnits(sliced, &sliced_)) {
      error = ffi::Error::Internal("numbax: bad resolve result: " +
                                   TakePythonError());
      func_ = nullptr;
    } else if (std::string bad =
                   CheckAliases(aliases_, num_inputs_, num_outputs_);
               !bad.empty()) {
      error = ffi::Error::Internal("numbax: bad resolve result: " + bad);
      func_ = nullptr;
    } else if ((!lead_units_.empty() &&
                static_cast<int64_t>(lead_units_.size()) !=
                    num_inputs_ + num_outputs_ + num_scratch_) ||
               (!trail_units_.empty() &&
                static_cast<int64_t>(trail_units_.size()) !=
                    num_inputs_ + num_outputs_ + num_scratch_)) {
      error = ffi::Error::Internal(
          "numbax: bad resolve result: unit axes need one count per buffer");
      func_ = nullptr;
    } else if (!sliced_.empty() &&
               static_cast<int64_t>(sliced_.size()) !=
                   num_inputs_ + num_outputs_ + num_scratch_) {
      error = ffi::Error::Internal(
          "numbax: bad resolve result: sliced buffers need one flag per "
          "buffer");
      func_ = nullptr;
    } else {
      fast_launch_ = fast != 0;
      name_ = name != nullptr && *name != '\0' ? std::string(name) : key_;
      Py_INCREF(func_);
      const size_t n =
          static_cast<size_t>(num_inputs_ + num_outputs_ + num_scratch_);
      // A sequential vmap's slices have slots of their own (SlotOf),
      // reserved as they fill.
      slots_.resize(sliced_.empty() ? n : n * kCachedSlices);
      for (size_t i = 0; i < n; ++i) slots_[i].reserve(kArraysPerSlot);
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
      Py_XDECREF(c.stream);
    }
    slot.clear();
  }
}

namespace {

PyObject* StreamAttr() {
  static PyObject* name = PyUnicode_InternFromString("stream");
  return name;
}

// Sets `array.stream` to `stream` unless it already is: func may have set
// it (or deleted it) itself, and every call starts with the call's own.
bool BindStream(PyObject* array, PyObject* stream) {
  PyObject* name = StreamAttr();
  if (!name) return false;
  PyObject* current = PyObject_GetAttr(array, name);
  const bool same = current == stream;
  Py_XDECREF(current);
  if (same) return true;
  PyErr_Clear();  // no attribute at all: set it
  return PyObject_SetAttr(array, name, stream) == 0;
}

}  // namespace

PyObject* CallSite::ArrayFor(size_t slot_index, size_t buffer,
                             const BufferView& view, Platform platform,
                             int device, bool writable, PyObject* stream) {
  auto& slot = slots_[slot_index];
  // On CUDA the stream is part of the key: an array is bound to one stream
  // for good, so a call on another stream (another thread's capture, say)
  // never rebinds an array a running call holds.
  PyObject* key_stream = platform == Platform::kCuda ? stream : nullptr;
  for (size_t i = 0; i < slot.size(); ++i) {
    if (slot[i].data == view.data && slot[i].device == device &&
        slot[i].writable == writable && slot[i].stream == key_stream) {
      ++Counters().array_hits;
      if (i != 0) std::swap(slot[i], slot[0]);  // keep the hottest first
      if (key_stream && !BindStream(slot[0].array, key_stream)) return nullptr;
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
  // input); the buffer index names it.
  const int read_only_input = writable ? -1 : static_cast<int>(buffer);
  PyObject* made = platform == Platform::kCuda
                       ? PyObject_CallFunction(Hooks().device_array, "KOsi",
                                               ptr, shape, dtype, device)
                       : PyObject_CallFunction(Hooks().host_array, "KOsi", ptr,
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
  if (key_stream && !BindStream(array, key_stream)) {
    Py_DECREF(array);
    Py_XDECREF(root);
    return nullptr;
  }
  Py_XINCREF(key_stream);
  if (slot.size() == kArraysPerSlot) {
    Py_DECREF(slot.back().array);
    Py_XDECREF(slot.back().root);
    Py_XDECREF(slot.back().stream);
    slot.pop_back();
  }
  slot.insert(
      slot.begin(),
      CachedArray{view.data, device, writable, array, root, Py_REFCNT(array),
                  root ? Py_REFCNT(root) : 0, key_stream});
  return array;
}

ffi::Error CallSite::CheckNothingKept(PyObject* const* args, size_t n,
                                      Platform platform, int64_t slice) {
  // Only this call holds its arrays now (no other thread runs this site):
  // otherwise the counts include the other calls' references.
  if (active_calls_ != 1) return ffi::Error::Success();
  for (size_t i = 0; i < n; ++i) {
    const size_t slot_index = SlotOf(i, slice);
    if (slot_index >= slots_.size()) break;
    auto& slot = slots_[slot_index];
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
      PyObject* stream = c.stream;
      slot.erase(slot.begin() + static_cast<std::ptrdiff_t>(j));
      Py_DECREF(array);  // argv still holds it
      Py_XDECREF(root);
      Py_XDECREF(stream);
      const int64_t in = num_inputs_, out = num_outputs_;
      const int64_t k = static_cast<int64_t>(i);
      const std::string name =
          k < in         ? "input " + std::to_string(k)
          : k < in + out ? "output " + std::to_string(k - in)
                         : "scratch buffer " + std::to_string(k - in - out);
      const std::string message = OpMessage(
          OpKind::kCallable, key_,
          "func kept a reference to its " + name + " (argument " +
              std::to_string(k) +
              ") or a view of it after returning. The arrays numbax passes "
              "are views of XLA's buffers, valid only during the call: XLA "
              "frees or reuses the memory afterwards, so reading the kept "
              "array later reads freed memory. Copy what you need "
              "(arr.copy_to_host()) or return it as an output instead "
              "(docs/reliability.md)");
      // In the simulator a kept view read later reads freed host memory and
      // can crash the process: the call fails. On a GPU such a read cannot
      // crash the process, and the count can include references a tool
      // holds for a while (compute-sanitizer's host backtraces record
      // Python stacks inside driver calls: calls were reported on the
      // H200, func keeping nothing): a RuntimeWarning, the call succeeds.
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

ffi::Error CallSite::ShuttingDown() const {
  return ffi::Error::Internal(OpMessage(
      OpKind::kCallable, key_, "the Python interpreter is shutting down"));
}

ffi::Error CallSite::Invoke(const std::vector<BufferView>& buffers,
                            Platform platform, int device, void* stream,
                            bool plain, LaunchLog* log) {
  const size_t expected =
      static_cast<size_t>(num_inputs_ + num_outputs_ + num_scratch_);
  if (buffers.size() != expected) {
    ++Counters().calls;
    ++Counters().errors;
    return ffi::Error::InvalidArgument(
        OpMessage(OpKind::kCallable, key_,
                  "expected " + std::to_string(expected) + " buffers, got " +
                      std::to_string(buffers.size())));
  }
  if (sliced_.empty()) {
    return CallFunc(buffers, 0, platform, device, stream, plain, log,
                    /*log_open=*/false);
  }
  int64_t batch = 0;
  if (ffi::Error err = SliceCount(buffers, sliced_,
                                  static_cast<size_t>(num_inputs_), &batch);
      err.failure()) {
    ++Counters().errors;
    return ffi::Error::InvalidArgument(
        OpMessage(OpKind::kCallable, key_, err.message()));
  }
  // One log for every slice, against the whole buffers: a recording
  // replays (and re-binds) the whole batch's launches at once.
  if (log) {
    log->Begin(cuda::Load(), static_cast<cuda::CUstream>(stream), buffers);
  }
  thread_local std::vector<BufferView> views;
  thread_local std::vector<int64_t> offsets;
  for (int64_t s = 0; s < batch; ++s) {
    SelectSlice(buffers, sliced_, batch, s, &views, &offsets);
    const size_t logged = log ? log->launches().size() : 0;
    // Calls do not nest on a thread (the call guard refuses JAX work in
    // func, as CallFunc's own thread_local argv assumes).
    ffi::Error err = CallFunc(views, s, platform, device, stream, plain, log,
                              /*log_open=*/true);
    if (log) log->ShiftPatches(logged, offsets);
    if (err.failure()) return err;
  }
  if (log) log->End();
  return ffi::Error::Success();
}

ffi::Error CallSite::CallFunc(const std::vector<BufferView>& buffers,
                              int64_t slice, Platform platform, int device,
                              void* stream, bool plain, LaunchLog* log,
                              bool log_open) {
  ++Counters().calls;
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
  PyObject* stream_object = StreamFor(platform, device, stream);
  if (!stream_object) {
    ++Counters().errors;
    return ffi::Error::Internal(OpMessage(
        OpKind::kCallable, key_,
        "could not wrap XLA's stream for Numba: " + TakePythonError()));
  }
  Py_INCREF(stream_object);
  argv[buffers.size() + 1] = stream_object;
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
    PyObject* array = ArrayFor(SlotOf(i, slice), i, buffers[i], platform,
                               device, writable, stream_object);
    if (!array) {
      ++Counters().errors;
      return ffi::Error::Internal(
          OpMessage(OpKind::kCallable, key_,
                    "could not wrap buffer " + std::to_string(i) +
                        " for Numba: " + TakePythonError()));
    }
    Py_INCREF(array);
    argv[i + 1] = array;
  }
  const BridgeStop stop = plain ? GetBridgeStop() : BridgeStop::kFull;
  if (stop == BridgeStop::kAfterArrays) return ffi::Error::Success();
  GuardedCall guard;
  if (!guard.Enter()) {
    ++Counters().errors;
    return ffi::Error::Internal(
        OpMessage(OpKind::kCallable, key_,
                  "could not enter the call guard: " + TakePythonError()));
  }
  if (stop == BridgeStop::kAfterGuard) {
    if (guard.Exit()) return ffi::Error::Success();
    PyErr_Clear();
    return ffi::Error::Internal("numbax: could not restore the guard");
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
  active.cached_plans = plain;
  active.log = log;
  if (log && !log_open) {
    log->Begin(cuda::Load(), static_cast<cuda::CUstream>(stream), buffers);
  }
  PyObject* result;
  {
    ActiveCallScope scope(&active);
    result = PyObject_Vectorcall(
        func_, argv.data() + 1,
        (buffers.size() + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }
  if (log && !log_open) log->End();
  if (!guard.Exit()) {
    Py_XDECREF(result);
    PyErr_Clear();
    ++Counters().errors;
    return ffi::Error::Internal(OpMessage(OpKind::kCallable, key_,
                                          "could not restore the thread's JAX "
                                          "state after func returned"));
  }
  if (!result) {
    ++Counters().errors;
    return ffi::Error::Internal(
        OpMessage(OpKind::kCallable, key_, "func raised " + TakePythonError()));
  }
  const bool returned_value = result != Py_None;
  Py_DECREF(result);
  if (returned_value) {
    ++Counters().errors;
    return ffi::Error::InvalidArgument(OpMessage(
        OpKind::kCallable, key_,
        "func returned a value; it must write its results into the output "
        "arrays it is given and return None"));
  }
  if (ffi::Error kept =
          CheckNothingKept(argv.data() + 1, buffers.size(), platform, slice);
      kept.failure()) {
    ++Counters().errors;
    return kept;
  }
  return ffi::Error::Success();
}

}  // namespace numbax
