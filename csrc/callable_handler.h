// The FFI handlers behind numba_cuda_callable (one per stage and platform),
// and the plain-mode call the capture-mode handler (capture_handler.cc)
// falls back to.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "call_site.h"
#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* NumbaxCallableInstantiateCuda(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCallableInstantiateCpu(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCallableExecuteCuda(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCallableExecuteCudaCapture(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCallableExecuteCpu(XLA_FFI_CallFrame* frame);
}

namespace numbax {

// A plain-mode call on CUDA (the handler itself: see BindCudaExecute):
// binds the device, then runs func under the GIL on XLA's stream. Capture
// mode falls back to it where it cannot record.
ffi::Error ExecuteCallableCuda(void* stream, int32_t device, CudaCallSite* site,
                               std::string_view key, ffi::RemainingArgs args,
                               ffi::RemainingRets rets);

// The same call, for plain mode (`plain`) or for capture mode where it
// cannot record (`plain` false: see CallSite::Invoke).
ffi::Error RunCallableCuda(void* stream, int32_t device, CudaCallSite* site,
                           ffi::RemainingArgs args, ffi::RemainingRets rets,
                           bool plain);

// Gives each of the site's aliased outputs its input's values where XLA
// handed it a buffer of its own (aliases.h): on `stream` on CUDA, on the
// host on the CPU. The error names the op.
ffi::Error KeepAliasedInputs(const CallSite& site, Platform platform,
                             void* stream,
                             const std::vector<BufferView>& buffers);

}  // namespace numbax
