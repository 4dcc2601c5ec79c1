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

ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiateCuda(std::string_view key) {
  return CallSite::Create(key, Platform::kCuda);
}

ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiateCpu(std::string_view key) {
  return CallSite::Create(key, Platform::kCpu);
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
  if (!PythonIsAlive()) {
    return ffi::Error::Internal("numbax op '" + site->key() +
                                "': the Python interpreter is shutting down");
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  ffi::Error result = site->Invoke(buffers, platform, device, stream);
  PyGILState_Release(gil);
  return result;
}

ffi::Error ExecuteCuda(void* stream, int32_t device, CallSite* site,
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

ffi::Error ExecuteCpu(CallSite* site, std::string_view /*key*/,
                      ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return Run(site, args, rets, Platform::kCpu, -1, nullptr);
}

}  // namespace
}  // namespace numbax

using numbax::ffi::Ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxCallableInstantiateCuda,
                              numbax::InstantiateCuda,
                              Ffi::BindInstantiate().Attr<std::string_view>("key"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxCallableInstantiateCpu,
                              numbax::InstantiateCpu,
                              Ffi::BindInstantiate().Attr<std::string_view>("key"));

// Plain mode runs Python on every call, so it must not be captured into a
// command buffer: no traits.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxCallableExecuteCuda, numbax::ExecuteCuda,
    Ffi::Bind()
        .Ctx<numbax::ffi::PlatformStream<void*>>()
        .Ctx<numbax::ffi::DeviceOrdinal>()
        .Ctx<numbax::ffi::State<numbax::CallSite>>()
        .Attr<std::string_view>("key")
        .RemainingArgs()
        .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxCallableExecuteCpu, numbax::ExecuteCpu,
    Ffi::Bind()
        .Ctx<numbax::ffi::State<numbax::CallSite>>()
        .Attr<std::string_view>("key")
        .RemainingArgs()
        .RemainingRets());
