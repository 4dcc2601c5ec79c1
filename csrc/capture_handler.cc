// Capture mode of numba_cuda_callable: func's launches recorded into a
// CUDA graph and replayed without Python.
//
// Call frame -> graph cache (a hit replays the graph, no device binding and
// no GIL) -> on a miss, device binding -> Python call recorded on a stream
// of numbax's own -> graph cache. Where XLA itself is recording a command
// buffer, or the driver lacks the graph API, the call runs as in plain mode
// (callable_handler.cc).
#include <string>
#include <string_view>
#include <vector>

#include "call_site.h"
#include "callable_handler.h"
#include "cuda_driver.h"
#include "device_binding.h"
#include "ffi_binding.h"
#include "graph_cache.h"
#include "interpreter.h"
#include "nvtx.h"
#include "python_errors.h"

namespace numbax {
namespace {

// The rules a captured func must keep, quoted in every capture error.
constexpr const char* kCaptureRules =
    "A capture=True func is recorded into a CUDA graph and replayed without "
    "Python, so it must: launch only on the stream it is given; not "
    "synchronise with the host (cuda.synchronize, stream.synchronize); not "
    "allocate device memory (use scratch= buffers instead of "
    "cuda.device_array); not copy to or from the host or read device values "
    "on the host; and launch the same work for the same shapes on every call.";

ffi::Error CaptureError(const CallSite& site, const std::string& what) {
  return ffi::Error::Internal(
      OpMessage(OpKind::kCapture, site.key(), what + "\n" + kCaptureRules));
}

// Capture mode: XLA records us into its command buffer when it can; where it
// does not, numbax records func's launches itself and replays the graph.
ffi::Error ExecuteCudaCapture(void* stream_ptr, int32_t device,
                              CudaCallSite* site, std::string_view /*key*/,
                              ffi::RemainingArgs args,
                              ffi::RemainingRets rets) {
  // The call (a replay, a recording or a plain run) as an NVTX range.
  nvtx::Range range(site->name().c_str());
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
    return RunCallableCuda(stream_ptr, device, site, args, rets,
                           /*plain=*/false);
  }

  thread_local std::vector<BufferView> buffers;
  if (ffi::Error err = site->DecodeBuffers(args, rets, &buffers);
      err.failure()) {
    return err;
  }
  // Before the replay or the recording, on XLA's stream (aliases.h).
  if (!site->aliases().empty()) {
    if (ffi::Error err =
            KeepAliasedInputs(*site, Platform::kCuda, stream_ptr, buffers);
        err.failure()) {
      return err;
    }
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
    return RunCallableCuda(stream_ptr, device, site, args, rets,
                           /*plain=*/false);
  }
  DeviceBinding bind(*driver, device);
  if (!bind.ok()) return ffi::Error::Internal("numbax: " + bind.Error());
  InterpreterUse use;
  if (!use.admitted()) return site->ShuttingDown();
  GilScope gil;
  if (!site->graphs.Warmed(device)) {
    // First call on this device runs plainly: Numba compiles and loads its
    // kernels here, which it could not do inside a capture (so no launch
    // from numbax's cache entries, which would leave Numba's load to the
    // recording call).
    ffi::Error result = site->Invoke(buffers, Platform::kCuda, device,
                                     stream_ptr, /*plain=*/false);
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
  ffi::Error invoked = site->Invoke(buffers, Platform::kCuda, device, recorder,
                                    /*plain=*/false);
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

}  // namespace
}  // namespace numbax

// Capture mode: no Python on replay, so XLA may record it into a graph.
XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxCallableExecuteCudaCapture,
                              numbax::ExecuteCudaCapture,
                              numbax::BindCudaExecute<numbax::CudaCallSite>(),
                              {numbax::ffi::Traits::kCmdBufferCompatible});
