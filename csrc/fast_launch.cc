#include "fast_launch.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "cuda_driver.h"
#include "fast_launch_plans.h"
#include "kernel_args.h"
#include "launch_args.h"
#include "method_hook.h"

namespace numbax {
namespace {

constexpr const char* kReasonNames[kFallbackReasonCount] = {
    "disabled",     "simulator",         "other_thread",
    "other_stream", "foreign_argument",  "unsupported_kernel",
    "new_plan",     "launch_error",      "numba_error",
    "plan_error",   "signature_mismatch"};

thread_local const ActiveCall* t_active = nullptr;
// Calls in flight on any thread: a launch from a thread with no call of its
// own is counted as 'other_thread' only while some call runs.
std::atomic<int64_t> g_active_calls{0};

// The reason of this thread's latest fallback (a recording's log says it).
thread_local int t_last_reason = kFallbackPlanError;

void Count(int reason) {
  ++FastCounters().fallbacks[reason];
  t_last_reason = reason;
}

// Where dry runs record (SetDryLaunchRecord); nullptr: launches are real.
DryLaunch* g_dry_run = nullptr;

int ReasonFromName(PyObject* name) {
  const char* s =
      name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
  if (!s) {
    PyErr_Clear();
    return kFallbackPlanError;
  }
  for (int i = 0; i < kFallbackReasonCount; ++i) {
    if (std::strcmp(s, kReasonNames[i]) == 0) return i;
  }
  return kFallbackPlanError;
}

// The launch hook is a MethodHook (method_hook.h) holding Numba's launch
// (`original`) and numbax's plan builders.
using LaunchHook = MethodHook;
constexpr int kCheck = 0;   // refs[kCheck]: numba_cuda_launch._check
constexpr int kPlan = 1;    // refs[kPlan]: numba_cuda_launch._plan
constexpr int kCached = 2;  // refs[kCached]: numba_cuda_launch._cached_plan

PyObject* CallOriginal(LaunchHook* hook, PyObject* const* args, size_t nargsf,
                       PyObject* kwnames) {
  return PyObject_Vectorcall(hook->original, args, nargsf, kwnames);
}

// Launch the context's own function rather than Numba's CUkernel (see
// SetResolveFunctions): looked up once, when the plan is recorded, on the
// device numbax bound (the plan's key). Not where the stream is being
// captured (XLA recording a command buffer, numbax recording a graph): a
// driver call there must not risk the capture, and a recorded launch costs
// nothing per call anyway. Any failure keeps the CUkernel, which works.
bool g_resolve_functions = true;

void ResolveFunction(const ActiveCall& call, Plan* plan) {
  if (!g_resolve_functions || g_dry_run) return;
  const cuda::Driver* driver = cuda::Load();
  if (driver == nullptr || driver->cuKernelGetFunction == nullptr ||
      driver->cuStreamIsCapturing == nullptr) {
    return;
  }
  int capturing = cuda::CU_STREAM_CAPTURE_STATUS_NONE;
  if (driver->cuStreamIsCapturing(static_cast<cuda::CUstream>(call.stream),
                                  &capturing) != cuda::CUDA_SUCCESS ||
      capturing != cuda::CU_STREAM_CAPTURE_STATUS_NONE) {
    return;
  }
  // The plan's device, whatever func made current since.
  cuda::ScopedDevice bound(*driver, call.device);
  if (bound.status() != cuda::CUDA_SUCCESS) return;
  cuda::CUfunction function = nullptr;
  std::string error;
  // Shared memory 0: no attribute is set. Numba's launch of this very
  // configuration just succeeded (a plan from a cache entry asks for at
  // most the 48 KiB a function allows unprepared), and setting the limit to
  // this launch's size could lower one the user set.
  if (cuda::KernelFunction(*driver,
                           reinterpret_cast<cuda::CUkernel>(plan->function), 0,
                           &function, &error) &&
      function != nullptr) {
    plan->function = function;
    plan->resolved = true;
  }
}

PyObject* NewTuple(PyObject* const* items, Py_ssize_t n) {
  PyObject* t = PyTuple_New(n);
  if (!t) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    Py_INCREF(items[i]);
    PyTuple_SET_ITEM(t, i, items[i]);
  }
  return t;
}

PyObject* IntTuple(const std::vector<int>& values) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  if (!t) return nullptr;
  for (size_t i = 0; i < values.size(); ++i) {
    PyObject* v = PyLong_FromLong(values[i]);
    if (!v) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), v);
  }
  return t;
}

enum class Launched { kYes, kForeignArgument, kPlanError, kDriverError };

// Packs `args` by `p` and sends the launch to the driver (or records it, in
// a dry run). Anything but kYes launched nothing: Numba's launch runs it.
Launched LaunchByPlan(const Plan& p, const ActiveCall& call,
                      PyObject* const* args, Py_ssize_t nargs,
                      const std::vector<int>& slots,
                      const std::vector<ViewInfo>& views) {
  thread_local KernelArgs packed;
  thread_local std::vector<AddressPatch> patches;
  packed.Reset(p.abi);
  const PackResult packing =
      PackLaunchArguments(p.packing, args, nargs, slots, views, *call.buffers,
                          &packed, call.log ? &patches : nullptr);
  if (packing != PackResult::kPacked) {
    return packing == PackResult::kForeignArgument ? Launched::kForeignArgument
                                                   : Launched::kPlanError;
  }
  if (g_dry_run) {
    DryLaunch& d = *g_dry_run;
    d.function = reinterpret_cast<uintptr_t>(p.function);
    std::memcpy(d.grid, p.grid, sizeof d.grid);
    std::memcpy(d.block, p.block, sizeof d.block);
    d.shared_mem = p.shared_mem;
    d.cooperative = p.cooperative;
    d.stream = reinterpret_cast<uintptr_t>(call.stream);
    d.words = packed.words();
    if (call.log) {
      call.log->AfterLaunch(p.function, !p.resolved, p.grid, p.block,
                            p.shared_mem, p.cooperative, packed.words(),
                            patches);
    }
    return Launched::kYes;
  }
  const cuda::Driver* driver = cuda::Load();
  if (driver == nullptr) return Launched::kDriverError;  // Numba reports it
  void** params = packed.params();
  const auto stream = static_cast<cuda::CUstream>(call.stream);
  if (call.log) call.log->BeforeLaunch();
  cuda::CUresult r;
  // Without the GIL, as Numba's launch (cuda-bindings) does: a launch may
  // block while the stream's queue is full, and work queued before it (a
  // host callback) may need the GIL to drain. The caller holds the plan
  // until the GIL is back, so its Python references are released with it.
  Py_BEGIN_ALLOW_THREADS;
  r = cuda::LaunchKernel(*driver, p.function, p.grid, p.block, p.shared_mem,
                         p.cooperative, stream, params);
  Py_END_ALLOW_THREADS;
  if (r != cuda::CUDA_SUCCESS) return Launched::kDriverError;
  if (call.log) {
    call.log->AfterLaunch(p.function, !p.resolved, p.grid, p.block,
                          p.shared_mem, p.cooperative, packed.words(), patches);
  }
  return Launched::kYes;
}

// Whether `stream` is being captured into a graph (or that is unknown):
// no module is loaded then (an unsafe call in a capture invalidates it).
bool MayBeCapturing(void* stream) {
  const cuda::Driver* driver = cuda::Load();
  if (driver == nullptr || driver->cuStreamIsCapturing == nullptr) return true;
  int capturing = cuda::CU_STREAM_CAPTURE_STATUS_NONE;
  return driver->cuStreamIsCapturing(static_cast<cuda::CUstream>(stream),
                                     &capturing) != cuda::CUDA_SUCCESS ||
         capturing != cuda::CU_STREAM_CAPTURE_STATUS_NONE;
}

// The first launch of a key in this process, where the kernel has an entry
// in numbax's cache: the plan from `_cached_plan`, launched and stored.
// False (nothing launched, nothing stored) where there is no such plan or
// it did not launch: Numba launches then, as for any new plan.
bool LaunchFromCachedPlan(LaunchHook* hook, const ActiveCall& call,
                          const PlanKey& key, PyObject* kernel_args,
                          PyObject* ours, PyObject* const* args,
                          Py_ssize_t nargs, const std::vector<int>& slots,
                          const std::vector<ViewInfo>& views) {
  if (hook->refs[kCached] == nullptr || !call.cached_plans) return false;
  if (g_dry_run == nullptr && MayBeCapturing(call.stream)) return false;
  PyObject* built = PyObject_CallFunction(hook->refs[kCached], "OOOi", key.cfg,
                                          kernel_args, ours, call.device);
  if (!built) {
    PyErr_Clear();  // a cache: Numba's launch is the answer
    return false;
  }
  auto plan = std::make_shared<Plan>();
  plan->stream = call.stream;
  plan->from_entry = true;
  const bool parsed = built != Py_None && ParsePlan(built, plan.get()) &&
                      plan->packing.size() == static_cast<size_t>(nargs);
  Py_DECREF(built);
  if (!parsed) return false;
  ResolveFunction(call, plan.get());
  if (LaunchByPlan(*plan, call, args, nargs, slots, views) != Launched::kYes) {
    return false;
  }
  ++FastCounters().fast;
  ++FastCounters().cached_plans;
  StorePlan(key, std::move(plan));
  return true;
}

// A launch with no plan yet: ask the Python builder whether it may be fast,
// launch it from numbax's cache entry of the kernel if there is one, else
// let Numba launch it (compiling it if needed), then record the plan.
PyObject* LaunchAndRecord(LaunchHook* hook, const ActiveCall& call, PlanKey key,
                          const std::vector<int>& slots,
                          const std::vector<ViewInfo>& views,
                          PyObject* const* args, size_t nargsf,
                          PyObject* kwnames) {
  // `key` is a copy: the Python run below may launch again on this thread
  // (Numba's own initialisation), which reuses the caller's thread-local key.
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  PyObject* cfg = args[0];
  PyObject* kernel_args = NewTuple(args + 1, n - 1);
  PyObject* ours = kernel_args ? IntTuple(slots) : nullptr;
  if (!ours) {
    Py_XDECREF(kernel_args);
    PyErr_Clear();
    Count(kFallbackPlanError);
    return CallOriginal(hook, args, nargsf, kwnames);
  }
  auto plan = std::make_shared<Plan>();
  PyObject* verdict = PyObject_CallFunction(hook->refs[kCheck], "OOOi", cfg,
                                            kernel_args, ours, call.device);
  PyObject* reason = nullptr;
  int store = 0;
  unsigned long long stream = 0;
  if (!verdict || !PyArg_ParseTuple(verdict, "OpK", &reason, &store, &stream)) {
    PyErr_Clear();
    plan->reason = kFallbackPlanError;
    plan->stream = call.stream;  // counted as what it is, not other_stream
    store = 1;
  } else {
    plan->stream = reinterpret_cast<void*>(static_cast<uintptr_t>(stream));
    if (reason != Py_None) plan->reason = ReasonFromName(reason);
  }
  Py_XDECREF(verdict);
  // A configuration for another stream is remembered as such, and no plan
  // is built for it (that costs a Python call per new configuration): the
  // stream is compared first on every launch, and should the configuration
  // ever launch on numbax's stream, its plan is recorded then.
  if (plan->reason < 0 && plan->stream != call.stream) {
    plan->reason = kFallbackOtherStream;
  }
  if (plan->reason >= 0) {
    Py_DECREF(kernel_args);
    Py_DECREF(ours);
    Count(plan->stream != call.stream ? kFallbackOtherStream : plan->reason);
    if (store) StorePlan(key, std::move(plan));
    return CallOriginal(hook, args, nargsf, kwnames);
  }
  if (LaunchFromCachedPlan(hook, call, key, kernel_args, ours, args + 1, n - 1,
                           slots, views)) {
    Py_DECREF(kernel_args);
    Py_DECREF(ours);
    Py_RETURN_NONE;
  }
  PyObject* result = CallOriginal(hook, args, nargsf, kwnames);
  if (!result) {
    Py_DECREF(kernel_args);
    Py_DECREF(ours);
    Count(kFallbackNumbaError);
    return nullptr;
  }
  // Numba launched it; from here on errors are numbax's own and must not
  // reach func.
  PyObject* built = PyObject_CallFunction(hook->refs[kPlan], "OOOi", cfg,
                                          kernel_args, ours, call.device);
  Py_DECREF(kernel_args);
  Py_DECREF(ours);
  if (!built) {
    PyErr_Clear();
    plan->reason = kFallbackPlanError;
  } else if (PyUnicode_Check(built)) {
    plan->reason = ReasonFromName(built);
  } else if (!ParsePlan(built, plan.get()) ||
             plan->packing.size() != static_cast<size_t>(n - 1)) {
    plan->reason = kFallbackPlanError;
  } else {
    ResolveFunction(call, plan.get());
  }
  Py_XDECREF(built);
  Count(plan->reason >= 0 ? plan->reason : kFallbackNewPlan);
  StorePlan(key, std::move(plan));
  return result;
}

PyObject* HookVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                         PyObject* kwnames) {
  auto* hook = reinterpret_cast<LaunchHook*>(self);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  const ActiveCall* call = t_active;
  // A recording's log learns of every launch that numbax did not log
  // itself (it went through Numba's launch): the recording is unmapped.
  struct LogGuard {
    LaunchLog* log;
    size_t before;
    ~LogGuard() {
      if (log && log->launches().size() == before) {
        log->Unmap(std::string("a launch went through Numba's own launch "
                               "(fast-launch fallback: ") +
                       FallbackReasonName(t_last_reason) + ")",
                   /*transient=*/t_last_reason == kFallbackNewPlan);
      }
    }
  } log_guard{call ? call->log : nullptr,
              call && call->log ? call->log->launches().size() : 0};
  if (log_guard.log) t_last_reason = -1;
  if (call == nullptr || n < 1 || kwnames != nullptr) {
    if (call == nullptr && g_active_calls.load(std::memory_order_relaxed) > 0) {
      Count(kFallbackOtherThread);
    }
    return CallOriginal(hook, args, nargsf, kwnames);
  }
  if (!call->cuda) {
    Count(kFallbackSimulator);
    return CallOriginal(hook, args, nargsf, kwnames);
  }
  if (!call->enabled) {
    Count(kFallbackDisabled);
    return CallOriginal(hook, args, nargsf, kwnames);
  }

  // Python run below (attribute reads, the plan builders, Numba's own
  // launch) may launch again on this thread, e.g. Numba initialising its
  // runtime; such a nested launch goes to Numba and leaves this launch's
  // thread-local state alone.
  thread_local int depth = 0;
  if (depth > 0) return CallOriginal(hook, args, nargsf, kwnames);
  struct Depth {
    Depth() { ++depth; }
    ~Depth() { --depth; }
  } in_launch;

  // The key: which arrays are numbax's (or views of them), and the other
  // arguments' types.
  thread_local PlanKey key;
  thread_local std::vector<int> slots;
  thread_local std::vector<ViewInfo> views;
  key.cfg = args[0];
  key.device = call->device;
  key.codes.clear();
  slots.clear();
  const std::vector<BufferView>& buffers = *call->buffers;
  if (!ReadLaunchArguments(args + 1, n - 1, buffers, call->arrays, &slots,
                           &views, &key.codes)) {
    Count(kFallbackForeignArgument);
    return CallOriginal(hook, args, nargsf, kwnames);
  }

  PlanMap& plans = Plans();
  auto it = plans.find(key);
  // Released when this launch is done, not inside the erase: releasing may
  // run Python that uses the cache or this thread's key.
  std::shared_ptr<Plan> stale;
  if (it != plans.end() &&
      ((it->second->reason < 0 &&
        PyDict_GET_SIZE(it->second->overloads) != it->second->overload_count) ||
       (it->second->reason == kFallbackOtherStream &&
        it->second->stream == call->stream) ||
       (it->second->from_entry && !call->cached_plans))) {
    // A new overload was compiled since (Numba's dispatch may now choose
    // another one for these types), a configuration first seen on another
    // stream now launches on numbax's, or a plan from a cache entry meets a
    // call whose launches Numba must load (a capture-mode warm-up): record
    // the plan again.
    stale = std::move(it->second);
    plans.erase(it);
    it = plans.end();
  }
  if (it == plans.end()) {
    return LaunchAndRecord(hook, *call, key, slots, views, args, nargsf,
                           kwnames);
  }
  // Held for the launch: nothing below runs Python that could clear the
  // cache, but a plan must outlive its use regardless.
  std::shared_ptr<Plan> plan = it->second;
  if (plan->stream != call->stream) {
    Count(kFallbackOtherStream);
    return CallOriginal(hook, args, nargsf, kwnames);
  }
  if (plan->reason >= 0) {
    Count(plan->reason);
    return CallOriginal(hook, args, nargsf, kwnames);
  }
  if (PyList_GET_SIZE(plan->callbacks) != 0) {
    // Callbacks registered after the plan was made run in Numba's launch.
    Count(kFallbackUnsupportedKernel);
    return CallOriginal(hook, args, nargsf, kwnames);
  }

  switch (LaunchByPlan(*plan, *call, args + 1, n - 1, slots, views)) {
    case Launched::kYes:
      ++FastCounters().fast;
      Py_RETURN_NONE;
    case Launched::kForeignArgument:
      Count(kFallbackForeignArgument);
      break;
    case Launched::kPlanError:
      Count(kFallbackPlanError);
      break;
    case Launched::kDriverError:
      // Nothing was launched: Numba's launch runs it, or raises its error.
      Count(kFallbackLaunchError);
      break;
  }
  return CallOriginal(hook, args, nargsf, kwnames);
}

PyTypeObject* HookType() {
  static PyTypeObject* type = NewMethodHookType("numbax._core.LaunchHook");
  return type;
}

}  // namespace

const char* FallbackReasonName(int reason) {
  if (reason < 0 || reason >= kFallbackReasonCount) return "unknown";
  return kReasonNames[reason];
}

FastLaunchCounters& FastCounters() {
  static FastLaunchCounters counters;
  return counters;
}

ActiveCallScope::ActiveCallScope(const ActiveCall* call) : previous_(t_active) {
  t_active = call;
  g_active_calls.fetch_add(1, std::memory_order_relaxed);
}

ActiveCallScope::~ActiveCallScope() {
  g_active_calls.fetch_sub(1, std::memory_order_relaxed);
  t_active = previous_;
}

PyObject* NewLaunchHook(PyObject* original, PyObject* check, PyObject* plan,
                        PyObject* cached) {
  if (!PyCallable_Check(original) || !PyCallable_Check(check) ||
      !PyCallable_Check(plan) ||
      (cached != Py_None && !PyCallable_Check(cached))) {
    PyErr_SetString(PyExc_TypeError,
                    "launch hook: original, check and plan must be callable, "
                    "cached callable or None");
    return nullptr;
  }
  return NewMethodHook(HookType(), HookVectorcall, original,
                       {check, plan, cached == Py_None ? nullptr : cached});
}

bool NoteSimulatorLaunch() {
  if (t_active == nullptr) return false;
  Count(kFallbackSimulator);
  return true;
}

void SetResolveFunctions(bool on) { g_resolve_functions = on; }

void SetDryLaunchRecord(DryLaunch* record) { g_dry_run = record; }

}  // namespace numbax
