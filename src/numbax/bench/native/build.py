"""Compile native_ffi.cu (shipped next to this module) with nvcc at run time,
load it, register its FFI targets."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("native_ffi.cu")
PLAIN_SYMBOL = "NativeAffine"
CMD_BUFFER_SYMBOL = "NativeAffineCmdBuffer"
PLAIN_TARGET = "numbax_bench_native_affine"
CMD_BUFFER_TARGET = "numbax_bench_native_affine_cmdbuf"
NO_LAUNCH_SYMBOL = "NativeNoLaunch"
NO_LAUNCH_TARGET = "numbax_bench_native_no_launch"

# Header-only warnings from XLA's FFI headers; real errors still fail the build.
_QUIET = ["-diag-suppress=940,2473", "-Xcompiler", "-Wno-return-type"]


@dataclass
class NativeTargets:
    """What build_and_register produced: FFI target names and build facts."""
    plain: str
    cmd_buffer: str
    library: str
    command: list[str]
    nvcc_version: str
    no_launch: str = NO_LAUNCH_TARGET  # returns at once: XLA's own cost


def find_nvcc() -> str:
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                 "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "nvcc"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("nvcc not found (set NVCC or CUDA_HOME, or put it on PATH)")


def arch_flag(compute_capability: str | None) -> str:
    """-arch=sm_90 on compute capability 9.0, else let nvcc pick the local GPU."""
    if compute_capability is not None and compute_capability.strip() == "9.0":
        return "-arch=sm_90"
    return "-arch=native"


def compile_library(out_dir: str | os.PathLike, compute_capability: str | None,
                    *, nvcc: str | None = None) -> tuple[Path, list[str]]:
    """Builds the shared library into out_dir; returns (path, command)."""
    import jax.ffi

    nvcc = nvcc or find_nvcc()
    out = Path(out_dir) / "libnumbax_bench_native.so"
    cmd = [nvcc, arch_flag(compute_capability), "-O3", "-shared",
           "-Xcompiler", "-fPIC", "-std=c++17", *_QUIET,
           "-I", jax.ffi.include_dir(), str(SOURCE), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"nvcc failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}")
    return out, cmd


def nvcc_version(nvcc: str | None = None) -> str:
    try:
        text = subprocess.run([nvcc or find_nvcc(), "--version"],
                              capture_output=True, text=True).stdout
    except Exception as exc:  # noqa: BLE001 - only informational
        return f"unknown ({exc})"
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown"


_registered: NativeTargets | None = None
_libraries: list[ctypes.CDLL] = []  # keep the handlers' code mapped


def build_and_register(compute_capability: str | None,
                       build_dir: str | None = None) -> NativeTargets:
    """Builds the library (into a fresh temp dir unless build_dir), registers
    its handlers for platform CUDA, once per process."""
    global _registered
    if _registered is not None:
        return _registered
    import jax

    out_dir = build_dir or tempfile.mkdtemp(prefix="numbax_bench_native_")
    os.makedirs(out_dir, exist_ok=True)
    nvcc = find_nvcc()
    path, cmd = compile_library(out_dir, compute_capability, nvcc=nvcc)
    lib = ctypes.cdll.LoadLibrary(str(path))
    _libraries.append(lib)
    jax.ffi.register_ffi_target(
        PLAIN_TARGET, jax.ffi.pycapsule(getattr(lib, PLAIN_SYMBOL)),
        platform="CUDA")
    jax.ffi.register_ffi_target(
        CMD_BUFFER_TARGET, jax.ffi.pycapsule(getattr(lib, CMD_BUFFER_SYMBOL)),
        platform="CUDA")
    jax.ffi.register_ffi_target(
        NO_LAUNCH_TARGET, jax.ffi.pycapsule(getattr(lib, NO_LAUNCH_SYMBOL)),
        platform="CUDA")
    _registered = NativeTargets(PLAIN_TARGET, CMD_BUFFER_TARGET, str(path),
                                cmd, nvcc_version(nvcc))
    return _registered
