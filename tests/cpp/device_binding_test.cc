// Tests for device binding (csrc/device_binding.*) and the kernel function
// lookup (csrc/cuda_driver.*) against a fake driver table: what every CUDA
// entry point does before its work, and the words it fails with, without a
// GPU.
#include "device_binding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_driver.h"
#include "status_codes.h"

namespace {

namespace cuda = numbax::cuda;

// The fake driver's state: one context per device, at a made-up address,
// and the thread's current context.
cuda::CUcontext ContextOf(int device) {
  return reinterpret_cast<cuda::CUcontext>(0x1000 + 0x10 * device);
}
cuda::CUcontext g_current = nullptr;
constexpr int kFailingDevice = 7;  // its primary context cannot be retained
constexpr cuda::CUresult kOutOfMemory = 2;

int g_set_attribute_calls = 0;
int g_set_attribute_value = 0;
cuda::CUresult g_set_attribute_result = cuda::CUDA_SUCCESS;
cuda::CUresult g_get_function_result = cuda::CUDA_SUCCESS;

cuda::Driver FakeDriver() {
  cuda::Driver d{};
  d.cuGetErrorName = [](cuda::CUresult r, const char** s) {
    *s = r == cuda::CUDA_ERROR_INVALID_DEVICE ? "CUDA_ERROR_INVALID_DEVICE"
         : r == kOutOfMemory                  ? "CUDA_ERROR_OUT_OF_MEMORY"
                                              : nullptr;
    return *s ? cuda::CUDA_SUCCESS : 1;
  };
  d.cuGetErrorString = [](cuda::CUresult r, const char** s) {
    *s = r == cuda::CUDA_ERROR_INVALID_DEVICE ? "invalid device ordinal"
         : r == kOutOfMemory                  ? "out of memory"
                                              : nullptr;
    return *s ? cuda::CUDA_SUCCESS : 1;
  };
  d.cuDeviceGet = [](cuda::CUdevice* device, int ordinal) {
    *device = ordinal;
    return cuda::CUDA_SUCCESS;
  };
  d.cuDevicePrimaryCtxRetain = [](cuda::CUcontext* c, cuda::CUdevice device) {
    if (device == kFailingDevice) return kOutOfMemory;
    *c = ContextOf(device);
    return cuda::CUDA_SUCCESS;
  };
  d.cuCtxGetCurrent = [](cuda::CUcontext* c) {
    *c = g_current;
    return cuda::CUDA_SUCCESS;
  };
  d.cuCtxSetCurrent = [](cuda::CUcontext c) {
    g_current = c;
    return cuda::CUDA_SUCCESS;
  };
  d.cuKernelGetFunction = [](cuda::CUfunction* f, cuda::CUkernel k) {
    if (g_get_function_result != cuda::CUDA_SUCCESS) {
      return g_get_function_result;
    }
    *f = reinterpret_cast<cuda::CUfunction>(reinterpret_cast<uintptr_t>(k) + 1);
    return cuda::CUDA_SUCCESS;
  };
  d.cuFuncSetAttribute = [](cuda::CUfunction, int attribute, int value) {
    EXPECT_EQ(attribute, cuda::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    ++g_set_attribute_calls;
    g_set_attribute_value = value;
    return g_set_attribute_result;
  };
  return d;
}

TEST(DeviceBinding, MakesThePrimaryContextCurrentThenRestores) {
  const cuda::Driver driver = FakeDriver();
  cuda::CUcontext before = reinterpret_cast<cuda::CUcontext>(0x42);
  g_current = before;
  {
    numbax::DeviceBinding bind(driver, 2);
    ASSERT_TRUE(bind.ok());
    EXPECT_EQ(g_current, ContextOf(2));
  }
  EXPECT_EQ(g_current, before);
}

TEST(DeviceBinding, InvalidOrdinalFailsWithTheDeviceNamed) {
  const cuda::Driver driver = FakeDriver();
  g_current = nullptr;
  numbax::DeviceBinding bind(driver, -1);
  EXPECT_FALSE(bind.ok());
  EXPECT_EQ(bind.Error(),
            "cannot bind CUDA device -1: CUDA_ERROR_INVALID_DEVICE (invalid "
            "device ordinal)");
  EXPECT_EQ(g_current, nullptr);  // nothing was switched
}

TEST(DeviceBinding, DriverRefusalFailsWithTheDriversWords) {
  const cuda::Driver driver = FakeDriver();
  g_current = nullptr;
  numbax::DeviceBinding bind(driver, kFailingDevice);
  EXPECT_FALSE(bind.ok());
  EXPECT_EQ(bind.Error(),
            "cannot bind CUDA device 7: CUDA_ERROR_OUT_OF_MEMORY (out of "
            "memory)");
  EXPECT_EQ(g_current, nullptr);
}

TEST(DeviceBinding, RunOnDeviceWithoutDriverThrowsTheLoadReason) {
  std::string why;
  if (cuda::Load(&why) != nullptr) {
    GTEST_SKIP() << "a usable CUDA driver is present";
  }
  bool ran = false;
  try {
    numbax::RunOnDevice(0, [&](const cuda::Driver&) { return ran = true; });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), why);
  }
  EXPECT_FALSE(ran);
}

TEST(KernelFunction, LoadsTheKernelsFunction) {
  const cuda::Driver driver = FakeDriver();
  g_get_function_result = cuda::CUDA_SUCCESS;
  g_set_attribute_calls = 0;
  cuda::CUfunction f = nullptr;
  std::string error;
  ASSERT_TRUE(cuda::KernelFunction(
      driver, reinterpret_cast<cuda::CUkernel>(0x500), 48 * 1024, &f, &error));
  EXPECT_EQ(f, reinterpret_cast<cuda::CUfunction>(0x501));
  // 48 KiB is the default limit: nothing to raise.
  EXPECT_EQ(g_set_attribute_calls, 0);
}

TEST(KernelFunction, OldDriversHandleIsTheFunction) {
  cuda::Driver driver = FakeDriver();
  driver.cuKernelGetFunction = nullptr;
  cuda::CUfunction f = nullptr;
  std::string error;
  ASSERT_TRUE(cuda::KernelFunction(
      driver, reinterpret_cast<cuda::CUkernel>(0x500), 0, &f, &error));
  EXPECT_EQ(f, reinterpret_cast<cuda::CUfunction>(0x500));
}

TEST(KernelFunction, RaisesTheSharedMemoryLimitAbove48KiB) {
  const cuda::Driver driver = FakeDriver();
  g_get_function_result = cuda::CUDA_SUCCESS;
  g_set_attribute_calls = 0;
  g_set_attribute_result = cuda::CUDA_SUCCESS;
  cuda::CUfunction f = nullptr;
  std::string error;
  ASSERT_TRUE(cuda::KernelFunction(driver,
                                   reinterpret_cast<cuda::CUkernel>(0x500),
                                   48 * 1024 + 1, &f, &error));
  EXPECT_EQ(g_set_attribute_calls, 1);
  EXPECT_EQ(g_set_attribute_value, 48 * 1024 + 1);
}

TEST(KernelFunction, RefusalsSayWhichStepFailed) {
  const cuda::Driver driver = FakeDriver();
  cuda::CUfunction f = nullptr;
  std::string error;
  g_get_function_result = kOutOfMemory;
  EXPECT_FALSE(cuda::KernelFunction(
      driver, reinterpret_cast<cuda::CUkernel>(0x500), 0, &f, &error));
  EXPECT_EQ(error,
            "cuKernelGetFunction: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");

  g_get_function_result = cuda::CUDA_SUCCESS;
  g_set_attribute_result = kOutOfMemory;
  error.clear();
  EXPECT_FALSE(cuda::KernelFunction(
      driver, reinterpret_cast<cuda::CUkernel>(0x500), 100000, &f, &error));
  EXPECT_EQ(error,
            "shared_mem=100000 bytes is more than the device allows: "
            "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  g_set_attribute_result = cuda::CUDA_SUCCESS;
}

}  // namespace

namespace {

unsigned g_launched[7];
int g_plain = 0, g_cooperative = 0;

TEST(LaunchKernel, PlainAndCooperativeGoToTheirEntryPoints) {
  cuda::Driver d{};
  d.cuLaunchKernel = [](cuda::CUfunction, unsigned gx, unsigned gy, unsigned gz,
                        unsigned bx, unsigned by, unsigned bz, unsigned smem,
                        cuda::CUstream, void**, void**) {
    ++g_plain;
    const unsigned got[7] = {gx, gy, gz, bx, by, bz, smem};
    std::copy(got, got + 7, g_launched);
    return cuda::CUDA_SUCCESS;
  };
  d.cuLaunchCooperativeKernel = [](cuda::CUfunction, unsigned, unsigned,
                                   unsigned, unsigned, unsigned, unsigned,
                                   unsigned, cuda::CUstream, void**) {
    ++g_cooperative;
    return cuda::CUDA_SUCCESS;
  };
  const unsigned grid[3] = {4, 2, 1}, block[3] = {32, 8, 1};
  EXPECT_EQ(
      cuda::LaunchKernel(d, nullptr, grid, block, 96, false, nullptr, nullptr),
      cuda::CUDA_SUCCESS);
  EXPECT_EQ(g_plain, 1);
  const unsigned want[7] = {4, 2, 1, 32, 8, 1, 96};
  EXPECT_TRUE(std::equal(want, want + 7, g_launched));
  EXPECT_EQ(
      cuda::LaunchKernel(d, nullptr, grid, block, 0, true, nullptr, nullptr),
      cuda::CUDA_SUCCESS);
  EXPECT_EQ(g_cooperative, 1);
  EXPECT_EQ(g_plain, 1);
}

TEST(LaunchKernel, CooperativeWithoutTheEntryPointIsNotFoundNotACrash) {
  cuda::Driver d{};  // an old driver: no cuLaunchCooperativeKernel
  const unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  EXPECT_EQ(
      cuda::LaunchKernel(d, nullptr, grid, block, 0, true, nullptr, nullptr),
      cuda::CUDA_ERROR_NOT_FOUND);
}

}  // namespace
