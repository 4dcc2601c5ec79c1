"""The native CUDA C++ reference handler and the helper that builds it."""

from .build import NativeTargets, build_and_register

__all__ = ["NativeTargets", "build_and_register"]
