// Calling a user's Python function from an XLA FFI handler.
//
// A CallSite is the instantiate-stage state of one custom call in one
// compiled program: the Python function its stable key resolved to, and
// small caches of the Numba arrays and streams built around XLA's buffers.
// Everything here runs with the GIL held; the caches need no other lock.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "buffers.h"
#include "graph_cache.h"

namespace numbax {

// Python callables installed once by numbax's Python package at import.
// They build Numba objects on cache misses; the per-call path never calls
// them when the caches hit.
struct PythonHooks {
  PyObject* resolve =
      nullptr;  // (key, platform) -> (func, n_in, n_out, n_scratch[,
                //                      fast_launch])
  PyObject* device_array =
      nullptr;  // (ptr, shape, dtype, device) -> DeviceNDArray
  PyObject* host_array = nullptr;     // (ptr, shape, dtype) -> simulator array
  PyObject* device_stream = nullptr;  // (stream_ptr, device) -> numba Stream
  PyObject* host_stream = nullptr;    // () -> simulator stream
  PyObject* format_exception = nullptr;  // (exc) -> str with traceback
};

// Replaces the hooks (holding new references; the old ones are leaked on
// purpose, since a handler may be mid-call on another thread).
void SetPythonHooks(const PythonHooks& hooks);
const PythonHooks& Hooks();

// Thread-local Python state swapped in around every call of a func, and
// restored after it: `pairs` is a flat tuple (swap_0, value_0, swap_1,
// value_1, ...) where swap_i(value) sets a thread-local and returns the
// previous one. numbax uses it to make JAX refuse calls from inside func
// (src/numbax/_guard.py) without a Python frame per call. None or an empty
// tuple turns it off. Takes a new reference (the old one is leaked on
// purpose, as for the hooks). Returns false, changing nothing, unless
// `pairs` is None or a tuple of at most 4 pairs.
bool SetCallGuard(PyObject* pairs);

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
// Callers check PythonIsAlive() first.
class GilScope {
 public:
  GilScope();
  ~GilScope();
  GilScope(const GilScope&) = delete;
  GilScope& operator=(const GilScope&) = delete;

 private:
  PyGILState_STATE state_;
};

enum class Platform { kCpu, kCuda };

// Counters for tests and diagnostics. Updated under the GIL.
struct BridgeCounters {
  uint64_t calls = 0;
  uint64_t array_hits = 0;
  uint64_t array_misses = 0;
  uint64_t stream_hits = 0;
  uint64_t stream_misses = 0;
  uint64_t errors = 0;
  uint64_t resolves = 0;  // keys resolved at XLA's instantiate stage
};
BridgeCounters& Counters();

class CallSite {
 public:
  // Resolves `key` through the resolve hook. Takes the GIL itself. `Site`
  // is CpuCallSite or CudaCallSite.
  template <typename Site>
  static ::xla::ffi::ErrorOr<std::unique_ptr<Site>> Create(std::string_view key,
                                                           Platform platform) {
    std::unique_ptr<Site> site(new Site);
    if (::xla::ffi::Error err = site->Resolve(key, platform); err.failure()) {
      return ::xla::ffi::Unexpected(std::move(err));
    }
    return site;
  }

  virtual ~CallSite();
  CallSite(const CallSite&) = delete;
  CallSite& operator=(const CallSite&) = delete;

  const std::string& key() const { return key_; }
  int64_t num_inputs() const { return num_inputs_; }
  int64_t num_outputs() const { return num_outputs_; }
  int64_t num_scratch() const { return num_scratch_; }
  // Whether func's kernel launches may take numbax's fast path
  // (csrc/fast_launch.h); fixed when the key is resolved.
  bool fast_launch() const { return fast_launch_; }

  // Calls func(*arrays, stream) with the GIL held by the caller. `buffers`
  // are the inputs, outputs and scratch buffers in that order. For CUDA,
  // the device's primary context must already be current.
  ::xla::ffi::Error Invoke(const std::vector<BufferView>& buffers,
                           Platform platform, int device, void* stream);

  // Drops every cached array (tests, and numbax.clear_caches()).
  void ClearCache();

 protected:
  CallSite() = default;

 private:
  ::xla::ffi::Error Resolve(std::string_view key, Platform platform);

  struct CachedArray {
    void* data;
    int device;
    bool writable;
    PyObject* array;  // strong reference
    // The object every view of `array` refers to (the simulator's numpy
    // array, the device memory's owner), or null; strong reference.
    PyObject* root;
    // Reference counts with only numbax holding them: more after func
    // returns means func kept the array or a view of it.
    Py_ssize_t array_refs;
    Py_ssize_t root_refs;
  };
  // A few arrays per buffer slot: XLA rotates among a handful of addresses
  // for the same call site, so a tiny most-recently-used list hits.
  static constexpr size_t kArraysPerSlot = 8;

  PyObject* ArrayFor(size_t slot, const BufferView& view, Platform platform,
                     int device, bool writable);
  // After func returned: the error naming the first argument func kept a
  // reference to (and drops that array from the cache), or success.
  ::xla::ffi::Error CheckNothingKept(PyObject* const* args, size_t n,
                                     Platform platform);

  std::string key_;
  PyObject* func_ = nullptr;  // strong reference
  int64_t num_inputs_ = 0;
  int64_t num_outputs_ = 0;
  int64_t num_scratch_ = 0;
  bool fast_launch_ = false;
  std::vector<std::vector<CachedArray>> slots_;
  int active_calls_ = 0;  // Invoke calls running func now (under the GIL)
};

// One state type per platform. XLA's CPU runtime and the CUDA plugin keep
// separate type registries and each writes the id it assigns into the
// TypeId it is given: a TypeId shared by both would carry the CPU id into
// the plugin, where it names another type (and another deleter).
struct CpuCallSite final : CallSite {
  static ::xla::ffi::TypeId id;
};
struct CudaCallSite final : CallSite {
  static ::xla::ffi::TypeId id;
  GraphCache graphs;  // used by capture mode only
};

// The Numba stream object for an XLA stream on a device (cached, bounded).
// Returns a borrowed reference, or nullptr with a Python error set.
PyObject* StreamFor(Platform platform, int device, void* stream);

// Drops all cached streams.
void ClearStreamCache();

// Formats the pending Python exception (type, message, traceback) and clears
// it. Must be called with the GIL held and an exception set.
std::string TakePythonError();

}  // namespace numbax
