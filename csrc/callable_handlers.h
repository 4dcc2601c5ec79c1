// Handler symbols for numba_cuda_callable (one per stage and platform).
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* NumbaxCallableInstantiateCuda(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCallableInstantiateCpu(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCallableExecuteCuda(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCallableExecuteCudaCapture(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxCallableExecuteCpu(XLA_FFI_CallFrame* frame);
}
