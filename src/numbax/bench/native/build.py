"""Compile native_ffi.cu (shipped next to this module) with nvcc at run time,
load it, register its FFI targets; and native_ffi_cpu.cc, the CPU reference,
with the machine's C++ compiler (cached)."""

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


# ---------------------------------------------------------------------------
# The CPU reference (native_ffi_cpu.cc): built with the machine's C++ compiler,
# kept in a cache keyed by the source, the compiler, the FFI headers and the
# flags, so a second run of the suite compiles nothing.

CPU_SOURCE = Path(__file__).with_name("native_ffi_cpu.cc")
CPU_AFFINE_SYMBOL = "NativeCpuAffine"
CPU_EMPTY_SYMBOL = "NativeCpuEmpty"
CPU_AFFINE_TARGET = "numbax_bench_native_cpu_affine"
CPU_EMPTY_TARGET = "numbax_bench_native_cpu_empty"
# -march=native: Numba compiles kernels for the host CPU, so the hand-written
# loop gets the same instruction set. Dropped when the compiler refuses it.
_CPU_FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=c++17"]


@dataclass
class NativeCpuTargets:
    """What build_cpu_and_register produced."""
    affine: str
    empty: str
    library: str
    command: list[str]
    compiler_version: str
    cached: bool               # True: loaded from the cache, nothing compiled


def find_cxx() -> str:
    """The C++ compiler: $CXX, else c++, g++ or clang++ on PATH."""
    candidates = [os.environ.get("CXX"), shutil.which("c++"), shutil.which("g++"),
                  shutil.which("clang++")]
    for c in candidates:
        if c and (os.path.isfile(c) or shutil.which(c)):
            return shutil.which(c) or c
    raise FileNotFoundError("no C++ compiler found (set CXX, or install g++ or "
                            "clang++)")


def cxx_version(cxx: str) -> str:
    try:
        text = subprocess.run([cxx, "--version"], capture_output=True,
                              text=True, timeout=60).stdout
    except Exception as exc:  # noqa: BLE001 - only informational
        return f"unknown ({exc})"
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "unknown"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return Path(base) / "numbax" / "bench"


def _cpu_cache_key(cxx: str, version: str, include: str, flags: list[str]) -> str:
    import hashlib
    h = hashlib.sha256()
    for part in (CPU_SOURCE.read_bytes(), cxx.encode(), version.encode(),
                 include.encode(), " ".join(flags).encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def compile_cpu_library(out: Path, cxx: str, include: str) -> list[str]:
    """Compiles native_ffi_cpu.cc into `out` (written atomically); returns
    the command that succeeded."""
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    errors = []
    for flags in (_CPU_FLAGS, [f for f in _CPU_FLAGS if f != "-march=native"]):
        cmd = [cxx, *flags, "-I", include, str(CPU_SOURCE), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            os.replace(tmp, out)
            return cmd
        errors.append(f"{' '.join(cmd)} ({proc.returncode}):\n"
                      f"{proc.stdout}{proc.stderr}")
    raise RuntimeError("the C++ compiler failed:\n" + "\n".join(errors))


_cpu_registered: NativeCpuTargets | None = None


def build_cpu_and_register(build_dir: str | None = None) -> NativeCpuTargets:
    """Builds (or finds in the cache) the CPU reference library and registers
    its handlers for platform cpu, once per process. `build_dir` replaces
    the cache directory. Raises FileNotFoundError without a C++ compiler."""
    global _cpu_registered
    if _cpu_registered is not None:
        return _cpu_registered
    import jax
    import jax.ffi

    cxx = find_cxx()
    version = cxx_version(cxx)
    include = jax.ffi.include_dir()
    key = _cpu_cache_key(cxx, version, include, _CPU_FLAGS)
    directory = Path(build_dir) if build_dir else cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"libnumbax_bench_native_cpu-{key}.so"
    cached = path.is_file()
    # Cached: the command that built it (the key covers every part of it).
    cmd = ([cxx, *_CPU_FLAGS, "-I", include, str(CPU_SOURCE), "-o", str(path)]
           if cached else compile_cpu_library(path, cxx, include))
    lib = ctypes.cdll.LoadLibrary(str(path))
    _libraries.append(lib)
    for target, symbol in ((CPU_AFFINE_TARGET, CPU_AFFINE_SYMBOL),
                           (CPU_EMPTY_TARGET, CPU_EMPTY_SYMBOL)):
        jax.ffi.register_ffi_target(
            target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    _cpu_registered = NativeCpuTargets(CPU_AFFINE_TARGET, CPU_EMPTY_TARGET,
                                       str(path), cmd, version, cached)
    return _cpu_registered
