#include "fast_launch.h"

#include <structmember.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "cuda_driver.h"
#include "kernel_args.h"

namespace numbax {
namespace {

// Scalars are packed into the low bytes of 8-byte words (PackScalar).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the fast launch path packs scalars for little-endian hosts");

constexpr const char* kReasonNames[kFallbackReasonCount] = {
    "disabled",     "simulator",         "other_thread",
    "other_stream", "foreign_argument",  "unsupported_kernel",
    "new_plan",     "launch_error",      "numba_error",
    "plan_error",   "signature_mismatch"};

thread_local const ActiveCall* t_active = nullptr;
// Calls in flight on any thread: a launch from a thread with no call of its
// own is counted as 'other_thread' only while some call runs.
std::atomic<int64_t> g_active_calls{0};

void Count(int reason) { ++FastCounters().fallbacks[reason]; }

// Dry runs (tests only, see SetDryRun): the last launch, as it would reach
// the driver.
bool g_dry_run = false;
struct DryLaunch {
  uintptr_t function = 0;
  unsigned grid[3] = {0, 0, 0};
  unsigned block[3] = {0, 0, 0};
  unsigned shared_mem = 0;
  bool cooperative = false;
  uintptr_t stream = 0;
  std::vector<int64_t> words;
};
DryLaunch& LastDryLaunch() {
  static auto* last = new DryLaunch();
  return *last;
}

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

// What a launch's argument types look like to Numba's dispatcher: an array
// numbax handed to func, or a view of one, is (layout, dtype, rank), exactly
// Numba's array type; anything else its Python type (the plan builder
// accepts only scalar types whose Numba type depends on the type alone; a
// Python int must fit int64).
constexpr uint64_t kArrayTag = uint64_t{1} << 63;

uint64_t ArrayCode(char layout, ffi::DataType dtype, int64_t rank) {
  return kArrayTag |
         (static_cast<uint64_t>(static_cast<unsigned char>(layout)) << 40) |
         (static_cast<uint64_t>(dtype) << 8) | static_cast<uint64_t>(rank);
}

// How a launch argument is passed, per position: slot >= 0 is buffer
// `slot`'s own array; kViewC/F/A a view of a buffer with that Numba layout
// (its geometry in the launch's ViewInfo); kOther anything else.
constexpr int kOther = -1;
constexpr int kViewC = -2;
constexpr int kViewF = -3;
constexpr int kViewA = -4;

// A slice or reshape of one of the call's buffers, as Numba would pack it.
struct ViewInfo {
  void* data = nullptr;
  int64_t rank = 0;
  size_t itemsize = 0;
  int64_t dims[kMaxRank];
  int64_t strides[kMaxRank];
};

PyObject* Interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) PyErr_Clear();
  return o;  // kept for the process
}

bool ReadDims(PyObject* t, int64_t* out, int64_t* rank) {
  if (!t || !PyTuple_Check(t) || PyTuple_GET_SIZE(t) > kMaxRank) return false;
  *rank = PyTuple_GET_SIZE(t);
  for (Py_ssize_t i = 0; i < *rank; ++i) {
    PyObject* v = PyTuple_GET_ITEM(t, i);
    if (!PyLong_Check(v)) return false;
    int overflow = 0;
    out[i] = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (out[i] == -1 && PyErr_Occurred())) return false;
  }
  return true;
}

// Recognises `a` as a view (a slice or reshape) of one of the call's
// buffers: a Numba device array of the same type as numbax's, whose every
// byte lies inside one buffer of the same dtype. Fills `view` and `code`
// (the array's Numba type, as ArrayCode) and returns its kView* kind, or
// kOther. Reads only plain attributes and the data pointer, as Numba's
// packing does; any surprise means kOther, and the launch goes to Numba.
int RecogniseView(PyObject* a, const ActiveCall& call, ViewInfo* view,
                  uint64_t* code) {
  const std::vector<BufferView>& buffers = *call.buffers;
  if (buffers.empty()) return kOther;
  // numbax's arrays are a DeviceNDArray subclass; Numba makes some views of
  // them (squeeze, view) as plain DeviceNDArrays, its base.
  PyTypeObject* own = Py_TYPE(call.arrays[0]);
  if (Py_TYPE(a) != own &&
      (Py_TYPE(a) != own->tp_base || own->tp_base == &PyBaseObject_Type)) {
    return kOther;
  }
  static PyObject* s_shape = Interned("shape");
  static PyObject* s_strides = Interned("strides");
  static PyObject* s_dtype = Interned("dtype");
  static PyObject* s_pointer = Interned("device_ctypes_pointer");
  static PyObject* s_value = Interned("value");
  if (!s_shape || !s_strides || !s_dtype || !s_pointer || !s_value) {
    return kOther;
  }
  int kind = kOther;
  int64_t strides_rank = -1;
  PyObject* shape = PyObject_GetAttr(a, s_shape);
  PyObject* strides = shape ? PyObject_GetAttr(a, s_strides) : nullptr;
  PyObject* dtype = strides ? PyObject_GetAttr(a, s_dtype) : nullptr;
  PyObject* pointer = dtype ? PyObject_GetAttr(a, s_pointer) : nullptr;
  PyObject* value = pointer ? PyObject_GetAttr(pointer, s_value) : nullptr;
  uintptr_t data = 0;
  bool ok = value && ReadDims(shape, view->dims, &view->rank) &&
            ReadDims(strides, view->strides, &strides_rank) &&
            strides_rank == view->rank;
  if (ok && value != Py_None) {
    data = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(value));
    ok = !PyErr_Occurred();
  }
  ok = ok && data != 0;
  for (size_t j = 0; ok && j < buffers.size(); ++j) {
    const BufferView& b = buffers[j];
    const DTypeInfo* info = LookupDType(b.dtype);
    const uintptr_t base = reinterpret_cast<uintptr_t>(b.data);
    if (!info || base == 0 || data < base || data >= base + b.nbytes) continue;
    // The extent of the view: its lowest and highest byte, overflow-checked.
    const int64_t itemsize = static_cast<int64_t>(info->itemsize);
    int64_t lo = 0, hi = itemsize, elements = 1;
    bool fits = true;
    for (int64_t d = 0; fits && d < view->rank; ++d) {
      int64_t reach;
      if (view->dims[d] <= 0 ||
          __builtin_mul_overflow(view->dims[d] - 1, view->strides[d], &reach) ||
          __builtin_add_overflow(reach < 0 ? lo : hi, reach,
                                 reach < 0 ? &lo : &hi) ||
          __builtin_mul_overflow(elements, view->dims[d], &elements)) {
        fits = false;
      }
    }
    const int64_t offset = static_cast<int64_t>(data - base);
    if (!fits || offset + lo < 0 ||
        offset + hi > static_cast<int64_t>(b.nbytes)) {
      continue;
    }
    PyObject* own_dtype = PyObject_GetAttr(call.arrays[j], s_dtype);
    const bool same_dtype = own_dtype == dtype;
    Py_XDECREF(own_dtype);
    if (!same_dtype) continue;
    const char layout =
        NumbaArrayLayout(view->dims, view->strides, view->rank, itemsize);
    if (layout == 0) break;
    view->data = reinterpret_cast<void*>(data);
    view->itemsize = info->itemsize;
    *code = ArrayCode(layout, b.dtype, view->rank);
    kind = layout == 'C' ? kViewC : layout == 'F' ? kViewF : kViewA;
    break;
  }
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  Py_XDECREF(dtype);
  Py_XDECREF(pointer);
  Py_XDECREF(value);
  if (PyErr_Occurred()) PyErr_Clear();
  return kind;
}

struct PlanKey {
  PyObject* cfg = nullptr;
  int device = -1;
  std::vector<uint64_t> codes;
  bool operator==(const PlanKey& o) const {
    return cfg == o.cfg && device == o.device && codes == o.codes;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = reinterpret_cast<uintptr_t>(k.cfg) * 0x9E3779B97F4A7C15ull;
    h ^= static_cast<uint64_t>(k.device) + 0x632BE59BD9B4E019ull + (h << 6);
    for (uint64_t c : k.codes)
      h ^= c + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// One recorded launch. Holds strong references: the configuration (so its
// address, part of the key, cannot be reused by another object while the
// plan exists), the compiled kernel (whose module owns `function`), and
// the objects checked per launch.
struct Plan {
  PyObject* cfg = nullptr;
  PyObject* keep = nullptr;
  PyObject* overloads = nullptr;  // the dispatcher's overloads dict
  Py_ssize_t overload_count = 0;
  PyObject* callbacks = nullptr;  // cfg.pre_launch_callbacks (a list)
  void* stream = nullptr;         // the stream the configuration launches on
  int reason = -1;                // >= 0: never fast, for this reason
  // What cuLaunchKernel launches: the current context's CUfunction of the
  // kernel (ResolveFunction), or, where that was not looked up, the
  // CUkernel Numba launches (cuLaunchKernel takes one in place of a
  // CUfunction since CUDA 12 and runs it in the current context).
  cuda::CUfunction function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
  bool cooperative = false;
  std::string packing;  // per argument: A array, i int, b bool, f float32,
                        // d float64, c complex64, z complex128, M array of
                        // a numba-cuda-mlir kernel (an MLIR memref)
  ArrayAbi abi = ArrayAbi::kNumba;  // kMemref when packing has an M

  ~Plan() {
    Py_XDECREF(cfg);
    Py_XDECREF(keep);
    Py_XDECREF(overloads);
    Py_XDECREF(callbacks);
  }
};

using PlanMap = std::unordered_map<PlanKey, std::shared_ptr<Plan>, PlanKeyHash>;
PlanMap& Plans() {
  static auto* plans = new PlanMap();  // leaked on purpose (exit order)
  return *plans;
}
// A func that builds a new configuration per call (a new stream object,
// a computed grid) makes a new plan each time; the cache is emptied when it
// grows past this, rather than growing without bound.
constexpr size_t kMaxPlans = 4096;

struct LaunchHook {
  PyObject_HEAD PyObject* original;
  PyObject* check;
  PyObject* plan;
  vectorcallfunc vectorcall;
};

PyObject* CallOriginal(LaunchHook* hook, PyObject* const* args, size_t nargsf,
                       PyObject* kwnames) {
  return PyObject_Vectorcall(hook->original, args, nargsf, kwnames);
}

bool ParseDims(PyObject* t, unsigned out[3]) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) return false;
  for (Py_ssize_t i = 0; i < 3; ++i) {
    unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, i));
    if (PyErr_Occurred() || v > 0xFFFFFFFFul) {
      PyErr_Clear();
      return false;
    }
    out[i] = static_cast<unsigned>(v);
  }
  return true;
}

// Fills `plan` from the builder's tuple (function, grid, block, shared_mem,
// cooperative, packing, keep, overloads, callbacks). False if malformed.
bool ParsePlan(PyObject* t, Plan* plan) {
  PyObject *grid, *block, *packing, *keep, *overloads, *callbacks;
  unsigned long long function, shared_mem;
  int cooperative;
  if (!PyTuple_Check(t) ||
      !PyArg_ParseTuple(t, "KOOKpUOOO", &function, &grid, &block, &shared_mem,
                        &cooperative, &packing, &keep, &overloads,
                        &callbacks)) {
    PyErr_Clear();
    return false;
  }
  if (!ParseDims(grid, plan->grid) || !ParseDims(block, plan->block) ||
      shared_mem > 0xFFFFFFFFull || function == 0 || !PyDict_Check(overloads) ||
      !PyList_Check(callbacks)) {
    return false;
  }
  const char* p = PyUnicode_AsUTF8(packing);
  if (!p) {
    PyErr_Clear();
    return false;
  }
  plan->packing = p;
  for (char c : plan->packing) {
    if (!std::strchr("AibfdczM", c)) return false;
  }
  // One kernel, one compiler: Numba's arrays and memrefs never mix.
  const bool memref = plan->packing.find('M') != std::string::npos;
  if (memref && plan->packing.find('A') != std::string::npos) return false;
  plan->abi = memref ? ArrayAbi::kMemref : ArrayAbi::kNumba;
  plan->function = reinterpret_cast<cuda::CUfunction>(function);
  plan->shared_mem = static_cast<unsigned>(shared_mem);
  plan->cooperative = cooperative != 0;
  Py_INCREF(keep);
  plan->keep = keep;
  Py_INCREF(overloads);
  plan->overloads = overloads;
  plan->overload_count = PyDict_GET_SIZE(overloads);
  Py_INCREF(callbacks);
  plan->callbacks = callbacks;
  return true;
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
  // configuration just succeeded, so the function already allows it, and
  // setting the limit to this launch's size could lower one the user set.
  if (cuda::KernelFunction(*driver,
                           reinterpret_cast<cuda::CUkernel>(plan->function), 0,
                           &function, &error) &&
      function != nullptr) {
    plan->function = function;
  }
}

void StorePlan(const PlanKey& key, std::shared_ptr<Plan> plan) {
  PlanMap& plans = Plans();
  if (plans.size() >= kMaxPlans) ClearLaunchPlans();
  Py_INCREF(key.cfg);
  plan->cfg = key.cfg;
  // A plan replaced here is released only once the map is consistent again:
  // releasing it may run Python (a finaliser) that uses the cache.
  std::shared_ptr<Plan>& slot = Plans()[key];
  std::shared_ptr<Plan> replaced = std::move(slot);
  slot = std::move(plan);
}

// Appends one scalar as an 8-byte word: cuLaunchKernel reads the parameter's
// own size from its start, i.e. the low bytes (little-endian), which is how
// ctypes truncates an int to a narrower C type too.
bool PackScalar(char how, PyObject* value, KernelArgs* packed) {
  int64_t word = 0;
  switch (how) {
    case 'i': {
      unsigned long long v = PyLong_AsUnsignedLongLongMask(value);
      if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        return false;
      }
      std::memcpy(&word, &v, sizeof v);
      break;
    }
    case 'b': {
      int t = PyObject_IsTrue(value);
      if (t < 0) return false;
      word = t;
      break;
    }
    case 'f':
    case 'd': {
      double d = PyFloat_AsDouble(value);
      if (d == -1.0 && PyErr_Occurred()) return false;
      if (how == 'f') {
        float f = static_cast<float>(d);
        std::memcpy(&word, &f, sizeof f);
      } else {
        std::memcpy(&word, &d, sizeof d);
      }
      break;
    }
    case 'c':
    case 'z': {
      Py_complex c = PyComplex_AsCComplex(value);
      if (c.real == -1.0 && PyErr_Occurred()) return false;
      int64_t imag = 0;
      if (how == 'c') {
        float re = static_cast<float>(c.real), im = static_cast<float>(c.imag);
        std::memcpy(&word, &re, sizeof re);
        std::memcpy(&imag, &im, sizeof im);
      } else {
        std::memcpy(&word, &c.real, sizeof c.real);
        std::memcpy(&imag, &c.imag, sizeof c.imag);
      }
      packed->AddWord(word);
      packed->AddWord(imag);
      return true;
    }
    default:
      return false;
  }
  packed->AddWord(word);
  return true;
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

// A launch with no plan yet: ask the Python builder whether it may be fast,
// let Numba launch it (compiling it if needed), then record the plan.
PyObject* LaunchAndRecord(LaunchHook* hook, const ActiveCall& call, PlanKey key,
                          const std::vector<int>& slots, PyObject* const* args,
                          size_t nargsf, PyObject* kwnames) {
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
  PyObject* verdict = PyObject_CallFunction(hook->check, "OOOi", cfg,
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
  PyObject* result = CallOriginal(hook, args, nargsf, kwnames);
  if (!result) {
    Py_DECREF(kernel_args);
    Py_DECREF(ours);
    Count(kFallbackNumbaError);
    return nullptr;
  }
  // Numba launched it; from here on errors are numbax's own and must not
  // reach func.
  PyObject* built = PyObject_CallFunction(hook->plan, "OOOi", cfg, kernel_args,
                                          ours, call.device);
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
  if (views.size() < static_cast<size_t>(n)) views.resize(n);
  const std::vector<BufferView>& buffers = *call->buffers;
  for (Py_ssize_t i = 1; i < n; ++i) {
    PyObject* a = args[i];
    int slot = kOther;
    for (size_t j = 0; j < buffers.size(); ++j) {
      if (call->arrays[j] == a) {
        slot = static_cast<int>(j);
        break;
      }
    }
    if (slot >= 0) {
      const BufferView& v = buffers[static_cast<size_t>(slot)];
      slots.push_back(slot);
      key.codes.push_back(ArrayCode('C', v.dtype, v.rank));
      continue;
    }
    uint64_t code = 0;
    slot = RecogniseView(a, *call, &views[static_cast<size_t>(i - 1)], &code);
    slots.push_back(slot);
    if (slot != kOther) {
      key.codes.push_back(code);
      continue;
    }
    if (PyLong_CheckExact(a)) {
      // Numba types an int that does not fit int64 as uint64 (or refuses
      // it): such a value is not the type the plan was recorded for.
      int overflow = 0;
      PyLong_AsLongLongAndOverflow(a, &overflow);
      if (overflow != 0) {
        Count(kFallbackForeignArgument);
        return CallOriginal(hook, args, nargsf, kwnames);
      }
    }
    key.codes.push_back(reinterpret_cast<uintptr_t>(Py_TYPE(a)));
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
        it->second->stream == call->stream))) {
    // A new overload was compiled since (Numba's dispatch may now choose
    // another one for these types), or a configuration first seen on
    // another stream now launches on numbax's: record the plan again.
    stale = std::move(it->second);
    plans.erase(it);
    it = plans.end();
  }
  if (it == plans.end()) {
    return LaunchAndRecord(hook, *call, key, slots, args, nargsf, kwnames);
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

  thread_local KernelArgs packed;
  packed.Reset(plan->abi);
  for (Py_ssize_t i = 1; i < n; ++i) {
    const char how = plan->packing[static_cast<size_t>(i - 1)];
    if (how == 'A' || how == 'M') {
      const int slot = slots[static_cast<size_t>(i - 1)];
      if (slot <= kViewC) {
        const ViewInfo& v = views[static_cast<size_t>(i - 1)];
        packed.AddStridedArray(v.data, v.dims, v.strides, v.rank, v.itemsize);
        continue;
      }
      if (slot < 0) {  // cannot happen: the key says which are arrays
        Count(kFallbackPlanError);
        return CallOriginal(hook, args, nargsf, kwnames);
      }
      const BufferView& v = buffers[static_cast<size_t>(slot)];
      const DTypeInfo* info = LookupDType(v.dtype);
      if (!info) {
        Count(kFallbackPlanError);
        return CallOriginal(hook, args, nargsf, kwnames);
      }
      packed.AddArray(v.data, v.dims, v.rank, info->itemsize);
    } else if (!PackScalar(how, args[i], &packed)) {
      // A value Numba's packing would refuse too: let it say so.
      PyErr_Clear();
      Count(kFallbackForeignArgument);
      return CallOriginal(hook, args, nargsf, kwnames);
    }
  }

  const Plan& p = *plan;
  if (g_dry_run) {
    DryLaunch& d = LastDryLaunch();
    d.function = reinterpret_cast<uintptr_t>(p.function);
    std::memcpy(d.grid, p.grid, sizeof d.grid);
    std::memcpy(d.block, p.block, sizeof d.block);
    d.shared_mem = p.shared_mem;
    d.cooperative = p.cooperative;
    d.stream = reinterpret_cast<uintptr_t>(call->stream);
    d.words = packed.words();
    ++FastCounters().fast;
    Py_RETURN_NONE;
  }
  const cuda::Driver* driver = cuda::Load();
  void** params = packed.params();
  const auto stream = static_cast<cuda::CUstream>(call->stream);
  cuda::CUresult r;
  if (driver == nullptr) {
    r = 3;  // CUDA_ERROR_NOT_INITIALIZED: let Numba report it
  } else {
    // Without the GIL, as Numba's launch (cuda-bindings) does: a launch
    // may block while the stream's queue is full, and work queued before
    // it (a host callback) may need the GIL to drain. `plan` is held until
    // the GIL is back, so its Python references are released with it.
    Py_BEGIN_ALLOW_THREADS;
    r = cuda::LaunchKernel(*driver, p.function, p.grid, p.block, p.shared_mem,
                           p.cooperative, stream, params);
    Py_END_ALLOW_THREADS;
  }
  if (r != cuda::CUDA_SUCCESS) {
    // Nothing was launched: Numba's launch runs it, or raises its own error.
    Count(kFallbackLaunchError);
    return CallOriginal(hook, args, nargsf, kwnames);
  }
  ++FastCounters().fast;
  Py_RETURN_NONE;
}

PyObject* HookDescrGet(PyObject* self, PyObject* obj, PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

void HookDealloc(PyObject* self) {
  auto* hook = reinterpret_cast<LaunchHook*>(self);
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(hook->original);
  Py_XDECREF(hook->check);
  Py_XDECREF(hook->plan);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef kHookMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(LaunchHook, vectorcall)), READONLY,
     nullptr},
    {"original", T_OBJECT,
     static_cast<Py_ssize_t>(offsetof(LaunchHook, original)), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyTypeObject* HookType() {
  static PyTypeObject* type = [] {
    PyType_Slot slots[] = {
        {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
        {Py_tp_descr_get, reinterpret_cast<void*>(HookDescrGet)},
        {Py_tp_dealloc, reinterpret_cast<void*>(HookDealloc)},
        {Py_tp_members, kHookMembers},
        {Py_tp_doc,
         const_cast<char*>("numbax's replacement for Numba's launch: fast "
                           "inside numbax calls, Numba's own elsewhere")},
        {0, nullptr}};
    // METHOD_DESCRIPTOR: as a class attribute it is called with the
    // instance prepended, like a function, without a bound method per call.
    PyType_Spec spec = {"numbax._core.LaunchHook", sizeof(LaunchHook), 0,
                        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL |
                            Py_TPFLAGS_METHOD_DESCRIPTOR,
                        slots};
    return reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
  }();
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

PyObject* NewLaunchHook(PyObject* original, PyObject* check, PyObject* plan) {
  PyTypeObject* type = HookType();
  if (!type) return nullptr;
  if (!PyCallable_Check(original) || !PyCallable_Check(check) ||
      !PyCallable_Check(plan)) {
    PyErr_SetString(PyExc_TypeError,
                    "launch hook: original, check and plan must be callable");
    return nullptr;
  }
  auto* hook = PyObject_New(LaunchHook, type);
  if (!hook) return nullptr;
  Py_INCREF(original);
  Py_INCREF(check);
  Py_INCREF(plan);
  hook->original = original;
  hook->check = check;
  hook->plan = plan;
  hook->vectorcall = HookVectorcall;
  return reinterpret_cast<PyObject*>(hook);
}

bool NoteSimulatorLaunch() {
  if (t_active == nullptr) return false;
  Count(kFallbackSimulator);
  return true;
}

PyObject* PackScalarForTest(char how, PyObject* value) {
  KernelArgs packed;
  if (!PackScalar(how, value, &packed)) {
    if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_ValueError, "cannot pack as '%c'", how);
    }
    return nullptr;
  }
  return PyBytes_FromStringAndSize(
      reinterpret_cast<const char*>(packed.words().data()),
      static_cast<Py_ssize_t>(packed.size() * sizeof(int64_t)));
}

void SetDryRun(bool on) { g_dry_run = on; }

void SetResolveFunctions(bool on) { g_resolve_functions = on; }

PyObject* LastLaunch() {
  const DryLaunch& d = LastDryLaunch();
  PyObject* words = PyList_New(static_cast<Py_ssize_t>(d.words.size()));
  if (!words) return nullptr;
  for (size_t i = 0; i < d.words.size(); ++i) {
    PyObject* w = PyLong_FromLongLong(d.words[i]);
    if (!w) {
      Py_DECREF(words);
      return nullptr;
    }
    PyList_SET_ITEM(words, static_cast<Py_ssize_t>(i), w);
  }
  return Py_BuildValue(
      "{s:K,s:(III),s:(III),s:I,s:O,s:K,s:N}", "function",
      static_cast<unsigned long long>(d.function), "grid", d.grid[0], d.grid[1],
      d.grid[2], "block", d.block[0], d.block[1], d.block[2], "shared_mem",
      d.shared_mem, "cooperative", d.cooperative ? Py_True : Py_False, "stream",
      static_cast<unsigned long long>(d.stream), "words", words);
}

PyObject* CallAsNumbax(PyObject* func, PyObject* arrays, PyObject* buffers,
                       void* stream, int device, bool enabled) {
  if (!PyTuple_Check(arrays) || !PyList_Check(buffers) ||
      PyTuple_GET_SIZE(arrays) != PyList_GET_SIZE(buffers)) {
    PyErr_SetString(PyExc_ValueError,
                    "arrays (a tuple) and buffers (a list) must match");
    return nullptr;
  }
  static const ffi::DataType kTypes[] = {
      ffi::DataType::PRED, ffi::DataType::S8,  ffi::DataType::S16,
      ffi::DataType::S32,  ffi::DataType::S64, ffi::DataType::U8,
      ffi::DataType::U16,  ffi::DataType::U32, ffi::DataType::U64,
      ffi::DataType::F16,  ffi::DataType::F32, ffi::DataType::F64,
      ffi::DataType::C64,  ffi::DataType::C128};
  const Py_ssize_t n = PyList_GET_SIZE(buffers);
  std::vector<std::vector<int64_t>> dims(static_cast<size_t>(n));
  std::vector<BufferView> views(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    unsigned long long address;
    const char* dtype;
    PyObject* shape;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(buffers, i), "KsO!", &address, &dtype,
                          &PyTuple_Type, &shape)) {
      return nullptr;
    }
    BufferView& v = views[static_cast<size_t>(i)];
    for (ffi::DataType t : kTypes) {
      if (std::strcmp(LookupDType(t)->name, dtype) == 0) v.dtype = t;
    }
    const DTypeInfo* info = LookupDType(v.dtype);
    if (!info) {
      PyErr_Format(PyExc_ValueError, "unknown dtype %s", dtype);
      return nullptr;
    }
    std::vector<int64_t>& d = dims[static_cast<size_t>(i)];
    int64_t count = 1;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(shape); ++k) {
      d.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, k)));
      if (PyErr_Occurred()) return nullptr;
      count *= d.back();
    }
    v.data = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
    v.dims = d.data();
    v.rank = static_cast<int64_t>(d.size());
    v.element_count = count;
    v.nbytes = static_cast<size_t>(count) * info->itemsize;
  }
  ActiveCall call;
  call.buffers = &views;
  call.arrays = &PyTuple_GET_ITEM(arrays, 0);
  call.stream = stream;
  call.device = device;
  call.cuda = true;
  call.enabled = enabled;
  ActiveCallScope scope(&call);
  return PyObject_CallNoArgs(func);
}

void ClearLaunchPlans() {
  // Swapped out first: dropping a reference may run Python (a finaliser)
  // that launches again and touches the cache.
  PlanMap dropped;
  dropped.swap(Plans());
}

size_t LaunchPlanCount() { return Plans().size(); }

std::vector<uintptr_t> LaunchPlanFunctions() {
  std::vector<uintptr_t> functions;
  for (const auto& [key, plan] : Plans()) {
    if (plan->reason < 0) {
      functions.push_back(reinterpret_cast<uintptr_t>(plan->function));
    }
  }
  return functions;
}

}  // namespace numbax
