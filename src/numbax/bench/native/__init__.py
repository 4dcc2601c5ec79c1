"""The native C++ reference handlers (CUDA, and CPU) and the helpers that
build them."""

from .build import (NativeCpuTargets, NativeTargets, build_and_register,
                    build_cpu_and_register)

__all__ = ["NativeCpuTargets", "NativeTargets", "build_and_register",
           "build_cpu_and_register"]
