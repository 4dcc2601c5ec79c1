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
inline auto BindInstantiate() {
  return ffi::Ffi::BindInstantiate().Attr<std::string_view>("key");
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
