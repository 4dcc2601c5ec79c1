"""The ``python -m numbax`` command line.

``python -m numbax info``
    Versions of numbax and what it runs on (jax, jaxlib, numba, numba-cuda,
    numpy, the XLA FFI API numbax was compiled against and the one the
    running jaxlib provides), the GPUs JAX and Numba see, whether Numba's CUDA
    simulator is on, and the known incompatibilities found, each with its
    fix. Exit status 1 when one is found. ``--json`` prints the same as JSON.

``python -m numbax bench [options]``
    The benchmark suite (:mod:`numbax.bench.run`): a progress bar, the table
    in the terminal, ``--plot out.png`` for a chart, ``--json`` for the
    record. It times GPU paths; where JAX sees no GPU it times the CPU rows
    (``numba_kernel`` against a C++ FFI CPU handler: :mod:`numbax.bench.cpu`),
    or runs the ``--cpu-smoke`` check when the simulator is on (see
    :mod:`numbax.bench.mode`). ``python -m numbax bench --help`` lists the
    options.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from ._version import __version__
from .runtime import compat

PROG = "python -m numbax"

#: Distributions whose versions ``info`` reports (those not installed show
#: as "not installed"; the jax CUDA plugins only when installed).
DISTRIBUTIONS = ("jax", "jaxlib", "numba", "numba-cuda", "numpy",
                 "cuda-bindings", "ml_dtypes")
JAX_PLUGINS = ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
               "jax-cuda13-pjrt")


@dataclass
class Problem:
    """A known incompatibility found in this environment."""
    what: str   # what is wrong, and what it breaks
    fix: str    # what to do about it


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str | None) -> tuple[int, ...]:
    return compat.release(version)  # one parser for every version check


def _error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _api_text(api: tuple[int, ...] | None) -> str | None:
    return None if api is None else ".".join(map(str, api))


def _api_tuple(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    major, _, minor = text.partition(".")
    return int(major), int(minor)


def xla_ffi_api() -> dict[str, Any]:
    """The XLA FFI C API versions that must agree: the one numbax._core was
    compiled against (recorded at build time), where its headers came from,
    the range of versions that build serves ([oldest, newest], or None), and
    the one the running jaxlib provides."""
    built, built_from = compat.built_ffi_api()
    served = compat.served_ffi_api(built)
    return {"built": _api_text(built), "built_from": built_from or None,
            "serves": None if served is None else [_api_text(v) for v in served],
            "jaxlib": _api_text(compat.runtime_ffi_api())}


def _ffi_text(ffi: dict[str, Any]) -> str:
    """The 'XLA FFI API' line of ``info``: what was compiled in, the range
    that build serves, and where the running jaxlib stands in it."""
    source = f", the headers of {ffi['built_from']}" if ffi["built_from"] else ""
    text = f"{ffi['built'] or 'unknown'} compiled into numbax{source}; "
    served, jaxlib = ffi.get("serves"), ffi["jaxlib"]
    if served:
        text += f"this build serves XLA FFI API {served[0]} to {served[1]}; "
    text += f"the running jaxlib provides {jaxlib or 'unknown'}"
    oldest, newest, now = (_api_tuple(v) for v in (
        *(served or (None, None)), jaxlib))
    if oldest and newest and now:
        text += (" (within that range)" if oldest <= now <= newest
                 else " (outside that range)")
    return text


def cuda_driver() -> dict[str, Any]:
    """Whether the CUDA driver library loads, and its version."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {"loaded": False, "version": None, "error": str(exc)}
    version = ctypes.c_int(0)
    try:
        rc = lib.cuDriverGetVersion(ctypes.byref(version))
    except Exception as exc:  # noqa: BLE001
        return {"loaded": True, "version": None, "error": _error(exc)}
    if rc != 0:
        return {"loaded": True, "version": None,
                "error": f"cuDriverGetVersion returned {rc}"}
    v = version.value
    return {"loaded": True, "version": f"{v // 1000}.{(v % 1000) // 10}",
            "error": None}


def _jax_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"backend": None, "devices": [], "gpus": [],
                             "error": None, "gpu_error": None}
    try:
        import jax
        facts["backend"] = jax.default_backend()
        facts["devices"] = [f"{d.platform}:{d.id} ({getattr(d, 'device_kind', d)})"
                            for d in jax.devices()]
    except Exception as exc:  # noqa: BLE001
        facts["error"] = _error(exc)
        return facts
    try:
        facts["gpus"] = [f"{d.id}: {getattr(d, 'device_kind', d)}"
                         for d in jax.devices("gpu")]
    except Exception as exc:  # noqa: BLE001 - no GPU backend
        facts["gpu_error"] = _error(exc)
    return facts


def _numba_facts(simulator: bool) -> dict[str, Any]:
    facts: dict[str, Any] = {"import_error": None, "gpus": [], "available": None,
                             "error": None}
    try:
        from numba import cuda
    except Exception as exc:  # noqa: BLE001
        facts["import_error"] = _error(exc)
        return facts
    if simulator:
        return facts
    try:
        facts["available"] = bool(cuda.is_available())
        if facts["available"]:
            for gpu in cuda.gpus:
                name = gpu.name.decode() if isinstance(gpu.name, bytes) else gpu.name
                cc = ".".join(map(str, gpu.compute_capability))
                facts["gpus"].append(f"{gpu.id}: {name} (compute capability {cc})")
    except Exception as exc:  # noqa: BLE001
        facts["error"] = _error(exc)
    return facts


def collect_info() -> dict[str, Any]:
    """Everything ``python -m numbax info`` reports, as a dict."""
    import numbax

    info: dict[str, Any] = {
        "numbax": numbax.__version__,
        "numbax_path": os.path.dirname(os.path.abspath(numbax.__file__)),
        "python": sys.version.split()[0],
        "versions": {d: _version(d) for d in DISTRIBUTIONS},
        "jax_plugins": {d: v for d in JAX_PLUGINS if (v := _version(d))},
        "xla_ffi_api": xla_ffi_api(),
        "env": {k: os.environ.get(k) for k in (
            "NUMBA_ENABLE_CUDASIM", "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES",
            "XLA_FLAGS")},
    }
    try:
        from numbax import _core
        info["extension"] = {"loaded": True, "path": getattr(_core, "__file__", None),
                             "error": None}
    except Exception as exc:  # noqa: BLE001
        info["extension"] = {"loaded": False, "path": None, "error": _error(exc)}
    info["simulator"] = numbax.simulator_enabled()
    info["numba_cuda"] = _numba_facts(info["simulator"])
    info["jax"] = _jax_facts()
    info["cuda_driver"] = cuda_driver()
    # What needs the extension is imported here, in a try: a broken one is
    # a problem to report.
    try:  # one line: is the fast launch path of plain callables on, and why
        from .compilers import numba_cuda_launch
        info["fast_launch"] = numba_cuda_launch.status()
    except Exception as exc:  # noqa: BLE001
        info["fast_launch"] = f"unknown ({_error(exc)})"
    try:  # whether a profiler's NVTX tool attached (docs/profiling.md)
        from numbax import _core
        info["nvtx"] = (
            "attached: each op call is an NVTX range named after the op"
            if _core.nvtx_attached() else
            "no tool attached (under Nsight Systems, each op call is an "
            "NVTX range named after the op)")
    except Exception as exc:  # noqa: BLE001
        info["nvtx"] = f"unknown ({_error(exc)})"
    # The optional second compiler: read from its metadata, never imported
    # here (its import takes seconds).
    try:
        from .compilers import numba_cuda_mlir
        info["numba_cuda_mlir"] = {"version": numba_cuda_mlir.version(),
                                   "status": numba_cuda_mlir.status()}
    except Exception as exc:  # noqa: BLE001
        info["numba_cuda_mlir"] = {"version": _version("numba-cuda-mlir"),
                                   "status": f"unknown ({_error(exc)})"}
    return info


def _install_jax_cuda(driver: dict[str, Any]) -> str:
    """How to install JAX's CUDA plugin: the one matching the CUDA driver
    where its version is known, both otherwise."""
    cuda13 = 'pip install -U "jax[cuda13]"'
    cuda12 = 'pip install -U "jax[cuda12]"'
    version = driver.get("version")
    major = _release(version)[:1]
    if major == (12,):
        return (f"install JAX with CUDA for this CUDA {version} driver: "
                f"{cuda12}")
    if major and major[0] >= 13:
        return (f"install JAX with CUDA for this CUDA {version} driver: "
                f"{cuda13} (or {cuda12})")
    return (f"install JAX with CUDA: {cuda13} for a CUDA 13 driver, or "
            f"{cuda12} for a CUDA 12 one")


def find_problems(info: dict[str, Any]) -> list[Problem]:
    """The known incompatibilities in ``info`` (from :func:`collect_info`)."""
    problems = []
    v = info["versions"]
    ffi = info["xla_ffi_api"]
    jax_problem = compat.problem(v.get("jax"), v.get("jaxlib"),
                                 _api_tuple(ffi["built"]), _api_tuple(ffi["jaxlib"]),
                                 ffi["built_from"] or "")
    if jax_problem is not None:
        problems.append(Problem(*jax_problem))
    numpy_v, nc_v = _release(v.get("numpy")), _release(v.get("numba-cuda"))
    if numpy_v >= (2, 5) and nc_v and nc_v[:2] <= (0, 30):
        problems.append(Problem(
            f"numpy {v['numpy']} is too new for numba-cuda {v['numba-cuda']}: "
            "it cannot compile kernels (np.row_stack was removed in numpy 2.5), "
            "so every numbax op fails",
            "pip install 'numpy<2.5' (or upgrade numba-cuda past 0.30 once it "
            "supports numpy 2.5)"))
    for dist in ("numba", "numba-cuda"):
        if v.get(dist) is None:
            problems.append(Problem(
                f"{dist} is not installed: numbax needs it to run any kernel",
                "pip install numba numba-cuda cuda-bindings 'numpy<2.5'"))
    nb = info["numba_cuda"]
    if nb["import_error"] and v.get("numba") and v.get("numba-cuda"):
        problems.append(Problem(
            f"numba.cuda cannot be imported ({nb['import_error']})",
            "reinstall it: pip install --force-reinstall numba-cuda "
            "cuda-bindings"))
    ext = info["extension"]
    if not ext["loaded"]:
        problems.append(Problem(
            f"numbax's C++ extension numbax._core cannot be imported "
            f"({ext['error']}), so no numbax op can run",
            "reinstall numbax (pip install --force-reinstall numbax, the "
            "wheel); from a source checkout, pip install --force-reinstall . "
            "(or, to build against the installed jaxlib's headers, pip install "
            "--no-build-isolation --force-reinstall .)"))
    jx = info["jax"]
    driver = info["cuda_driver"]
    simulator = info["simulator"]
    platforms = info.get("env", {}).get("JAX_PLATFORMS") or ""
    wants_cuda = bool({p.strip().lower() for p in platforms.split(",")}
                      & {"cuda", "gpu"})
    if jx["error"] and wants_cuda and not info.get("jax_plugins"):
        # jax 0.10 fails here with a bare AssertionError.
        problems.append(Problem(
            f"JAX_PLATFORMS={platforms} asks for JAX's CUDA backend, but no "
            "JAX CUDA plugin is installed (jax-cuda13-plugin or "
            f"jax-cuda12-plugin), so JAX cannot start ({jx['error']})",
            _install_jax_cuda(driver) + "; or, to run on the CPU through "
            "Numba's CUDA simulator, set JAX_PLATFORMS=cpu "
            "NUMBA_ENABLE_CUDASIM=1"))
    elif jx["error"]:
        problems.append(Problem(f"JAX cannot start a backend ({jx['error']})",
                                "check JAX_PLATFORMS and the jax/jaxlib install"))
    elif jx["backend"] == "cpu" and not simulator:
        if driver["loaded"] and not jx["gpus"]:
            fix = ("this machine has a CUDA driver but JAX has no GPU backend: "
                   "pip install -U 'jax[cuda12]' (or 'jax[cuda13]' to match "
                   "the driver), and leave JAX_PLATFORMS unset; or, to debug "
                   "on the CPU, set NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu")
        else:
            fix = ("to run on the CPU, set NUMBA_ENABLE_CUDASIM=1 (and "
                   "JAX_PLATFORMS=cpu) before Python starts; on a GPU machine, "
                   "install JAX with CUDA: pip install -U 'jax[cuda12]'")
        problems.append(Problem(
            "JAX runs on the CPU but Numba's CUDA simulator is off: numbax ops "
            "on JAX's CPU backend run only through the simulator, so they fail",
            fix))
    elif jx["backend"] == "gpu" and simulator:
        problems.append(Problem(
            "NUMBA_ENABLE_CUDASIM=1 while JAX runs on the GPU: numbax ops on the "
            "GPU need real Numba CUDA, not its simulator",
            "unset NUMBA_ENABLE_CUDASIM to run on the GPU, or set "
            "JAX_PLATFORMS=cpu to debug on the CPU through the simulator"))
    elif (jx["backend"] == "gpu" and not nb["import_error"]
          and (nb["error"] or nb["available"] is False)):
        problems.append(Problem(
            "JAX sees a GPU but Numba's CUDA support does not "
            f"({nb['error'] or 'numba.cuda.is_available() is False'}), so "
            "numbax cannot compile or launch kernels",
            "install Numba's CUDA pieces for your CUDA major version: "
            "pip install 'numba-cuda[cu12]' (or [cu13]); "
            "python -c 'from numba import cuda; cuda.detect()' says more"))
    return problems


def _format_version(value: str | None) -> str:
    return value if value is not None else "not installed"


def format_info(info: dict[str, Any], problems: Sequence[Problem]) -> str:
    lines = []
    width = 2 + max([len("numba-cuda-mlir"),
                     *(len(k) for k in info["jax_plugins"])])

    def row(key: str, value: str) -> None:
        lines.append(f"{key:<{width}}{value}")

    row("numbax", f"{info['numbax']} ({info['numbax_path']})")
    ext = info["extension"]
    row("  extension", f"numbax._core loaded ({ext['path']})" if ext["loaded"]
        else f"NOT loaded: {ext['error']}")
    row("python", info["python"])
    for dist, version in info["versions"].items():
        row(dist, _format_version(version))
    for dist, version in info["jax_plugins"].items():
        row(dist, version)
    row("XLA FFI API", _ffi_text(info["xla_ffi_api"]))
    sim = info["simulator"]
    row("simulator", "on (NUMBA_ENABLE_CUDASIM=1): numbax ops run on JAX's CPU "
        "backend through Numba's CUDA simulator" if sim else "off")
    jx = info["jax"]
    if jx["error"]:
        row("JAX backend", f"error: {jx['error']}")
    else:
        row("JAX backend", f"{jx['backend']}: {', '.join(jx['devices'])}")
    row("GPUs (JAX)", "; ".join(jx["gpus"]) if jx["gpus"] else "none")
    nb = info["numba_cuda"]
    if nb["import_error"]:
        numba_gpus = f"numba.cuda does not import: {nb['import_error']}"
    elif sim:
        numba_gpus = "n/a (simulator on)"
    elif nb["error"]:
        numba_gpus = f"error: {nb['error']}"
    else:
        numba_gpus = "; ".join(nb["gpus"]) if nb["gpus"] else "none"
    row("GPUs (Numba)", numba_gpus)
    drv = info["cuda_driver"]
    if drv["loaded"]:
        row("CUDA driver", f"{drv['version'] or 'unknown version'}"
            + (f" ({drv['error']})" if drv["error"] else ""))
    else:
        row("CUDA driver", "not found (libcuda.so.1 does not load)")
    row("fast launch", info.get("fast_launch", "unknown"))
    row("NVTX", info.get("nvtx", "unknown"))
    row("numba-cuda-mlir",
        info.get("numba_cuda_mlir", {}).get("status", "unknown"))
    set_env = {k: v for k, v in info["env"].items() if v is not None}
    if set_env:
        row("environment", " ".join(f"{k}={v}" for k, v in set_env.items()))
    if not problems:
        row("problems", "no known incompatibility found")
    else:
        lines.append(f"problems found: {len(problems)}")
        for p in problems:
            lines.append(f"  - {p.what}")
            lines.append(f"    fix: {p.fix}")
    return "\n".join(lines)


def info_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog=f"{PROG} info",
        description="Versions, devices, simulator mode and known "
        "incompatibilities (each with its fix). Exit status 1 if one is found.")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = p.parse_args(argv)
    info = collect_info()
    problems = find_problems(info)
    if args.json:
        print(json.dumps(dict(info, problems=[asdict(x) for x in problems]),
                         indent=2, default=str))
    else:
        print(format_info(info, problems))
    return 1 if problems else 0


USAGE = f"""usage: {PROG} {{info,bench}} [options]

commands:
  info    versions, GPUs seen, simulator mode, known incompatibilities and fixes
  bench   the benchmark suite (needs a GPU; --cpu-smoke checks the paths
          on the CPU): progress bar, table, --plot PNG, --json PATH
          ({PROG} bench --help lists the options)

options:
  -h, --help  show this message and exit
  --version   print numbax's version and exit
"""


def main(argv: Sequence[str] | None = None, *, allow_reexec: bool | None = None) -> int:
    """Runs ``python -m numbax ARGV``; returns the exit status.

    ``allow_reexec`` (default: when ``argv`` comes from the command line) lets
    ``bench --cpu-smoke`` restart the process with the simulator switched on.
    """
    if allow_reexec is None:
        allow_reexec = argv is None
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "--version":
        print(f"numbax {__version__}")
        return 0
    if command == "info":
        return info_main(rest)
    if command == "bench":
        from .bench.run import main as bench_main
        return bench_main(rest, prog=f"{PROG} bench", allow_reexec=allow_reexec)
    print(f"{PROG}: error: unknown command {command!r}: use info or bench "
          f"(see {PROG} --help)", file=sys.stderr)
    return 2
