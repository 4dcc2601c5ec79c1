// numbax._core: the nanobind module that hands XLA its FFI handlers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <stdexcept>
#include <string>

#include "call_guard.h"
#include "call_site.h"
#include "callable_handler.h"
#include "configure_hook.h"
#include "counters.h"
#include "cpu_kernel_handler.h"
#include "cuda_driver.h"
#include "device_binding.h"
#include "fast_launch.h"
#include "fast_launch_plans.h"
#include "fast_launch_testing.h"
#include "graph_cache.h"
#include "interpreter.h"
#include "kernel_args.h"
#include "kernel_handler.h"
#include "kernel_site.h"
#include "launch_log.h"
#include "loaded_kernel.h"
#include "nvtx.h"
#include "python_hooks.h"
#include "stream_cache.h"

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule HandlerCapsule(Fn* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, Fn, XLA_FFI_CallFrame*>,
                "not an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

template <typename T>
nb::dict TypeRegistration() {
  static const XLA_FFI_TypeInfo info = xla::ffi::MakeTypeInfo<T>();
  nb::dict d;
  d["type_id"] = nb::capsule(reinterpret_cast<void*>(&T::id));
  d["type_info"] = nb::capsule(
      reinterpret_cast<void*>(const_cast<XLA_FFI_TypeInfo*>(&info)));
  return d;
}

nb::dict Counters() {
  nb::dict d;
  for (const auto& [name, value] : numbax::CounterSnapshot()) {
    d[name.c_str()] = value;
  }
  return d;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "numbax's C++ core: XLA FFI handlers and the CUDA driver bridge";

  m.def("callable_handlers", [] {
    nb::dict cuda, cpu, all;
    cuda["instantiate"] = HandlerCapsule(NumbaxCallableInstantiateCuda);
    cuda["execute"] = HandlerCapsule(NumbaxCallableExecuteCuda);
    cpu["instantiate"] = HandlerCapsule(NumbaxCallableInstantiateCpu);
    cpu["execute"] = HandlerCapsule(NumbaxCallableExecuteCpu);
    nb::dict cuda_capture;
    cuda_capture["instantiate"] = HandlerCapsule(NumbaxCallableInstantiateCuda);
    cuda_capture["execute"] = HandlerCapsule(NumbaxCallableExecuteCudaCapture);
    all["cuda"] = cuda;
    all["cuda_capture"] = cuda_capture;
    all["cpu"] = cpu;
    return all;
  });
  m.def("kernel_handlers", [] {
    nb::dict cuda, all;
    cuda["instantiate"] = HandlerCapsule(NumbaxKernelInstantiateCuda);
    cuda["execute"] = HandlerCapsule(NumbaxKernelExecuteCuda);
    all["cuda"] = cuda;
    return all;
  });
  m.def("call_site_types", [] {
    nb::dict d;
    d["cpu"] = TypeRegistration<numbax::CpuCallSite>();
    d["cuda"] = TypeRegistration<numbax::CudaCallSite>();
    return d;
  });
  m.def("kernel_site_type", &TypeRegistration<numbax::KernelSite>);
  m.def("cpu_kernel_handlers", [] {
    nb::dict d;
    d["instantiate"] = HandlerCapsule(NumbaxCpuKernelInstantiate);
    d["execute"] = HandlerCapsule(NumbaxCpuKernelExecute);
    return d;
  });
  m.def("cpu_kernel_site_type", &TypeRegistration<numbax::CpuKernelSite>);
  m.def(
      "set_cpu_kernel_resolver",
      [](nb::object resolver) { numbax::SetCpuKernelResolver(resolver.ptr()); },
      "Sets the function that resolves numba_kernel keys at instantiate.");
  numbax::BindLoadedKernel(m);

  // An NVTX tool (Nsight Systems, Nsight Compute) set NVTX_INJECTION64_PATH
  // for this process: attach now, before any handler runs, so that each
  // call is a range named after its op (nvtx.h); without one, nothing.
  numbax::nvtx::AttachFromEnvironment();
  m.def("nvtx_attached", &numbax::nvtx::Attached,
        "Whether an NVTX tool (named by NVTX_INJECTION64_PATH) attached when "
        "numbax was imported: each op's calls are then NVTX ranges named "
        "after the op.");

  m.def(
      "set_python_hooks",
      [](nb::object resolve, nb::object device_array, nb::object host_array,
         nb::object device_stream, nb::object host_stream,
         nb::object format_exception) {
        numbax::PythonHooks h;
        h.resolve = resolve.ptr();
        h.device_array = device_array.ptr();
        h.host_array = host_array.ptr();
        h.device_stream = device_stream.ptr();
        h.host_stream = host_stream.ptr();
        h.format_exception = format_exception.ptr();
        numbax::SetPythonHooks(h);
      },
      nb::arg("resolve"), nb::arg("device_array"), nb::arg("host_array"),
      nb::arg("device_stream"), nb::arg("host_stream"),
      nb::arg("format_exception"));

  m.def(
      "set_call_guard",
      [](nb::object pairs) {
        if (!numbax::SetCallGuard(pairs.ptr())) {
          throw nb::value_error(
              "set_call_guard takes None or a tuple (swap, value, ...) of "
              "at most 4 pairs");
        }
      },
      nb::arg("pairs").none(),
      "Thread-local state swapped in around every call of a func.");

  m.def(
      "prepare_for_exit",
      [](double timeout_s) { return numbax::PrepareForExit(timeout_s); },
      nb::arg("timeout_s") = 5.0,
      "Refuses Python in handlers from now on and waits for the calls in "
      "flight; registered with atexit by numbax.");

  m.def(
      "set_kernel_resolver",
      [](nb::object resolver) { numbax::SetKernelResolver(resolver.ptr()); },
      nb::arg("resolver"));

  m.def(
      "kernel_function",
      [](uint64_t kernel, int ordinal, int64_t shared_mem) -> uint64_t {
        // A Numba kernel handle (CUkernel) -> the CUfunction of one device's
        // primary context, loading it there now rather than lazily inside
        // XLA's execution (where a graph capture may be under way).
        return numbax::RunOnDevice(ordinal, [&](const numbax::cuda::Driver& d) {
          numbax::cuda::CUfunction f = nullptr;
          std::string error;
          if (!numbax::cuda::KernelFunction(
                  d, reinterpret_cast<numbax::cuda::CUkernel>(kernel),
                  shared_mem, &f, &error)) {
            throw std::runtime_error(error);
          }
          return reinterpret_cast<uint64_t>(f);
        });
      },
      nb::arg("kernel"), nb::arg("ordinal"), nb::arg("shared_mem") = 0);

  m.def(
      "call_on_device",
      [](int ordinal, nb::callable fn) -> nb::object {
        // Runs fn with the device's primary context current, so Numba
        // (which follows the current context) loads modules there.
        return numbax::RunOnDevice(
            ordinal, [&](const numbax::cuda::Driver&) { return fn(); });
      },
      nb::arg("ordinal"), nb::arg("fn"));

  m.def("counters", &Counters, "Bridge cache and call counters.");
  m.def("reset_counters", &numbax::ResetCounters);

  m.def(
      "make_launch_hook",
      [](nb::object original, nb::object check, nb::object plan,
         nb::object cached) {
        PyObject* hook = numbax::NewLaunchHook(original.ptr(), check.ptr(),
                                               plan.ptr(), cached.ptr());
        if (!hook) throw nb::python_error();
        return nb::steal(hook);
      },
      nb::arg("original"), nb::arg("check"), nb::arg("plan"),
      nb::arg("cached").none() = nb::none(),
      "The object numbax sets as Numba's _LaunchConfiguration.__call__.");
  m.def(
      "make_configure_hook",
      [](nb::object original, nb::object configure, nb::object cls) {
        PyObject* hook = numbax::NewConfigureHook(original.ptr(),
                                                  configure.ptr(), cls.ptr());
        if (!hook) throw nb::python_error();
        return nb::steal(hook);
      },
      nb::arg("original"), nb::arg("configure"), nb::arg("cls"),
      "The object numbax sets as Numba's CUDADispatcher.__getitem__.");
  m.def("note_simulator_launch", &numbax::NoteSimulatorLaunch,
        "Counts a simulator launch made inside a numbax call.");
  m.def("note_device_to_host", &numbax::HostReadWatch::Note,
        "Notes a device-to-host copy made on this thread: true when a "
        "capture-mode recording runs here (the call site is then never "
        "captured).");
  m.def(
      "numba_layout",
      [](std::vector<int64_t> shape, std::vector<int64_t> strides,
         int64_t itemsize) -> std::string {
        if (shape.size() != strides.size() ||
            shape.size() > static_cast<size_t>(numbax::kMaxRank)) {
          throw nb::value_error("shape and strides must have the same rank");
        }
        const char layout = numbax::NumbaArrayLayout(
            shape.data(), strides.data(), static_cast<int64_t>(shape.size()),
            itemsize);
        return layout ? std::string(1, layout) : std::string();
      },
      nb::arg("shape"), nb::arg("strides"), nb::arg("itemsize"),
      "The Numba layout the fast launch path computes for a view ('' where "
      "it leaves the launch to Numba); for tests.");
  m.def(
      "pack_array_for_test",
      [](int abi, uint64_t address, std::vector<int64_t> shape,
         size_t itemsize) {
        if (abi != static_cast<int>(numbax::ArrayAbi::kNumba) &&
            abi != static_cast<int>(numbax::ArrayAbi::kMemref)) {
          throw nb::value_error("abi is 0 (numba-cuda) or 1 (memref)");
        }
        numbax::KernelArgs args;
        args.Reset(static_cast<numbax::ArrayAbi>(abi));
        args.AddArray(reinterpret_cast<void*>(address), shape.data(),
                      static_cast<int64_t>(shape.size()), itemsize);
        return args.words();
      },
      nb::arg("abi"), nb::arg("address"), nb::arg("shape"), nb::arg("itemsize"),
      "The parameter words numba_cuda_kernel packs for one C-contiguous "
      "array in `abi` (LoadedKernel.abi); for tests.");
  m.def(
      "pack_scalar",
      [](const std::string& how, nb::object value) {
        if (how.size() != 1) throw nb::value_error("how is one character");
        PyObject* b = numbax::PackScalarForTest(how[0], value.ptr());
        if (!b) throw nb::python_error();
        return nb::steal(b);
      },
      nb::arg("how"), nb::arg("value"),
      "The words the fast launch path packs for a scalar; for tests.");
  m.def(
      "set_fast_launch_dry_run", [](bool on) { numbax::SetDryRun(on); },
      nb::arg("on"),
      "Tests only: fast launches record what they would launch instead.");
  m.def("last_fast_launch", [] {
    PyObject* d = numbax::LastLaunch();
    if (!d) throw nb::python_error();
    return nb::steal(d);
  });
  m.def(
      "call_as_numbax",
      [](nb::object func, nb::object arrays, nb::object buffers,
         uint64_t stream, int device, bool enabled, bool cached_plans) {
        PyObject* r = numbax::CallAsNumbax(
            func.ptr(), arrays.ptr(), buffers.ptr(),
            reinterpret_cast<void*>(static_cast<uintptr_t>(stream)), device,
            enabled, cached_plans);
        if (!r) throw nb::python_error();
        return nb::steal(r);
      },
      nb::arg("func"), nb::arg("arrays"), nb::arg("buffers"), nb::arg("stream"),
      nb::arg("device") = 0, nb::arg("enabled") = true,
      nb::arg("cached_plans") = true,
      "Tests only: runs func() as numbax runs a func, with `arrays` over "
      "`buffers` ((address, dtype, shape) each) on `stream`; "
      "cached_plans=False as a capture-mode call does.");
  m.def(
      "time_driver_launches",
      [](uint64_t function, std::array<unsigned, 3> grid,
         std::array<unsigned, 3> block, std::vector<int64_t> words,
         uint64_t stream, int count, int mode) {
        if (function == 0 || count < 1 || mode < 0 || mode > 2) {
          throw nb::value_error(
              "time_driver_launches: a function handle, count >= 1 and "
              "mode 0, 1 or 2");
        }
        return numbax::TimeDriverLaunches(
            static_cast<uintptr_t>(function), grid.data(), block.data(),
            words.data(), words.size(), static_cast<uintptr_t>(stream), count,
            mode);
      },
      nb::arg("function"), nb::arg("grid"), nb::arg("block"), nb::arg("words"),
      nb::arg("stream"), nb::arg("count"), nb::arg("mode"),
      "Benchmarks: host seconds of `count` back-to-back cuLaunchKernel calls "
      "(mode 0 GIL held, 1 GIL released per launch, 2 one parameter "
      "buffer); -CUresult if one failed.");
  m.def(
      "set_fast_launch_resolves_function",
      [](bool on) { numbax::SetResolveFunctions(on); }, nb::arg("on"),
      "Benchmarks: plans recorded from now on launch each kernel's CUfunction "
      "in the bound context (True, the default) or Numba's CUkernel handle.");
  m.def(
      "set_bridge_stop",
      [](int stop) {
        if (stop < 0 ||
            stop > static_cast<int>(numbax::BridgeStop::kAfterGuard)) {
          throw nb::value_error(
              "the bridge stop must be 0 (the whole call) to 4");
        }
        numbax::SetBridgeStop(static_cast<numbax::BridgeStop>(stop));
      },
      nb::arg("stop"),
      "Benchmarks: plain callables' calls return after stage `stop` without "
      "calling func (0, the default: the whole call; 1 the call frame "
      "decoded; 2 the GIL taken; 3 func's arrays found; 4 the guard entered "
      "and left).");
  m.def("clear_launch_plans", &numbax::ClearLaunchPlans);
  m.def("launch_plan_count", &numbax::LaunchPlanCount);
  m.def("launch_plan_functions", &numbax::LaunchPlanFunctions,
        "Tests: the handle each launchable plan passes to cuLaunchKernel.");
  m.def("set_graph_cache_size", [](size_t n) {
    if (n < 1) throw nb::value_error("the graph cache size must be >= 1");
    numbax::GraphCache::SetCapacity(n);
  });
  m.def("graph_cache_size", &numbax::GraphCache::Capacity);
  m.def("clear_graph_caches", &numbax::GraphCache::ClearAll);
  m.def("rebind_refusals", &numbax::RebindRefusals,
        "(op key, why) of capture-mode call sites found not re-bindable, "
        "the most recent last (at most 64).");
  m.def("clear_stream_cache", &numbax::ClearStreamCache);

  m.def(
      "driver_status",
      [] {
        std::string why;
        const numbax::cuda::Driver* d = numbax::cuda::Load(&why);
        return d ? std::string("ok") : why;
      },
      "'ok' when the CUDA driver loaded, else why it did not.");
}
