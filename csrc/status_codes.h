// The CUDA driver's result codes numbax returns or tests for by name.
//
// The values are the driver's own (cuda.h), declared here because numbax
// builds without the CUDA toolkit (see cuda_driver.h). A code numbax makes
// up itself, rather than one the driver returned, is one of these, so that
// ErrorText names it as the driver would.
#pragma once

namespace numbax::cuda {

using CUresult = int;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;

}  // namespace numbax::cuda
