// numba_cuda_kernel's FFI handlers: a compiled Numba kernel launched from
// C++ on XLA's stream, with no Python and no GIL per call.
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* NumbaxKernelInstantiateCuda(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* NumbaxKernelExecuteCuda(XLA_FFI_CallFrame* frame);
}
