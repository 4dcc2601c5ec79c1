"""Which run the suite does here: the GPU suite, the CPU rows, the
simulator smoke run, or none.

The GPU suite times GPU paths. On a machine without a GPU it means nothing
(the numbax GPU rows cannot run, or would run through Numba's CUDA simulator
at a Python thread per CUDA thread for hours), so there the suite runs its
CPU rows instead (:mod:`numbax.bench.cpu`: ``numba_kernel`` against a C++
FFI CPU handler). The decision is made once, before anything is built, from
what JAX sees, whether the simulator is on and whether ``--cpu`` asked for
the CPU rows. It depends on no row of the suite: rows added later get the
same treatment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Exit status of a run refused because JAX could not start a backend at all
#: (and the simulator is off). Distinct from 1 (a row failed) and 2 (bad
#: command line), so scripts can tell "nothing to measure here" from a
#: failure. (A machine where JAX runs on the CPU runs the CPU rows.)
EXIT_NO_GPU = 3
#: Exit status of a run refused because the environment contradicts itself.
EXIT_BAD_ENVIRONMENT = 2

#: Why simulator timings carry no ratios; ends the table of a smoke run.
SIMULATOR_NOTE = ("ratios: none. Simulator timings (Numba's CUDA simulator on "
                  "the CPU, a Python thread per CUDA thread) show that every "
                  "path runs, not how fast; run on a GPU for performance figures.")


@dataclass(frozen=True)
class Mode:
    """The run to do."""
    smoke: bool             # the tiny simulator configuration, no ratios
    header: str | None      # what the run prints first about its mode
    cpu: bool = False       # the CPU rows (numbax.bench.cpu), not the GPU suite


class Refused(Exception):
    """No run: ``str(exc)`` says why and what to run instead; ``status`` is
    the exit status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Backend:
    """What JAX runs on here."""
    platform: str | None    # "gpu", "cpu", ...; None when JAX could not start
    error: str | None = None


def jax_backend() -> Backend:
    """The platform of JAX's default device, never raising (a JAX_PLATFORMS
    naming a backend that cannot start is reported, not raised)."""
    try:
        import jax
        return Backend(jax.devices()[0].platform)
    except Exception as exc:  # noqa: BLE001 - reported in the message
        text = str(exc).strip()
        name = type(exc).__name__
        return Backend(None, f"{name}: {text.splitlines()[0]}" if text else name)


def _cuda_driver_loads() -> bool:
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _why_no_gpu(backend: Backend) -> str:
    platforms = os.environ.get("JAX_PLATFORMS")
    if backend.error is not None:
        with_env = f" with JAX_PLATFORMS={platforms}" if platforms else ""
        return f"JAX could not start a backend{with_env}: {backend.error}"
    if platforms and "cuda" not in platforms and "gpu" not in platforms:
        return (f"JAX_PLATFORMS={platforms} keeps JAX on the {backend.platform}; "
                "unset it on a GPU machine")
    if _cuda_driver_loads():
        return ("a CUDA driver is installed but this jax has no GPU support: "
                "pip install -U 'jax[cuda12]' (or 'jax[cuda13]')")
    return f"JAX runs on the {backend.platform}"


def select(*, cpu_smoke: bool, simulator: bool, backend: Backend,
           prog: str, cpu: bool = False) -> Mode:
    """The mode of this run, or :class:`Refused`.

    Args:
      cpu_smoke: ``--cpu-smoke`` was given (the simulator is on by then).
      cpu: ``--cpu`` was given: the CPU rows, whatever JAX sees (JAX was
        put on the CPU by then).
      simulator: Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1).
      backend: what JAX runs on (:func:`jax_backend`).
      prog: the command, for the messages (``python -m numbax bench``).
    """
    on_gpu = backend.platform == "gpu"
    if cpu and not simulator and backend.platform == "cpu":
        return Mode(smoke=False, cpu=True, header=(
            "cpu run (--cpu): numbax.numba_kernel against a C++ XLA FFI CPU "
            "handler and the other ways to run an @njit kernel from JAX"))
    if simulator and backend.error is not None:
        # The smoke run needs JAX's CPU backend: without one it would start
        # and end in JAX's traceback at the first array.
        platforms = os.environ.get("JAX_PLATFORMS")
        with_env = f" with JAX_PLATFORMS={platforms}" if platforms else ""
        raise Refused(
            f"{prog}: error: JAX could not start a backend{with_env} "
            f"({backend.error}), and the simulator run needs JAX's CPU "
            f"backend: set JAX_PLATFORMS=cpu (with NUMBA_ENABLE_CUDASIM=1), "
            "or unset NUMBA_ENABLE_CUDASIM and JAX_PLATFORMS on a GPU machine",
            EXIT_BAD_ENVIRONMENT)
    if simulator and not on_gpu:
        how = ("--cpu-smoke" if cpu_smoke else
               "chosen automatically: NUMBA_ENABLE_CUDASIM=1 and JAX sees no GPU")
        return Mode(smoke=True, header=(
            f"cpu smoke run ({how}): every path runs end to end through Numba's "
            "CUDA simulator with tiny sizes; its timings are not performance "
            "figures, so no ratios are computed."))
    if simulator:
        raise Refused(
            f"{prog}: error: NUMBA_ENABLE_CUDASIM=1 while JAX runs on the GPU, "
            "where numbax ops need real Numba CUDA, not its simulator.\n"
            f"Unset NUMBA_ENABLE_CUDASIM to benchmark the GPU, or run "
            f"`{prog} --cpu-smoke` to check every path on the CPU.",
            EXIT_BAD_ENVIRONMENT)
    if backend.platform == "cpu":
        return Mode(smoke=False, cpu=True, header=(
            f"cpu run: JAX sees no GPU here ({_why_no_gpu(backend)}), so the "
            "suite times its CPU rows: numbax.numba_kernel against a C++ XLA "
            "FFI CPU handler and the other ways to run an @njit kernel from "
            f"JAX (`{prog} --cpu-smoke` checks the GPU paths through Numba's "
            "CUDA simulator instead)."))
    if not on_gpu:
        raise Refused(
            f"{prog}: the suite times numbax's GPU paths against a native CUDA "
            f"handler, and its CPU rows on JAX's CPU backend; JAX offers "
            f"neither here ({_why_no_gpu(backend)}).\n"
            f"Set JAX_PLATFORMS=cpu for the CPU rows, or run `{prog} "
            "--cpu-smoke` to check every GPU path on the CPU through Numba's "
            "CUDA simulator.",
            EXIT_NO_GPU)
    return Mode(smoke=False, header=None)
