// The FFI handlers behind numba_cuda_callable (one per stage and platform),
// and the plain-mode pieces the capture-mode handler (capture_handler.cc)
// shares.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "call_frame.h"
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

// Decodes the call frame into `buffers`, checked against the counts `site`
// resolved; a failure names the op.
ffi::Error DecodeCallableBuffers(const CallSite& site,
                                 const ffi::RemainingArgs& args,
                                 const ffi::RemainingRets& rets,
                                 std::vector<BufferView>* buffers);

// A plain-mode call on CUDA (the handler itself: see BindCudaExecute):
// binds the device, then runs func under the GIL on XLA's stream. Capture
// mode falls back to it where it cannot record.
ffi::Error ExecuteCallableCuda(void* stream, int32_t device, CudaCallSite* site,
                               std::string_view key, ffi::RemainingArgs args,
                               ffi::RemainingRets rets);

}  // namespace numbax
