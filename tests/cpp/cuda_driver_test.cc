// Tests for loading the CUDA driver (csrc/cuda_driver.*) where there is
// none: the extension must import and the CPU path must keep working on
// such machines, with a reason to show the user instead of a crash.
#include "cuda_driver.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using numbax::cuda::Load;

TEST(CudaDriver, LoadWithoutDriverFailsWithReason) {
  std::string why;
  const numbax::cuda::Driver* driver = Load(&why);
  if (driver != nullptr) {
    GTEST_SKIP() << "a usable CUDA driver is present";
  }
  EXPECT_FALSE(why.empty());
  // Whichever step failed, the reason should point at CUDA, not be a bare
  // dlerror() string.
  EXPECT_TRUE(why.find("CUDA") != std::string::npos ||
              why.find("cuInit") != std::string::npos)
      << why;
}

TEST(CudaDriver, FailedLoadIsStableAndReasonIsOptional) {
  std::string first;
  if (Load(&first) != nullptr) {
    GTEST_SKIP() << "a usable CUDA driver is present";
  }
  // The outcome is cached: later calls (from other handlers) report the
  // same failure without retrying dlopen.
  std::string second = "stale text that must be replaced";
  EXPECT_EQ(Load(&second), nullptr);
  EXPECT_EQ(second, first);
  EXPECT_EQ(Load(nullptr), nullptr);
  EXPECT_EQ(Load(), nullptr);
}

}  // namespace
