"""What docs/migration.md says numbax shares with the reference system, or
does differently, where no other test file checks it already.

The guide names the test behind each claim; these are the ones that had
none: the launch configuration numba_cuda_kernel derives from launch_dims,
the vmap_method values it accepts, the ImportError of numba_cuda_callable
without Numba CUDA, and that a numba_cuda_kernel call runs no Python on a
GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from shared_kernels import affine

pytestmark = pytest.mark.gpu


@cuda.jit
def launch_shape(x, out):
    """out = gridDim.xyz then blockDim.xyz, written by one thread."""
    if (cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0 and cuda.threadIdx.z == 0
            and cuda.blockIdx.x == 0 and cuda.blockIdx.y == 0
            and cuda.blockIdx.z == 0):
        out[0] = cuda.gridDim.x
        out[1] = cuda.gridDim.y
        out[2] = cuda.gridDim.z
        out[3] = cuda.blockDim.x
        out[4] = cuda.blockDim.y
        out[5] = cuda.blockDim.z


# launch_dims (and threads_per_block) -> (grid, block): 1-D blocks of
# min(threads_per_block, n); 2-D blocks of up to 16x16 and 3-D of up to
# 8x8x4, each axis at most its extent; the grid rounded up.
@pytest.mark.parametrize("launch_dims, tpb, grid, block", [
    (300, 128, (3, 1, 1), (128, 1, 1)),
    (5, 256, (1, 1, 1), (5, 1, 1)),
    ((20, 3), 256, (2, 1, 1), (16, 3, 1)),
    ((40, 17), 256, (3, 2, 1), (16, 16, 1)),
    ((9, 3, 5), 256, (2, 1, 2), (8, 3, 4)),
])
def test_launch_dims_give_the_documented_grid_and_block(launch_dims, tpb,
                                                        grid, block):
    op = numbax.numba_cuda_kernel(
        launch_shape, jax.ShapeDtypeStruct((6,), jnp.int32),
        launch_dims=launch_dims, threads_per_block=tpb)
    got = np.asarray(jax.jit(op)(jnp.zeros(1, jnp.float32)))
    assert tuple(got[:3]) == grid and tuple(got[3:]) == block


@pytest.mark.parametrize("method", [None, "expand_dims", "broadcast_all",
                                    "legacy_vectorized", "sequential"])
def test_kernel_accepts_these_vmap_methods(method):
    numbax.numba_cuda_kernel(launch_shape, jax.ShapeDtypeStruct((6,), jnp.int32),
                             launch_dims=1, vmap_method=method)


def test_kernel_refuses_sequential_unrolled():
    with pytest.raises(ValueError, match="vmap_method must be one of"):
        numbax.numba_cuda_kernel(
            launch_shape, jax.ShapeDtypeStruct((6,), jnp.int32),
            launch_dims=1, vmap_method="sequential_unrolled")


def test_callable_without_numba_cuda_is_import_error(monkeypatch):
    def no_numba():
        raise ImportError("numbax needs Numba with CUDA support (test)")

    monkeypatch.setattr(numbax.runtime.numba_bridge, "require_cuda", no_numba)
    with pytest.raises(ImportError, match="Numba with CUDA support"):
        numbax.numba_cuda_callable(lambda x, out, stream: None,
                                   jax.ShapeDtypeStruct((4,), jnp.float32))


def _kernel_chain(n=4096, length=10):
    op = numbax.numba_cuda_kernel(
        affine, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n)

    @jax.jit
    def chain(v):
        for _ in range(length):
            v = op(v)
        return v
    return chain, jnp.zeros(n, jnp.float32)


def test_kernel_calls_run_no_python(gpu_only):
    chain, x = _kernel_chain()
    jax.block_until_ready(chain(x))
    numbax.reset_bridge_counters()
    for _ in range(5):
        jax.block_until_ready(chain(x))
    assert numbax.bridge_counters()["calls"] == 0

