"""Ops that record which GPU ran them, for the multi-GPU checks.

Used by tests/test_multigpu.py and by each process of
tests/test_multiprocess.py (tests/multiprocess_child.py imports this module
only once jax.distributed is up, since it imports Numba). Every op writes
TAG + the CUDA id of the device it ran on into an int32 output, so a test
can check that each shard ran on the GPU XLA put it on.
"""

import os

import jax
import jax.numpy as jnp
from numba import cuda

import numbax
from shared_kernels import affine as affine_kernel

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
TAG = 1000


@cuda.jit
def fill_kernel(out, value):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = value


@cuda.jit
def square_tag_kernel(x, tag_in, out, tag_out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * x[i] - 3
    if i < tag_out.shape[0]:
        tag_out[i] = tag_in[i]


def blocks(n, threads=256):
    return max(1, (n + threads - 1) // threads)


def current_device_id():
    """The CUDA device of the context numbax made current (-1: simulator)."""
    return -1 if SIMULATOR else int(cuda.get_current_device().id)


def hardware_id(device):
    """The CUDA ordinal of a JAX device (-1: simulator)."""
    if SIMULATOR:
        return -1
    hw = getattr(device, "local_hardware_id", None)
    return int(device.id if hw is None else hw)


def affine_tagged(x, y, dev, stream):
    """y = 2x + 1, and dev[:] = TAG + the id of the device this call runs on."""
    affine_kernel[blocks(x.shape[0]), 256, stream](x, y)
    fill_kernel[blocks(dev.shape[0]), 256, stream](dev, TAG + current_device_id())


def tagged_ops(n):
    """A plain callable, a capture=True one and a kernel, chained, each
    tagging its device: (x, devtag) -> ((y1, y2, y3), (d1, d2, d3)) with
    y1 = 2x + 1, y2 = 2 y1 + 1, y3 = y2^2 - 3."""
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    tag = jax.ShapeDtypeStruct((1,), jnp.int32)
    plain = numbax.numba_cuda_callable(affine_tagged, (spec, tag))
    captured = numbax.numba_cuda_callable(affine_tagged, (spec, tag),
                                          capture=True)
    kernel = numbax.numba_cuda_kernel(square_tag_kernel, (spec, tag),
                                      launch_dims=n)

    def chain(x, devtag):
        y1, d1 = plain(x)
        y2, d2 = captured(y1)
        y3, d3 = kernel(y2, devtag)
        return (y1, y2, y3), (d1, d2, d3)
    return chain
