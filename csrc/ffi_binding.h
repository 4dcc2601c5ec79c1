// The FFI signatures of numbax's handlers, each spelled once.
//
// XLA decodes a call frame by the binding a handler was defined with; the
// execute handlers on CUDA (plain and capture-mode callables, kernels) all
// take the same context and arguments, so a change to what they receive is
// made here, for all of them.
#pragma once

#include <cstdint>
#include <string_view>

#include "xla/ffi/api/ffi.h"

namespace numbax {

namespace ffi = ::xla::ffi;

// Instantiate stage, every handler: the "key" attribute names the Python
// function or kernel to resolve for the call site.
//
// The buffers are bound and ignored. XLA's GPU runtime passes the call's
// operands and results at instantiate too (seen with jaxlib 0.11.2; its CPU
// runtime passes none), and the typed binding of the FFI headers the wheel
// is compiled against (API 0.2) refuses any count but the bound one: bound
// as "no buffers", every GPU call failed with "Wrong number of arguments:
// expected 0 but got 1". Remaining-args accepts any count, on every version.
// The handler's signature:
//   ffi::ErrorOr<std::unique_ptr<Site>> (ffi::RemainingArgs,
//   ffi::RemainingRets,
//                                        std::string_view key)
inline auto BindInstantiate() {
  return ffi::Ffi::BindInstantiate()
      .RemainingArgs()
      .RemainingRets()
      .Attr<std::string_view>("key");
}

// Execute stage on CUDA: XLA's stream, the device it placed the call on,
// the call site `Site` built at instantiate, the key (resolved already;
// bound because XLA passes it), then the buffers. The handler's signature:
//   ffi::Error (void* stream, int32_t device, Site* site,
//               std::string_view key, ffi::RemainingArgs args,
//               ffi::RemainingRets rets)
template <typename Site>
auto BindCudaExecute() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<void*>>()
      .Ctx<ffi::DeviceOrdinal>()
      .template Ctx<ffi::State<Site>>()
      .template Attr<std::string_view>("key")
      .RemainingArgs()
      .RemainingRets();
}

// Execute stage on the CPU: no stream or device.
template <typename Site>
auto BindCpuExecute() {
  return ffi::Ffi::Bind()
      .template Ctx<ffi::State<Site>>()
      .template Attr<std::string_view>("key")
      .RemainingArgs()
      .RemainingRets();
}

}  // namespace numbax
