"""jax.vmap of ops whose aliased input is not batched (issue 24, items 4, 5).

The unbatched aliased input is given to every slice as a copy of its own,
of its own dtype: a bool kept bool (before: the kernel's batching promoted
it to int32 and XLA refused the alias), and every vmap_method of a callable
behaves as 'expand_dims' already did (before: a raw MLIR verifier dump).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax

pytestmark = pytest.mark.gpu

B, N = 3, 40


@cuda.jit
def flip_where(flags, x, out):
    # out aliases flags: out[i] = flags[i] xor (x[i] > 0), in place.
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = flags[i] != (x[i] > 0)


def expected(flags, xs):
    return np.stack([np.logical_xor(flags, x > 0) for x in xs])


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.float16,
                                   np.complex64])
def test_kernel_broadcast_aliased_input_keeps_its_dtype(dtype, rng):
    @cuda.jit
    def add_into(acc, x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = acc[i] + x[i]

    if dtype == np.bool_:
        kernel, spec_dtype = flip_where, np.bool_
    else:
        kernel, spec_dtype = add_into, dtype
    op = numbax.numba_cuda_kernel(
        kernel, jax.ShapeDtypeStruct((N,), spec_dtype), launch_dims=N,
        input_output_aliases={0: 0})
    if dtype == np.bool_:
        first = rng.integers(0, 2, N).astype(np.bool_)
        xs = rng.standard_normal((B, N)).astype(np.float32)
        want = expected(first, xs)
    else:
        first = rng.integers(0, 5, N).astype(dtype)
        xs = rng.integers(0, 5, (B, N)).astype(dtype)
        want = np.stack([first + x for x in xs])
    for f in (jax.vmap(op, in_axes=(None, 0)),
              jax.jit(jax.vmap(op, in_axes=(None, 0)))):
        got = np.asarray(f(first, xs))
        assert got.dtype == np.dtype(spec_dtype)
        np.testing.assert_array_equal(got, want)
    # The caller's array is untouched: each slice wrote a copy.
    assert np.asarray(first).dtype == np.dtype(spec_dtype)


def flip_launch(flags, x, out, stream):
    flip_where[1, 64, stream](flags, x, out)


@pytest.mark.parametrize("vmap_method", ["expand_dims", "broadcast_all",
                                         "legacy_vectorized", "sequential",
                                         "sequential_unrolled"])
def test_callable_unbatched_aliased_input_under_every_vmap_method(
        vmap_method, rng):
    op = numbax.numba_cuda_callable(
        flip_launch, jax.ShapeDtypeStruct((N,), np.bool_),
        vmap_method=vmap_method, input_output_aliases={0: 0})
    if vmap_method == "legacy_vectorized":
        # Its func sees the batch in one call: launch per row.
        def rows(flags, x, out, stream):
            for b in range(x.shape[0]):
                flip_where[1, 64, stream](flags[b], x[b], out[b])
        op = numbax.numba_cuda_callable(
            rows, jax.ShapeDtypeStruct((N,), np.bool_),
            vmap_method=vmap_method, input_output_aliases={0: 0})
    elif vmap_method in ("expand_dims", "broadcast_all"):
        def rows(flags, x, out, stream):
            if x.ndim == 1:
                flip_where[1, 64, stream](flags, x, out)
                return
            for b in range(x.shape[0]):
                flip_where[1, 64, stream](flags[b], x[b], out[b])
        op = numbax.numba_cuda_callable(
            rows, jax.ShapeDtypeStruct((N,), np.bool_),
            vmap_method=vmap_method, input_output_aliases={0: 0})
    first = rng.integers(0, 2, N).astype(np.bool_)
    xs = rng.standard_normal((B, N)).astype(np.float32)
    for f in (jax.vmap(op, in_axes=(None, 0)),
              jax.jit(jax.vmap(op, in_axes=(None, 0)))):
        got = np.asarray(f(first, xs))
        np.testing.assert_array_equal(got, expected(first, xs))
