// Fast launches of Numba kernels from inside a plain numba_cuda_callable.
//
// A func that launches `kernel[grid, block, stream](arrays..., scalars...)`
// pays Numba's Python launch (argument typing, packing, the driver call
// through cuda.core: about 20 us) on every call. numbax replaces
// `_LaunchConfiguration.__call__` with a LaunchHook: while numbax runs a func
// on this thread, a launch on the stream numbax gave func, whose arguments
// are arrays numbax handed to func and plain scalars, is packed here in
// Numba's kernel ABI and sent to cuLaunchKernel, from a plan cached per
// (launch configuration, device, argument types). Everything else, and the
// first launch of each plan, goes to Numba's own launch unchanged.
// Everything here runs with the GIL held.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

#include "call_frame.h"
#include "launch_log.h"

namespace numbax {

// Why a launch made inside a numbax call went through Numba's launch.
enum FallbackReason : int {
  kFallbackDisabled = 0,       // switched off (env var or fast_launch=False)
  kFallbackSimulator,          // Numba's CUDA simulator: nothing to speed up
  kFallbackOtherThread,        // launched from a thread numbax is not calling
  kFallbackOtherStream,        // not on the stream numbax gave func
  kFallbackForeignArgument,    // an array numbax did not hand to func, or an
                               // argument type the fast path does not pack
  kFallbackUnsupportedKernel,  // debug=True, extensions, launch callbacks,
                               // launch-config-sensitive kernels
  kFallbackNewPlan,            // first launch of a plan: Numba launches (and
                               // compiles) it, numbax records the plan
  kFallbackLaunchError,        // cuLaunchKernel refused: Numba relaunches and
                               // raises its own error
  kFallbackNumbaError,         // Numba's launch raised (typing, compilation,
                               // configuration): the error reaches func
  kFallbackPlanError,          // numbax could not build a plan (a bug: the
                               // launch still ran through Numba)
  kFallbackSignatureMismatch,  // the kernel's one explicit signature does not
                               // take these arrays: Numba launches it
                               // unchecked, numbax never replays that
  kFallbackReasonCount
};

const char* FallbackReasonName(int reason);

struct FastLaunchCounters {
  uint64_t fast = 0;
  // Plans built from numbax's cache entry of the kernel (no Numba launch
  // first: src/numbax/compilers/numba_cuda_launch.py, _cached_plan); their
  // launches count in `fast` too.
  uint64_t cached_plans = 0;
  uint64_t fallbacks[kFallbackReasonCount] = {};
};
FastLaunchCounters& FastCounters();

// The numbax call running on this thread, as launches made by func see it.
struct ActiveCall {
  const std::vector<BufferView>* buffers = nullptr;
  PyObject* const* arrays = nullptr;  // arrays[i] wraps (*buffers)[i]
  void* stream = nullptr;             // the stream numbax gave func
  int device = -1;
  bool cuda = false;
  bool enabled = false;  // the fast path is on for this call site
  // A first launch may come from numbax's cache entry of the kernel (in
  // plain mode only: CallSite::Invoke).
  bool cached_plans = true;
  // A capture-mode recording: every launch func makes is logged here (one
  // numbax did not pack leaves the log unmapped: launch_log.h); or null.
  LaunchLog* log = nullptr;
};

// Publishes `call` on this thread for its scope (restoring the previous
// one after: calls do not nest today, but nothing here assumes it).
class ActiveCallScope {
 public:
  explicit ActiveCallScope(const ActiveCall* call);
  ~ActiveCallScope();
  ActiveCallScope(const ActiveCallScope&) = delete;
  ActiveCallScope& operator=(const ActiveCallScope&) = delete;

 private:
  const ActiveCall* previous_;
};

// A new LaunchHook (a new reference), or nullptr with a Python error set.
// `original` is Numba's `_LaunchConfiguration.__call__`; `check(cfg, args,
// ours, device)`, `plan(cfg, args, ours, device)` and `cached(cfg, args,
// ours, device)` are numbax's Python plan builders
// (src/numbax/compilers/numba_cuda_launch.py); `cached` may be None (no plans
// from a cache: numba-cuda-mlir's launcher).
PyObject* NewLaunchHook(PyObject* original, PyObject* check, PyObject* plan,
                        PyObject* cached);

// Counts a simulator launch made by func inside a numbax call (the
// simulator's own launch is never replaced). Returns true when one was
// counted.
bool NoteSimulatorLaunch();

// A fast launch as it would reach the driver (dry runs: fast_launch_testing.h).
struct DryLaunch {
  uintptr_t function = 0;
  unsigned grid[3] = {0, 0, 0};
  unsigned block[3] = {0, 0, 0};
  unsigned shared_mem = 0;
  bool cooperative = false;
  uintptr_t stream = 0;
  std::vector<int64_t> words;
};

// Test support: with a record set, a fast launch fills it instead of
// calling the driver (and plans keep Numba's CUkernel); nullptr, the
// default, launches.
void SetDryLaunchRecord(DryLaunch* record);

// Whether plans recorded from now on launch the current context's
// CUfunction of each kernel (the default) or Numba's CUkernel handle, as
// Numba does (for benchmarks that compare the two: python -m
// numbax.bench.bridge_cost). Plans already recorded keep theirs.
void SetResolveFunctions(bool on);

}  // namespace numbax
