// Native reference for the numbax benchmarks: y = 2x + 1 as a typed XLA FFI
// handler with a plain <<<>>> launch, 256 threads per block, one element per
// thread (the same launch numbax's kernels get from launch_dims=n).
//
// Two exported handlers share one implementation:
//   NativeAffine           - plain: XLA launches it as a custom call.
//   NativeAffineCmdBuffer  - declares kCmdBufferCompatible, so XLA may record
//                            it into a CUDA graph (command buffer).
// and one that launches nothing, to time what XLA itself spends on a plain
// custom call (bridge_cost's stage split):
//   NativeNoLaunch         - decodes the same call frame and returns.

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kThreadsPerBlock = 256;

__global__ void AffineKernel(const float* __restrict__ x, float* __restrict__ y,
                             int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}

ffi::Error AffineImpl(cudaStream_t stream, ffi::Buffer<ffi::F32> x,
                      ffi::ResultBuffer<ffi::F32> y) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (static_cast<int64_t>(y->element_count()) != n) {
    return ffi::Error::InvalidArgument("input and output sizes differ");
  }
  if (n == 0) return ffi::Error::Success();
  const int64_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks > 0x7fffffffLL) {
    return ffi::Error::InvalidArgument("array too large for a 1-D grid");
  }
  AffineKernel<<<static_cast<unsigned int>(blocks), kThreadsPerBlock, 0,
                 stream>>>(x.typed_data(), y->typed_data(), n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return ffi::Error::Internal(std::string("AffineKernel launch failed: ") +
                                cudaGetErrorString(err));
  }
  return ffi::Error::Success();
}

// Leaves y unwritten: only its time is read.
ffi::Error NoLaunchImpl(cudaStream_t, ffi::Buffer<ffi::F32>,
                        ffi::ResultBuffer<ffi::F32>) {
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NativeNoLaunch, NoLaunchImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(NativeAffine, AffineImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(NativeAffineCmdBuffer, AffineImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});
