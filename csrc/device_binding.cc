#include "device_binding.h"

namespace numbax {

std::string DeviceBinding::Error() const {
  return "cannot bind CUDA device " + std::to_string(device_) + ": " +
         cuda::ErrorText(driver_, scope_.status());
}

}  // namespace numbax
