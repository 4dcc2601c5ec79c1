// Native CPU reference for the numbax CPU benchmarks: y = 2x + 1 over float32
// as a typed XLA FFI CPU handler, the loop written by hand, and a handler that
// decodes the same call frame and does nothing (the floor: XLA's own cost of
// a custom call on the CPU).
//
//   NativeCpuAffine  - y[i] = 2 x[i] + 1 over every element (any rank: a
//                      vmapped batch is one call over the whole batch).
//   NativeCpuEmpty   - the same binding, returns at once (y is left unset).
//
// Built by numbax/bench/native/build.py with the machine's C++ compiler at
// -O3 -march=native (Numba compiles for the host CPU too), against
// jax.ffi.include_dir().

#include <cstddef>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error AffineImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  const std::size_t n = x.element_count();
  if (y->element_count() != n) {
    return ffi::Error::InvalidArgument("input and output sizes differ");
  }
  const float* __restrict__ in = x.typed_data();
  float* __restrict__ out = y->typed_data();
  for (std::size_t i = 0; i < n; ++i) out[i] = 2.0f * in[i] + 1.0f;
  return ffi::Error::Success();
}

ffi::Error EmptyImpl(ffi::Buffer<ffi::F32>, ffi::ResultBuffer<ffi::F32>) {
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NativeCpuAffine, AffineImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(NativeCpuEmpty, EmptyImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
