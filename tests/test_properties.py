"""Property tests: random shapes, dtypes, output counts and aliasing against a
jnp reference (hypothesis; on the CPU simulator in CI, on CUDA with -m gpu).

Examples are derandomised (the same ones every run, so CI is reproducible)
and bounded: NUMBAX_PROPERTY_EXAMPLES (default 100) per test.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import cuda

import numbax

pytestmark = pytest.mark.gpu

EXAMPLES = int(os.environ.get("NUMBAX_PROPERTY_EXAMPLES", "100"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.data_too_large])

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int16,
          np.uint8, np.int8, np.complex64, np.bool_]
TOLERANCE = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-6,
             np.dtype(np.complex64): 1e-6, np.dtype(np.float64): 1e-12}


@pytest.fixture(autouse=True)
def x64():
    # float64/int64 buffers stay 64-bit only with x64 on.
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


@cuda.jit
def affine_flat(x, out, scale, shift):
    start = cuda.grid(1)
    for i in range(start, out.shape[0], cuda.gridsize(1)):
        out[i] = x[i] * scale + shift


def values(draw, shape, dtype):
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    if dtype == np.bool_:
        data = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    elif dtype.kind in "iu":
        data = draw(st.lists(st.integers(0, 20), min_size=size, max_size=size))
    else:
        data = draw(st.lists(st.integers(-50, 50), min_size=size,
                             max_size=size))
        data = [v / 4 for v in data]  # exact in every float width
    return np.array(data, dtype=dtype).reshape(shape)


@st.composite
def problems(draw):
    """Inputs, outputs (each an affine map of one input) and aliases."""
    n_in = draw(st.integers(1, 3))
    shapes = [tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
              for _ in range(n_in)]
    dtypes = [np.dtype(draw(st.sampled_from(DTYPES))) for _ in range(n_in)]
    inputs = [values(draw, s, d) for s, d in zip(shapes, dtypes)]
    n_out = draw(st.integers(1, 3))
    outputs = []
    for _ in range(n_out):
        src = draw(st.integers(0, n_in - 1))
        if dtypes[src] == np.bool_:
            scale, shift = 1, 0  # a copy
        else:
            scale, shift = draw(st.integers(-3, 3)), draw(st.integers(0, 5))
            if dtypes[src].kind == "u":
                scale = abs(scale)
        outputs.append((src, scale, shift))
    # Alias each input to at most one output computed from it (the output
    # is then written in place over its own source).
    aliases = {}
    for k, (src, _, _) in enumerate(outputs):
        if src not in aliases and draw(st.booleans()):
            aliases[src] = k
    return inputs, outputs, aliases


def launch(x, out, scale, shift, stream):
    n = out.size
    flat_x, flat_out = x.reshape(n), out.reshape(n)
    affine_flat[1, min(n, 32), stream](flat_x, flat_out, scale, shift)


@SETTINGS
@given(problems())
def test_callable_matches_jnp(problem):
    inputs, outputs, aliases = problem
    n_in = len(inputs)
    aliased_outputs = set(aliases.values())

    def func(*args):
        *arrays, stream = args
        ins, outs = arrays[:n_in], arrays[n_in:]
        # Outputs written over an input's buffer go last, so every other
        # output still reads that input's original values.
        order = sorted(range(len(outputs)), key=lambda k: k in aliased_outputs)
        for k in order:
            src, scale, shift = outputs[k]
            launch(ins[src], outs[k], scale, shift, stream)

    specs = [jax.ShapeDtypeStruct(inputs[src].shape, inputs[src].dtype)
             for src, _, _ in outputs]
    op = numbax.numba_cuda_callable(func, specs,
                                    input_output_aliases=aliases or None)
    results = jax.jit(op)(*[jnp.asarray(a) for a in inputs])
    assert len(results) == len(outputs)
    for (src, scale, shift), got in zip(outputs, results):
        x = jnp.asarray(inputs[src])
        want = np.asarray((x * scale + shift).astype(x.dtype))
        got = np.asarray(got)
        assert got.shape == want.shape and got.dtype == want.dtype
        tol = TOLERANCE.get(got.dtype)
        if tol is None:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@cuda.jit
def affine_1d(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 3 + 1


@cuda.jit
def affine_2d(x, out):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = x[i, j] * 3 + 1


@cuda.jit
def affine_3d(x, out):
    i, j, k = cuda.grid(3)
    if i < out.shape[0] and j < out.shape[1] and k < out.shape[2]:
        out[i, j, k] = x[i, j, k] * 3 + 1


AFFINE = {1: affine_1d, 2: affine_2d, 3: affine_3d}
KERNEL_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int16,
                 np.uint8]


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
       dtype=st.sampled_from(KERNEL_DTYPES), data=st.data())
def test_kernel_matches_jnp(shape, dtype, data):
    x = values(data.draw, shape, dtype)
    op = numbax.numba_cuda_kernel(AFFINE[len(shape)],
                                  jax.ShapeDtypeStruct(shape, dtype),
                                  launch_dims=shape)
    got = np.asarray(jax.jit(op)(jnp.asarray(x)))
    want = np.asarray(jnp.asarray(x) * 3 + 1)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)
