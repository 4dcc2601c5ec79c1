// The FFI handlers behind numba_cuda_callable.
//
// Call frame -> device binding -> Python call. One fixed set of targets
// serves every callable: the "key" attribute names the Python function, and
// is resolved once per call site at XLA's instantiate stage.
#include "callable_handler.h"

#include <string>
#include <string_view>
#include <vector>

#include "aliases.h"
#include "cuda_driver.h"
#include "device_binding.h"
#include "ffi_binding.h"
#include "interpreter.h"
#include "nvtx.h"
#include "python_errors.h"

namespace numbax {
namespace {

ffi::ErrorOr<std::unique_ptr<CudaCallSite>> InstantiateCuda(
    ffi::RemainingArgs, ffi::RemainingRets, std::string_view key) {
  return CallSite::Create<CudaCallSite>(key, Platform::kCuda);
}

ffi::ErrorOr<std::unique_ptr<CpuCallSite>> InstantiateCpu(
    ffi::RemainingArgs, ffi::RemainingRets, std::string_view key) {
  return CallSite::Create<CpuCallSite>(key, Platform::kCpu);
}

}  // namespace

ffi::Error KeepAliasedInputs(const CallSite& site, Platform platform,
                             void* stream,
                             const std::vector<BufferView>& buffers) {
  const cuda::Driver* driver = nullptr;
  if (platform == Platform::kCuda) {
    std::string why;
    driver = cuda::Load(&why);
    if (!driver) return ffi::Error::Internal("numbax: " + why);
  }
  const std::string bad =
      KeepAliasedInputs(driver, static_cast<cuda::CUstream>(stream), buffers,
                        site.num_inputs(), site.aliases());
  if (bad.empty()) return ffi::Error::Success();
  return ffi::Error::Internal(OpMessage(OpKind::kCallable, site.key(), bad));
}

namespace {

// Shared tail of both platforms: decode, take the GIL, call.
ffi::Error Run(CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets,
               Platform platform, int device, void* stream, bool plain) {
  thread_local std::vector<BufferView> buffers;
  if (ffi::Error err = site->DecodeBuffers(args, rets, &buffers);
      err.failure()) {
    return err;
  }
  // An aliased output starts out holding its input's values, whatever
  // buffers XLA handed us (aliases.h); on the CPU with a host copy.
  if (!site->aliases().empty()) {
    if (ffi::Error err = KeepAliasedInputs(*site, platform, stream, buffers);
        err.failure()) {
      return err;
    }
  }
  const BridgeStop stop = plain ? GetBridgeStop() : BridgeStop::kFull;
  if (stop == BridgeStop::kAfterDecode) return ffi::Error::Success();
  InterpreterUse use;
  if (!use.admitted()) return site->ShuttingDown();
  GilScope gil;
  if (stop == BridgeStop::kAfterGil) return ffi::Error::Success();
  return site->Invoke(buffers, platform, device, stream, plain);
}

ffi::Error ExecuteCpu(CpuCallSite* site, std::string_view /*key*/,
                      ffi::RemainingArgs args, ffi::RemainingRets rets) {
  nvtx::Range range(site->name().c_str());
  return Run(site, args, rets, Platform::kCpu, -1, nullptr, /*plain=*/true);
}

}  // namespace

ffi::Error ExecuteCallableCuda(void* stream, int32_t device, CudaCallSite* site,
                               std::string_view /*key*/,
                               ffi::RemainingArgs args,
                               ffi::RemainingRets rets) {
  // The call as an NVTX range named after the op (free without a tool).
  nvtx::Range range(site->name().c_str());
  return RunCallableCuda(stream, device, site, args, rets,
                         /*plain=*/true);
}

ffi::Error RunCallableCuda(void* stream, int32_t device, CudaCallSite* site,
                           ffi::RemainingArgs args, ffi::RemainingRets rets,
                           bool plain) {
  std::string why;
  const cuda::Driver* driver = cuda::Load(&why);
  if (!driver) return ffi::Error::Internal("numbax: " + why);
  // Numba builds arrays and launches in whatever context is current: make
  // it the primary context of the device XLA placed this call on.
  DeviceBinding bind(*driver, device);
  if (!bind.ok()) return ffi::Error::Internal("numbax: " + bind.Error());
  return Run(site, args, rets, Platform::kCuda, device, stream, plain);
}

}  // namespace numbax

XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxCallableInstantiateCuda,
                              numbax::InstantiateCuda,
                              numbax::BindInstantiate());
XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxCallableInstantiateCpu,
                              numbax::InstantiateCpu,
                              numbax::BindInstantiate());

// Plain mode runs Python on every call, so it must not be captured into a
// command buffer: no traits.
XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxCallableExecuteCuda,
                              numbax::ExecuteCallableCuda,
                              numbax::BindCudaExecute<numbax::CudaCallSite>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxCallableExecuteCpu, numbax::ExecuteCpu,
                              numbax::BindCpuExecute<numbax::CpuCallSite>());
