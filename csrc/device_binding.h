// Device binding: the step between the call frame and the work.
//
// Numba and the driver work in whatever CUDA context is current on the
// calling thread. Every CUDA entry point (the execute handlers, and
// numbax._core.kernel_function and call_on_device) therefore makes the
// primary context of the device XLA, or the caller, named current for its
// work, and fails with the same words when it cannot.
#pragma once

#include <stdexcept>
#include <string>

#include "cuda_driver.h"

namespace numbax {

// The primary context of `device` current on this thread for the scope,
// then whatever was current before. Check ok() before doing the work.
class DeviceBinding {
 public:
  DeviceBinding(const cuda::Driver& driver, int device)
      : driver_(driver), device_(device), scope_(driver, device) {}
  DeviceBinding(const DeviceBinding&) = delete;
  DeviceBinding& operator=(const DeviceBinding&) = delete;

  bool ok() const { return scope_.status() == cuda::CUDA_SUCCESS; }

  // Why binding failed: "cannot bind CUDA device 1: CUDA_ERROR_X (text)".
  std::string Error() const;

 private:
  const cuda::Driver& driver_;
  int device_;
  cuda::ScopedDevice scope_;
};

// For entry points called from Python: loads the driver, binds `device`,
// and returns fn(driver) run with it bound. Throws std::runtime_error
// (RuntimeError in Python) saying why when either step fails.
template <typename Fn>
decltype(auto) RunOnDevice(int device, Fn&& fn) {
  std::string why;
  const cuda::Driver* driver = cuda::Load(&why);
  if (!driver) throw std::runtime_error(why);
  DeviceBinding bind(*driver, device);
  if (!bind.ok()) throw std::runtime_error(bind.Error());
  return fn(*driver);
}

}  // namespace numbax
