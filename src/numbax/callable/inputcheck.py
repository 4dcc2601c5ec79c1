"""NUMBAX_CHECK_INPUTS=1: find a func that writes one of its inputs.

XLA's input buffers are immutable values: the caller's jax.Array and every
other op in the program that reads the same value share them. In the
simulator numbax hands inputs out read-only, so a write raises at once; on a
GPU a device array cannot be made read-only, so this mode copies each
(non-aliased) input to the host before func runs and compares it after,
naming the input that changed. It synchronises the stream twice per call:
a debugging aid, off by default, and not applied to capture=True ops (their
func runs while the stream is being recorded, where copies cannot run).
"""

from __future__ import annotations

import functools

import numpy as np

from ..runtime import env

ENV_VAR = "NUMBAX_CHECK_INPUTS"


def enabled() -> bool:
    return env.flag(ENV_VAR, False)


def _address(array) -> int | None:
    try:  # a Numba device array
        return int(array.device_ctypes_pointer.value or 0)
    except AttributeError:
        pass
    try:  # the simulator's array
        return int(array._ary.ctypes.data)
    except AttributeError:
        return None


def _snapshot(array, stream) -> np.ndarray:
    host = array.copy_to_host(stream=stream)
    stream.synchronize()
    return np.ascontiguousarray(host).view(np.uint8).copy()


def checked(func, num_results: int, op: str):
    """`func` wrapped to raise ValueError if it changes an input's bytes.

    The wrapper has func's module and qualified name, so the op's key (and
    a program exported with it) is the same with the check on or off.
    """
    @functools.wraps(func)
    def check_inputs(*args):
        *arrays, stream = args
        num_inputs = len(arrays) - num_results  # outputs, scratch follow
        outputs = {_address(a) for a in arrays[num_inputs:]}
        before = []
        for x in arrays[:num_inputs]:
            aliased = _address(x) in outputs  # func may write it
            before.append(None if aliased else _snapshot(x, stream))
        result = func(*args)
        for i, (x, old) in enumerate(zip(arrays[:num_inputs], before)):
            if old is not None and not np.array_equal(
                    old, _snapshot(x, stream)):
                raise ValueError(
                    f"{op}: func modified input {i} (found by "
                    f"{ENV_VAR}=1). Inputs are immutable JAX values that "
                    "the caller and other ops may still read: write into "
                    "an output instead, or alias the input to an output "
                    "with input_output_aliases to update it in place")
        return result
    return check_inputs
