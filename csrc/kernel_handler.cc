// Call frame -> device binding -> cuLaunchKernel, for numba_cuda_kernel.
#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "buffers.h"
#include "cuda_driver.h"
#include "kernel_args.h"
#include "kernel_handlers.h"
#include "python_bridge.h"

namespace numbax {
namespace {

PyObject* g_kernel_resolver = nullptr;

template <typename T, size_t N>
bool ParseTriple(PyObject* seq, std::array<T, N>* out) {
  if (!PyTuple_Check(seq) ||
      PyTuple_GET_SIZE(seq) != static_cast<Py_ssize_t>(N))
    return false;
  for (size_t i = 0; i < N; ++i) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
    // Out of T's range would be truncated into a different launch.
    if (v < 0 || PyErr_Occurred() ||
        static_cast<unsigned long long>(v) > std::numeric_limits<T>::max()) {
      return false;
    }
    (*out)[i] = static_cast<T>(v);
  }
  return true;
}

// Fills `plan` from the resolver's tuple. Returns an empty string or the
// reason it is malformed.
std::string ParsePlan(PyObject* t, LaunchPlan* plan, PyObject** owner) {
  PyObject *functions, *grid, *block, *broadcast;
  long long shared_mem;
  int cooperative, empty_launch;
  if (!PyArg_ParseTuple(t, "OOLLOOLppLOiL", owner, &functions,
                        &plan->num_inputs, &plan->num_outputs, &grid, &block,
                        &shared_mem, &cooperative, &empty_launch, &plan->batch,
                        &broadcast, &plan->fold_axis, &plan->max_slices)) {
    return TakePythonError();
  }
  if (plan->fold_axis != -1 && plan->fold_axis != 1 && plan->fold_axis != 2) {
    return "fold_axis must be -1, 1 or 2";
  }
  if (plan->max_slices < 1) return "max_slices must be >= 1";
  if (!PyTuple_Check(functions) || !PyTuple_Check(broadcast)) {
    return "functions and broadcast must be tuples";
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(functions); ++i) {
    unsigned long long f =
        PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(functions, i));
    if (PyErr_Occurred()) return TakePythonError();
    plan->functions.push_back(reinterpret_cast<cuda::CUfunction>(f));
  }
  if (!ParseTriple(grid, &plan->grid) || !ParseTriple(block, &plan->block)) {
    PyErr_Clear();
    return "grid and block must be 3-tuples of ints in [0, 2**32)";
  }
  if (PyTuple_GET_SIZE(broadcast) != plan->num_inputs) {
    return "broadcast needs one flag per input";
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(broadcast); ++i) {
    plan->broadcast.push_back(PyObject_IsTrue(PyTuple_GET_ITEM(broadcast, i)));
  }
  if (shared_mem < 0 || plan->batch < 0) return "negative launch parameter";
  if (static_cast<unsigned long long>(shared_mem) >
      std::numeric_limits<unsigned>::max()) {
    return "shared_mem does not fit in 32 bits";
  }
  plan->shared_mem = static_cast<unsigned>(shared_mem);
  plan->cooperative = cooperative != 0;
  plan->empty_launch = empty_launch != 0;
  return "";
}

ffi::ErrorOr<std::unique_ptr<KernelSite>> Instantiate(std::string_view key) {
  return KernelSite::Create(key);
}

ffi::Error Fail(const KernelSite& site, const std::string& what) {
  return ffi::Error::Internal("numbax kernel '" + site.key() + "': " + what);
}

ffi::Error LaunchError(const KernelSite& site, const cuda::Driver& driver,
                       cuda::CUresult r) {
  return Fail(site, "launch failed: " + cuda::ErrorText(driver, r));
}

cuda::CUresult Launch(const cuda::Driver& driver, const LaunchPlan& plan,
                      cuda::CUfunction function, cuda::CUstream stream,
                      const std::array<unsigned, 3>& grid, void** params) {
  if (plan.cooperative) {
    return driver.cuLaunchCooperativeKernel(
        function, grid[0], grid[1], grid[2], plan.block[0], plan.block[1],
        plan.block[2], plan.shared_mem, stream, params);
  }
  return driver.cuLaunchKernel(function, grid[0], grid[1], grid[2],
                               plan.block[0], plan.block[1], plan.block[2],
                               plan.shared_mem, stream, params, nullptr);
}

// vmap in one launch: the generated batched kernel gets whole batched
// buffers and takes slice blockIdx.<fold_axis> of each; batches above the
// axis's limit are split into chunks, each launched over its own slices.
ffi::Error LaunchFolded(const KernelSite& site, const cuda::Driver& driver,
                        cuda::CUfunction function, cuda::CUstream stream,
                        const std::vector<BufferView>& buffers) {
  const LaunchPlan& plan = site.plan();
  thread_local KernelArgs packed;
  for (int64_t start = 0; start < plan.batch; start += plan.max_slices) {
    const int64_t count = std::min(plan.max_slices, plan.batch - start);
    packed.Reset();
    for (size_t i = 0; i < buffers.size(); ++i) {
      const bool reuse = i < plan.broadcast.size() && plan.broadcast[i];
      if (!AddBatchChunk(buffers[i], plan.batch, start, count, reuse,
                         &packed)) {
        return Fail(site, "buffer " + std::to_string(i) + " (rank " +
                              std::to_string(buffers[i].rank) +
                              ") does not hold " + std::to_string(plan.batch) +
                              " slices along axis 0 for a vmapped launch");
      }
    }
    std::array<unsigned, 3> grid = plan.grid;
    grid[plan.fold_axis] = static_cast<unsigned>(count);
    cuda::CUresult r =
        Launch(driver, plan, function, stream, grid, packed.params());
    if (r != cuda::CUDA_SUCCESS) return LaunchError(site, driver, r);
  }
  return ffi::Error::Success();
}

ffi::Error Execute(void* stream_ptr, int32_t device, KernelSite* site,
                   std::string_view /*key*/, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  const LaunchPlan& plan = site->plan();
  thread_local std::vector<BufferView> buffers;
  if (ffi::Error err = DecodeCallBuffers(args, rets, plan.num_inputs,
                                         plan.num_outputs, &buffers);
      err.failure()) {
    return Fail(*site, err.message());
  }
  std::string why;
  const cuda::Driver* driver = cuda::Load(&why);
  if (!driver) return Fail(*site, why);
  auto stream = static_cast<cuda::CUstream>(stream_ptr);
  cuda::ScopedDevice bind(*driver, device);
  if (bind.status() != cuda::CUDA_SUCCESS) {
    return Fail(*site, "cannot bind device " + std::to_string(device) + ": " +
                           cuda::ErrorText(*driver, bind.status()));
  }

  if (plan.empty_launch) {
    // Nothing to launch, but outputs must never be returned uninitialised.
    // An output aliased to an input (XLA hands both the same buffer) keeps
    // the input's values: no kernel ran to change them.
    for (size_t i = plan.num_inputs; i < buffers.size(); ++i) {
      if (buffers[i].nbytes == 0) continue;
      bool aliased = false;
      for (size_t j = 0; j < static_cast<size_t>(plan.num_inputs); ++j) {
        aliased |= buffers[j].data == buffers[i].data;
      }
      if (aliased) continue;
      cuda::CUresult r = driver->cuMemsetD8Async(
          reinterpret_cast<cuda::CUdeviceptr>(buffers[i].data), 0,
          buffers[i].nbytes, stream);
      if (r != cuda::CUDA_SUCCESS) return LaunchError(*site, *driver, r);
    }
    return ffi::Error::Success();
  }

  if (device < 0 || static_cast<size_t>(device) >= plan.functions.size() ||
      plan.functions[device] == nullptr) {
    return Fail(
        *site, "the kernel was not loaded on device " + std::to_string(device));
  }
  cuda::CUfunction function = plan.functions[device];

  thread_local KernelArgs packed;
  if (plan.batch > 0 && plan.fold_axis >= 0) {
    return LaunchFolded(*site, *driver, function, stream, buffers);
  }
  const int64_t slices = plan.batch > 0 ? plan.batch : 1;
  for (int64_t s = 0; s < slices; ++s) {
    packed.Reset();
    for (size_t i = 0; i < buffers.size(); ++i) {
      const BufferView& b = buffers[i];
      const size_t itemsize = LookupDType(b.dtype)->itemsize;
      if (plan.batch == 0) {
        packed.AddArray(b.data, b.dims, b.rank, itemsize);
        continue;
      }
      // Batched: axis 0 is the vmap axis; the kernel sees one slice.
      const bool reuse = i < plan.broadcast.size() && plan.broadcast[i];
      if (!AddBatchSlice(b, plan.batch, s, reuse, &packed)) {
        return Fail(*site, "buffer " + std::to_string(i) + " (rank " +
                               std::to_string(b.rank) + ") does not hold " +
                               std::to_string(plan.batch) +
                               " slices along axis 0 for a vmapped launch");
      }
    }
    cuda::CUresult r =
        Launch(*driver, plan, function, stream, plan.grid, packed.params());
    if (r != cuda::CUDA_SUCCESS) return LaunchError(*site, *driver, r);
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::TypeId KernelSite::id = {};

void SetKernelResolver(PyObject* resolver) {
  Py_XINCREF(resolver);
  g_kernel_resolver = resolver;  // the previous one is leaked on purpose
}

ffi::ErrorOr<std::unique_ptr<KernelSite>> KernelSite::Create(
    std::string_view key) {
  InterpreterUse use;
  if (!use.admitted()) {
    return ffi::Unexpected(ffi::Error::Internal(
        "numbax: the Python interpreter is not running (or is exiting)"));
  }
  std::unique_ptr<KernelSite> site(new KernelSite);
  site->key_ = std::string(key);
  std::string error;
  {
    GilScope gil;
    ++Counters().resolves;
    if (!g_kernel_resolver) {
      error =
          "numbax is not imported in this process; import it and create "
          "the kernel op before running the program";
    } else {
      PyObject* t = PyObject_CallFunction(g_kernel_resolver, "s#", key.data(),
                                          static_cast<Py_ssize_t>(key.size()));
      if (!t) {
        error = TakePythonError();
      } else {
        PyObject* owner = nullptr;
        error = ParsePlan(t, &site->plan_, &owner);
        if (error.empty()) {
          Py_INCREF(owner);
          site->owner_ = owner;
        }
        Py_DECREF(t);
      }
    }
  }
  if (!error.empty())
    return ffi::Unexpected(ffi::Error::InvalidArgument(error));
  return site;
}

KernelSite::~KernelSite() {
  if (!owner_) return;
  InterpreterUse use;
  if (!use.admitted()) return;  // see CallSite::~CallSite
  GilScope gil;
  Py_CLEAR(owner_);
}

}  // namespace numbax

using numbax::ffi::Ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxKernelInstantiateCuda, numbax::Instantiate,
    Ffi::BindInstantiate().Attr<std::string_view>("key"));

// No Python and no host work per call: safe to record into CUDA graphs.
XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxKernelExecuteCuda, numbax::Execute,
                              Ffi::Bind()
                                  .Ctx<numbax::ffi::PlatformStream<void*>>()
                                  .Ctx<numbax::ffi::DeviceOrdinal>()
                                  .Ctx<numbax::ffi::State<numbax::KernelSite>>()
                                  .Attr<std::string_view>("key")
                                  .RemainingArgs()
                                  .RemainingRets(),
                              {numbax::ffi::Traits::kCmdBufferCompatible});
