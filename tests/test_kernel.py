"""numba_cuda_kernel: launches from C++ on a GPU, through the simulator on CPU."""

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR, random_array
from shared_kernels import (affine, block_sums, matrix_add, mirror_sum,
                            reverse, stencil)

pytestmark = pytest.mark.gpu

F32 = jnp.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32,
                                   np.int64, np.float16, np.uint8])
def test_elementwise_dtypes(rng, dtype):
    n = 1000
    op = numbax.numba_cuda_kernel(
        affine, jax.ShapeDtypeStruct((n,), dtype), launch_dims=n)
    x = random_array(rng, (n,), dtype)
    if np.dtype(dtype) == np.uint8:
        x = (x % 100).astype(np.uint8)
    jax.config.update("jax_enable_x64", True)
    try:
        out = np.asarray(jax.jit(op)(jnp.asarray(x)))
    finally:
        jax.config.update("jax_enable_x64", False)
    expected = (2 * x.astype(np.float64) + 1).astype(dtype)
    np.testing.assert_allclose(out.astype(np.float64),
                               expected.astype(np.float64), rtol=1e-3)


def test_explicit_2d_grid(rng):
    shape = (37, 53)
    op = numbax.numba_cuda_kernel(
        matrix_add, jax.ShapeDtypeStruct(shape, F32),
        grid=(3, 4), block=(16, 16))
    a, b = (random_array(rng, shape, np.float32) for _ in range(2))
    np.testing.assert_allclose(jax.jit(op)(a, b), a + b, rtol=1e-6)


@cuda.jit
def volume_scale(x, out):
    i, j, k = cuda.grid(3)
    if i < x.shape[0] and j < x.shape[1] and k < x.shape[2]:
        out[i, j, k] = x[i, j, k] * (i + 1)


def test_explicit_3d_grid_and_launch_dims(rng):
    shape = (9, 10, 5)
    x = random_array(rng, shape, np.float32)
    expected = x * (np.arange(9)[:, None, None] + 1)
    op = numbax.numba_cuda_kernel(
        volume_scale, jax.ShapeDtypeStruct(shape, F32),
        grid=(2, 2, 2), block=(8, 8, 4))
    np.testing.assert_allclose(op(x), expected, rtol=1e-6)
    op3 = numbax.numba_cuda_kernel(
        volume_scale, jax.ShapeDtypeStruct(shape, F32), launch_dims=shape)
    np.testing.assert_allclose(jax.jit(op3)(x), expected, rtol=1e-6)


def test_dynamic_shared_memory_reduction(rng):
    n, threads = 1000, 128
    blocks = -(-n // threads)
    op = numbax.numba_cuda_kernel(
        block_sums, jax.ShapeDtypeStruct((blocks,), F32),
        grid=blocks, block=threads, shared_mem=threads * 4)
    x = random_array(rng, (n,), np.float32)
    padded = np.concatenate([x, np.zeros(blocks * threads - n, np.float32)])
    np.testing.assert_allclose(jax.jit(op)(x),
                               padded.reshape(blocks, threads).sum(1),
                               rtol=1e-4, atol=1e-4)


@cuda.jit
def many_in_two_out(a, b, c, d, e, total, prod):
    i = cuda.grid(1)
    if i < a.shape[0]:
        total[i] = a[i] + b[i] + c[i] + d[i] + e[i]
        prod[i] = a[i] * b[i] * c[i] * d[i] * e[i]


def test_many_inputs_multiple_outputs(rng):
    n = 257
    spec = jax.ShapeDtypeStruct((n,), F32)
    op = numbax.numba_cuda_kernel(many_in_two_out, (spec, spec), launch_dims=n)
    xs = [random_array(rng, (n,), np.float32) for _ in range(5)]
    total, prod = jax.jit(op)(*xs)
    np.testing.assert_allclose(total, sum(xs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(prod, np.prod(xs, axis=0), rtol=1e-4, atol=1e-6)


def test_jit_repeated_calls_fresh_data(rng):
    n = 512
    op = jax.jit(numbax.numba_cuda_kernel(
        affine, jax.ShapeDtypeStruct((n,), F32), launch_dims=n))
    for _ in range(5):
        x = random_array(rng, (n,), np.float32)
        np.testing.assert_allclose(op(x), 2 * x + 1, rtol=1e-6)


def test_chain_in_one_program(rng):
    # The simulator runs each thread in Python: 256 elements show the same.
    n = 256 if SIMULATOR else 4096
    op = numbax.numba_cuda_kernel(
        affine, jax.ShapeDtypeStruct((n,), F32), launch_dims=n)

    @jax.jit
    def chain(v):
        for _ in range(20):
            v = op(v)
        return v

    x = random_array(rng, (n,), np.float32) * 1e-3
    expected = x.astype(np.float64)
    for _ in range(20):
        expected = 2 * expected + 1
    np.testing.assert_allclose(chain(x), expected, rtol=1e-5)


def _stencil_ref(x, w):
    p = np.pad(x, 1)
    return w[0] * p[:-2] + w[1] * p[1:-1] + w[2] * p[2:]


@pytest.mark.parametrize("batch", [1, 4])
def test_vmap_launches_once_per_slice(rng, batch):
    n = 33
    op = numbax.numba_cuda_kernel(
        reverse, jax.ShapeDtypeStruct((n,), F32), launch_dims=n)
    x = random_array(rng, (batch, n), np.float32)
    np.testing.assert_array_equal(jax.vmap(op)(x), x[:, ::-1])
    np.testing.assert_array_equal(jax.jit(jax.vmap(op, in_axes=1))(x.T),
                                  x[:, ::-1])


def test_vmap_in_axes_none_and_size_one_broadcast(rng):
    n = 40
    op = numbax.numba_cuda_kernel(
        stencil, jax.ShapeDtypeStruct((n,), F32), launch_dims=n)
    xs = random_array(rng, (5, n), np.float32)
    w = random_array(rng, (3,), np.float32)
    expected = np.stack([_stencil_ref(x, w) for x in xs])
    out = jax.jit(jax.vmap(op, in_axes=(0, None)))(xs, w)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    # A batched weight of size 1 is reused for every slice.
    w1 = w[None]
    out = jax.jit(jax.vmap(op))(xs, np.broadcast_to(w1, (5, 3)))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_nested_vmap(rng):
    n = 8
    op = numbax.numba_cuda_kernel(
        reverse, jax.ShapeDtypeStruct((n,), F32), launch_dims=n)
    x = random_array(rng, (2, 3, n), np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(jax.vmap(op)))(x),
                                  x[..., ::-1])


def test_nested_vmap_sequential(rng):
    n = 8
    op = numbax.numba_cuda_kernel(
        reverse, jax.ShapeDtypeStruct((n,), F32), launch_dims=n,
        vmap_method="sequential")
    x = random_array(rng, (2, 3, n), np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(jax.vmap(op)))(x),
                                  x[..., ::-1])


def test_zero_extent_launches_nothing_and_zero_fills(rng):
    n = 16

    @cuda.jit
    def poison(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = 123.0

    op = numbax.numba_cuda_kernel(
        poison, jax.ShapeDtypeStruct((n,), F32), launch_dims=(n, 0))
    out = jax.jit(op)(random_array(rng, (n,), np.float32))
    np.testing.assert_array_equal(out, np.zeros(n, np.float32))


def test_zero_extent_keeps_an_aliased_output_and_zero_fills_the_rest(rng):
    # Before: an empty launch zero-filled every output, so an in-place
    # update whose launch size came out 0 wiped the aliased input's values.
    @cuda.jit
    def bump_and_copy(x, out, other):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] += 1
            other[i] = x[i]

    n = 16
    spec = jax.ShapeDtypeStruct((n,), F32)
    op = numbax.numba_cuda_kernel(bump_and_copy, (spec, spec), launch_dims=0,
                                  input_output_aliases={0: 0})
    x = random_array(rng, (n,), np.float32)
    kept, zeroed = jax.jit(op)(x)
    np.testing.assert_array_equal(kept, x)
    np.testing.assert_array_equal(zeroed, np.zeros(n, np.float32))
    xs = random_array(rng, (3, n), np.float32)
    kept, zeroed = jax.jit(jax.vmap(op))(xs)
    np.testing.assert_array_equal(kept, xs)
    np.testing.assert_array_equal(zeroed, np.zeros((3, n), np.float32))


def test_kernel_aliasing_in_place(rng):
    @cuda.jit
    def bump(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] += 1

    op = numbax.numba_cuda_kernel(
        bump, jax.ShapeDtypeStruct((64,), F32), launch_dims=64,
        input_output_aliases={0: 0})
    x = random_array(rng, (64,), np.float32)
    np.testing.assert_allclose(jax.jit(op)(x), x + 1, rtol=1e-6)


# -- wrap-time errors -----------------------------------------------------

SPEC = jax.ShapeDtypeStruct((4,), F32)


def test_not_a_dispatcher_is_type_error():
    with pytest.raises(TypeError, match="@cuda.jit"):
        numbax.numba_cuda_kernel(lambda x, o: None, SPEC, launch_dims=4)


@pytest.mark.parametrize("kwargs, match", [
    ({}, "needs a launch configuration"),
    ({"grid": 1, "block": 4, "launch_dims": 4}, "not both"),
    ({"grid": 1}, "go together"),
    ({"block": 4}, "go together"),
    ({"launch_dims": -1}, "negative"),
    ({"grid": (1, -2), "block": 4}, "negative"),
    ({"launch_dims": (1, 2, 3, 4)}, "1 to 3 axes"),
    ({"grid": (1, 1, 1, 1), "block": 1}, "1 to 3 axes"),
    ({"launch_dims": 4, "threads_per_block": 0}, "threads_per_block"),
    ({"grid": 1, "block": 4, "vmap_method": "sequential"}, "vmap_method"),
    ({"launch_dims": 4, "shared_mem": -1}, "shared_mem"),
    # 'expand_dims' is accepted; a garbage string is not.
    ({"launch_dims": 4, "vmap_method": "expand_dimz"}, "vmap_method"),
])
def test_wrap_time_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        numbax.numba_cuda_kernel(affine, SPEC, **kwargs)


def test_zero_d_input_for_an_array_parameter_says_traced_scalar(gpu_only):
    # A 0-d array is a traced scalar: affine reads an
    # array there, so Numba cannot compile it, and the message says why.
    op = numbax.numba_cuda_kernel(affine, SPEC, launch_dims=4)
    with pytest.raises(Exception, match="traced scalars.*1-element array"):
        op(jnp.float32(1.0))


# -- cooperative launches ------------------------------------------------------

def test_grid_sync_kernel_launches_cooperatively(gpu_only, rng):
    n = 4096
    spec = jax.ShapeDtypeStruct((n,), F32)
    op = numbax.numba_cuda_kernel(mirror_sum, (spec, spec), launch_dims=n)
    for _ in range(3):
        x = random_array(rng, (n,), np.float32)
        doubled, out = jax.jit(op)(x)
        np.testing.assert_allclose(doubled, 2 * x, rtol=1e-6)
        np.testing.assert_allclose(out, 2 * x + 2 * x[::-1], rtol=1e-6)


def test_grid_sync_over_the_cooperative_limit_is_refused(gpu_only, rng):
    blocks = 1_000_000  # far more blocks than can be resident at once
    spec = jax.ShapeDtypeStruct((blocks * 32,), F32)
    op = numbax.numba_cuda_kernel(mirror_sum, (spec, spec), grid=blocks,
                                  block=32)
    x = np.zeros(blocks * 32, np.float32)
    with pytest.raises(Exception, match="cooperatively.*at most"):
        jax.block_until_ready(jax.jit(op)(x))
