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
#include "launch_log.h"
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

// After a recording: a call site found not re-bindable says why once, in
// numbax.diagnostics.rebind_refusals().
void NoteRefusal(const CallSite& site, const std::string& why) {
  if (!why.empty()) NoteRebindRefusal(site.key(), why);
}

// Why a call site that read device memory on the host while it was
// recorded is never captured again (numbax.diagnostics.rebind_refusals()).
constexpr const char* kHostRead =
    "func copied device memory to the host while it was recorded "
    "(copy_to_host(), or a device array's element read on the host): the "
    "value it read, and any launch it chose with it, would be frozen into "
    "the graph, so replays would reuse them for new contents; this call "
    "site runs func plainly from now on";

// The same, where XLA records the call into its own command buffer, whose
// replays numbax cannot turn into plain calls.
constexpr const char* kHostReadUnderXla =
    "func copied device memory to the host (copy_to_host(), or a device "
    "array's element read on the host) while XLA recorded it into a "
    "command buffer: the value it read would be frozen into XLA's graph and "
    "reused for new contents. Create the op with capture=False, or keep XLA "
    "from recording it (XLA_FLAGS=--xla_gpu_enable_command_buffer=).";

// XLA is recording a command buffer: func's launches must land in it. A
// call site whose launches numbax logged (and confirmed at other addresses)
// issues them from C++, re-bound to these buffers; otherwise func runs,
// logged, so that later recordings need no Python.
ffi::Error RunUnderXlaCapture(const cuda::Driver& driver, void* stream_ptr,
                              int32_t device, CudaCallSite* site,
                              ffi::RemainingArgs args,
                              ffi::RemainingRets rets) {
  ++GraphStats().xla_captures;
  if (site->graphs.Plain()) return CaptureError(*site, kHostReadUnderXla);
  thread_local std::vector<BufferView> buffers;
  if (ffi::Error err = site->DecodeBuffers(args, rets, &buffers);
      err.failure()) {
    return err;
  }
  DeviceBinding bind(driver, device);
  if (!bind.ok()) return ffi::Error::Internal("numbax: " + bind.Error());
  if (!site->aliases().empty()) {
    if (ffi::Error err =
            KeepAliasedInputs(*site, Platform::kCuda, stream_ptr, buffers);
        err.failure()) {
      return err;
    }
  }
  auto stream = static_cast<cuda::CUstream>(stream_ptr);
  cuda::CUresult r;
  if (site->fast_launch() &&
      site->graphs.LaunchRecorded(driver, device, buffers, stream, &r)) {
    if (r != cuda::CUDA_SUCCESS) {
      return CaptureError(*site, "issuing the recorded launches failed: " +
                                     cuda::ErrorText(driver, r));
    }
    return ffi::Error::Success();
  }
  InterpreterUse use;
  if (!use.admitted()) return site->ShuttingDown();
  GilScope gil;
  const bool logging = site->fast_launch() && !site->graphs.Refused(device);
  LaunchLog log;
  HostReadWatch host_reads;
  ffi::Error result = site->Invoke(buffers, Platform::kCuda, device, stream_ptr,
                                   /*plain=*/false, logging ? &log : nullptr);
  if (host_reads.seen()) {
    site->graphs.MarkPlain();
    NoteRefusal(*site, kHostRead);
    return CaptureError(*site, kHostReadUnderXla);
  }
  if (result.success() && logging) {
    NoteRefusal(*site, site->graphs.Learn(device, std::move(log)));
  }
  return result;
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
    return RunUnderXlaCapture(*driver, stream_ptr, device, site, args, rets);
  }
  // func reads device memory on the host: never captured (kHostRead).
  if (site->graphs.Plain()) {
    return RunCallableCuda(stream_ptr, device, site, args, rets,
                           /*plain=*/true);
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
  cuda::CUresult r;
  const GraphCache::Replay replay =
      site->graphs.Launch(*driver, device, buffers, stream, &r);
  if (replay != GraphCache::Replay::kNone) {
    if (r != cuda::CUDA_SUCCESS) {
      return CaptureError(*site,
                          std::string(replay == GraphCache::Replay::kHit
                                          ? "replaying the graph"
                                          : "replaying the re-bound graph") +
                              " failed: " + cuda::ErrorText(*driver, r));
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
  r = RecordingStream(*driver, device, &recorder);
  if (r != cuda::CUDA_SUCCESS) {
    return CaptureError(*site, "cannot create a recording stream: " +
                                   cuda::ErrorText(*driver, r));
  }
  // func's launches are logged as they are captured, so that the graph can
  // be re-bound to other buffers later (graph_rebind.h). The first
  // recording on this thread's recording stream makes new launch plans
  // (their key holds the stream): its log maps only once they exist, so it
  // is recorded once more, right away. A call site already refused logs
  // nothing and records once.
  const bool logging = site->fast_launch() && !site->graphs.Refused(device);
  LaunchLog log;
  HostReadWatch host_reads;
  cuda::CUgraph graph = nullptr;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (graph) driver->cuGraphDestroy(graph);
    graph = nullptr;
    r = driver->cuStreamBeginCapture(recorder,
                                     cuda::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (r != cuda::CUDA_SUCCESS) {
      return CaptureError(
          *site, "cannot begin capture: " + cuda::ErrorText(*driver, r));
    }
    ffi::Error invoked =
        site->Invoke(buffers, Platform::kCuda, device, recorder,
                     /*plain=*/false, logging ? &log : nullptr);
    if (!site->fast_launch()) log.Unmap("fast launches are off for this op");
    cuda::CUresult ended = driver->cuStreamEndCapture(recorder, &graph);
    if (host_reads.seen()) {
      // Whatever the capture made of the copy (a graph with a frozen value,
      // or an invalidated capture), it is dropped: this call, and every
      // later one, runs func plainly on XLA's stream.
      if (graph) driver->cuGraphDestroy(graph);
      site->graphs.MarkPlain();
      NoteRefusal(*site, kHostRead);
      return site->Invoke(buffers, Platform::kCuda, device, stream_ptr,
                          /*plain=*/true);
    }
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
    if (!log.transient()) break;
  }
  // Still new plans on a second recording: func makes new launch
  // configurations per call, which never map.
  if (log.transient()) log.MakePermanent();
  // Recording launched nothing: the graph runs for this call too.
  std::string stage, refusal;
  r = site->graphs.AddRecording(*driver, device, buffers, graph, std::move(log),
                                stream, &stage, &refusal);
  NoteRefusal(*site, refusal);
  if (r != cuda::CUDA_SUCCESS) {
    return CaptureError(*site,
                        stage + " failed: " + cuda::ErrorText(*driver, r));
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
