"""Test modes.

CI has no GPU: it runs every test with NUMBA_ENABLE_CUDASIM=1, so numbax ops
run on JAX's CPU backend through Numba's CUDA simulator. On a GPU machine,
scripts/gpu_check.sh runs the tests marked `gpu` without the simulator, on
real CUDA. Tests that only make sense in one mode say so with the
`simulator_only` or `gpu_only` fixtures.
"""

import os

import numpy as np
import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

if not SIMULATOR:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@pytest.fixture
def simulator_only():
    if not SIMULATOR:
        pytest.skip("simulator mode only (NUMBA_ENABLE_CUDASIM=1)")


@pytest.fixture
def gpu_only():
    if SIMULATOR:
        pytest.skip("needs a real GPU")


@pytest.fixture
def rng(request):
    # Fresh data per test, reproducible from the test's name.
    seed = abs(hash(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)


def random_array(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -100), min(info.max, 100)
        return rng.integers(lo, hi, size=shape, dtype=dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
