// The FFI handlers behind numba_cuda_callable.
//
// Call frame -> device binding -> Python call. One fixed set of targets
// serves every callable: the "key" attribute names the Python function, and
// is resolved once per call site at XLA's instantiate stage.
#include "callable_handlers.h"

#include <string>
#include <string_view>
#include <vector>

#include "buffers.h"
#include "cuda_driver.h"
#include "python_bridge.h"

namespace numbax {
namespace {

ffi::ErrorOr<std::unique_ptr<CudaCallSite>> InstantiateCuda(
    std::string_view key) {
  return CallSite::Create<CudaCallSite>(key, Platform::kCuda);
}

ffi::ErrorOr<std::unique_ptr<CpuCallSite>> InstantiateCpu(
    std::string_view key) {
  return CallSite::Create<CpuCallSite>(key, Platform::kCpu);
}

// Shared tail of both platforms: decode, take the GIL, call.
ffi::Error Run(CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets,
               Platform platform, int device, void* stream) {
  thread_local std::vector<BufferView> buffers;
  const int64_t expected_rets = site->num_outputs() + site->num_scratch();
  if (ffi::Error err = DecodeCallBuffers(args, rets, site->num_inputs(),
                                         expected_rets, &buffers);
      err.failure()) {
    return ffi::Error::InvalidArgument("numbax op '" + site->key() +
                                       "': " + err.message());
  }
  InterpreterUse use;
  if (!use.admitted()) {
    return ffi::Error::Internal("numbax op '" + site->key() +
                                "': the Python interpreter is shutting down");
  }
  GilScope gil;
  return site->Invoke(buffers, platform, device, stream);
}

ffi::Error ExecuteCuda(void* stream, int32_t device, CudaCallSite* site,
                       std::string_view /*key*/, ffi::RemainingArgs args,
                       ffi::RemainingRets rets) {
  std::string why;
  const cuda::Driver* driver = cuda::Load(&why);
  if (!driver) return ffi::Error::Internal("numbax: " + why);
  // Numba builds arrays and launches in whatever context is current: make
  // it the primary context of the device XLA placed this call on.
  cuda::ScopedDevice bind(*driver, device);
  if (bind.status() != cuda::CUDA_SUCCESS) {
    return ffi::Error::Internal("numbax: cannot bind CUDA device " +
                                std::to_string(device) + ": " +
                                cuda::ErrorText(*driver, bind.status()));
  }
  return Run(site, args, rets, Platform::kCuda, device, stream);
}

// The rules a captured func must keep, quoted in every capture error.
constexpr const char* kCaptureRules =
    "A capture=True func is recorded into a CUDA graph and replayed without "
    "Python, so it must: launch only on the stream it is given; not "
    "synchronise with the host (cuda.synchronize, stream.synchronize); not "
    "allocate device memory (use scratch= buffers instead of "
    "cuda.device_array); not copy to or from the host or read device values "
    "on the host; and launch the same work for the same shapes on every call.";

ffi::Error CaptureError(const CallSite& site, const std::string& what) {
  return ffi::Error::Internal("numbax op '" + site.key() +
                              "' (capture=True): " + what + "\n" +
                              kCaptureRules);
}

// This thread's recording stream on `device` (whose context is current),
// created on first use and kept for the thread's life.
cuda::CUresult RecordingStream(const cuda::Driver& driver, int device,
                               cuda::CUstream* out) {
  thread_local std::vector<cuda::CUstream> streams;
  if (device < 0) return 101;  // CUDA_ERROR_INVALID_DEVICE
  if (static_cast<size_t>(device) >= streams.size()) {
    streams.resize(static_cast<size_t>(device) + 1, nullptr);
  }
  if (!streams[device]) {
    if (!driver.cuStreamCreate) return 500;  // CUDA_ERROR_NOT_FOUND
    // A blocking stream on purpose: a launch that forgets the stream goes to
    // the legacy default stream, which must then wait for the capturing
    // stream, and the driver refuses that (CAPTURE_IMPLICIT) instead of
    // running the launch outside the graph.
    cuda::CUresult r = driver.cuStreamCreate(&streams[device], 0);
    if (r != cuda::CUDA_SUCCESS) return r;
  }
  *out = streams[device];
  return cuda::CUDA_SUCCESS;
}

// Capture mode: XLA records us into its command buffer when it can; where it
// does not, numbax records func's launches itself and replays the graph.
ffi::Error ExecuteCudaCapture(void* stream_ptr, int32_t device,
                              CudaCallSite* site, std::string_view /*key*/,
                              ffi::RemainingArgs args,
                              ffi::RemainingRets rets) {
  std::string why;
  const cuda::Driver* driver = cuda::Load(&why);
  if (!driver) return ffi::Error::Internal("numbax: " + why);
  auto stream = static_cast<cuda::CUstream>(stream_ptr);
  int capture_status = cuda::CU_STREAM_CAPTURE_STATUS_NONE;
  if (driver->cuStreamIsCapturing) {
    driver->cuStreamIsCapturing(stream, &capture_status);
  }
  if (capture_status != cuda::CU_STREAM_CAPTURE_STATUS_NONE) {
    // XLA is recording a command buffer: func's launches land in it.
    ++GraphStats().xla_captures;
    return ExecuteCuda(stream_ptr, device, site, {}, args, rets);
  }

  thread_local std::vector<BufferView> buffers;
  const int64_t expected_rets = site->num_outputs() + site->num_scratch();
  if (ffi::Error err = DecodeCallBuffers(args, rets, site->num_inputs(),
                                         expected_rets, &buffers);
      err.failure()) {
    return ffi::Error::InvalidArgument("numbax op '" + site->key() +
                                       "': " + err.message());
  }
  if (cuda::CUgraphExec exec = site->graphs.Find(device, buffers)) {
    ++GraphStats().hits;
    cuda::CUresult r = driver->cuGraphLaunch(exec, stream);
    if (r != cuda::CUDA_SUCCESS) {
      return CaptureError(
          *site, "replaying the graph failed: " + cuda::ErrorText(*driver, r));
    }
    return ffi::Error::Success();
  }
  ++GraphStats().misses;
  if (!driver->cuStreamBeginCapture || !driver->cuGraphInstantiateWithFlags ||
      !driver->cuGraphLaunch) {
    return ExecuteCuda(stream_ptr, device, site, {}, args, rets);
  }
  cuda::ScopedDevice bind(*driver, device);
  if (bind.status() != cuda::CUDA_SUCCESS) {
    return ffi::Error::Internal("numbax: cannot bind CUDA device " +
                                std::to_string(device) + ": " +
                                cuda::ErrorText(*driver, bind.status()));
  }
  InterpreterUse use;
  if (!use.admitted()) {
    return ffi::Error::Internal("numbax op '" + site->key() +
                                "': the Python interpreter is shutting down");
  }
  GilScope gil;
  if (!site->graphs.Warmed(device)) {
    // First call on this device runs plainly: Numba compiles and loads its
    // kernels here, which it could not do inside a capture.
    ffi::Error result =
        site->Invoke(buffers, Platform::kCuda, device, stream_ptr);
    if (result.success()) site->graphs.MarkWarmed(device);
    return result;
  }
  // Record on a stream of numbax's own, never on XLA's: other threads may
  // enqueue onto XLA's stream at any moment, and their work would join (and
  // break) the capture. Recording runs nothing; the graph is then launched
  // on XLA's stream, ordered with the rest of the program.
  cuda::CUstream recorder = nullptr;
  cuda::CUresult r = RecordingStream(*driver, device, &recorder);
  if (r != cuda::CUDA_SUCCESS) {
    return CaptureError(*site, "cannot create a recording stream: " +
                                   cuda::ErrorText(*driver, r));
  }
  r = driver->cuStreamBeginCapture(recorder,
                                   cuda::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != cuda::CUDA_SUCCESS) {
    return CaptureError(*site,
                        "cannot begin capture: " + cuda::ErrorText(*driver, r));
  }
  ffi::Error invoked = site->Invoke(buffers, Platform::kCuda, device, recorder);
  cuda::CUgraph graph = nullptr;
  cuda::CUresult ended = driver->cuStreamEndCapture(recorder, &graph);
  if (invoked.failure()) {
    if (graph) driver->cuGraphDestroy(graph);
    return CaptureError(
        *site, "func failed while being captured: " + invoked.message());
  }
  if (ended != cuda::CUDA_SUCCESS || graph == nullptr) {
    if (graph) driver->cuGraphDestroy(graph);
    return CaptureError(*site, "the capture was invalidated (" +
                                   cuda::ErrorText(*driver, ended) +
                                   "): func broke a capture rule.");
  }
  cuda::CUgraphExec exec = nullptr;
  r = driver->cuGraphInstantiateWithFlags(&exec, graph, 0);
  driver->cuGraphDestroy(graph);
  if (r != cuda::CUDA_SUCCESS) {
    return CaptureError(*site, "cannot instantiate the captured graph: " +
                                   cuda::ErrorText(*driver, r));
  }
  // Recording launched nothing: run the graph for this call too.
  r = driver->cuGraphLaunch(exec, stream);
  site->graphs.Insert(device, buffers, exec);
  if (r != cuda::CUDA_SUCCESS) {
    return CaptureError(
        *site, "launching the graph failed: " + cuda::ErrorText(*driver, r));
  }
  return ffi::Error::Success();
}

ffi::Error ExecuteCpu(CpuCallSite* site, std::string_view /*key*/,
                      ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return Run(site, args, rets, Platform::kCpu, -1, nullptr);
}

}  // namespace
}  // namespace numbax

using numbax::ffi::Ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxCallableInstantiateCuda, numbax::InstantiateCuda,
    Ffi::BindInstantiate().Attr<std::string_view>("key"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxCallableInstantiateCpu, numbax::InstantiateCpu,
    Ffi::BindInstantiate().Attr<std::string_view>("key"));

// Plain mode runs Python on every call, so it must not be captured into a
// command buffer: no traits.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxCallableExecuteCuda, numbax::ExecuteCuda,
    Ffi::Bind()
        .Ctx<numbax::ffi::PlatformStream<void*>>()
        .Ctx<numbax::ffi::DeviceOrdinal>()
        .Ctx<numbax::ffi::State<numbax::CudaCallSite>>()
        .Attr<std::string_view>("key")
        .RemainingArgs()
        .RemainingRets());

// Capture mode: no Python on replay, so XLA may record it into a graph.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxCallableExecuteCudaCapture, numbax::ExecuteCudaCapture,
    Ffi::Bind()
        .Ctx<numbax::ffi::PlatformStream<void*>>()
        .Ctx<numbax::ffi::DeviceOrdinal>()
        .Ctx<numbax::ffi::State<numbax::CudaCallSite>>()
        .Attr<std::string_view>("key")
        .RemainingArgs()
        .RemainingRets(),
    {numbax::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxCallableExecuteCpu, numbax::ExecuteCpu,
    Ffi::Bind()
        .Ctx<numbax::ffi::State<numbax::CpuCallSite>>()
        .Attr<std::string_view>("key")
        .RemainingArgs()
        .RemainingRets());
