"""64-bit outputs need jax_enable_x64, for all three op kinds.

Before: with x64 off (JAX's default) numba_cuda_kernel, numba_cuda_callable
and XLACustomKernel accepted int64/float64/uint64/complex128 in outs and
returned real 64-bit arrays, which the next jitted op then read as 32-bit:
a kernel writing 3e9 into an int64 output, then jit(op(x) + 1), gave
-1294967295. jax.pure_callback refuses such outputs; numbax now does too,
when the op is called or traced (x64 may be switched after the op is made),
naming the op, the output and the fix. Scratch buffers are never returned to
JAX, so a 64-bit scratch buffer stays allowed (XLA keeps it 64-bit).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR, x64_enabled

pytestmark = pytest.mark.gpu

HERE = "cpu" if SIMULATOR else "gpu"
N = 4
BIG = 3_000_000_000  # beyond int32
WIDE = [np.int64, np.float64, np.uint64, np.complex128]
NARROW = {np.int64: "int32", np.float64: "float32", np.uint64: "uint32",
          np.complex128: "complex64"}


def x64_on():
    """jax's context manager that turns x64 on for a block (its name moved
    between the JAX versions numbax supports)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # jax < 0.9
    return enable_x64()


@pytest.fixture(autouse=True)
def x64_off():
    with x64_enabled(False):
        yield


@cuda.jit
def fill_big(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = BIG


@cuda.jit
def fill_two(x, a, b):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] = x[i]
        b[i] = BIG


def _launch(x, out, stream):
    fill_big[1, 32, stream](x, out)


_ops = iter(range(10**6))


def make(kind, outs):
    """An op of `kind` whose outputs are `outs` (filled with BIG)."""
    if kind == "callable":
        n = len(outs) if isinstance(outs, (tuple, list)) else 1
        func = _launch if n == 1 else (
            lambda x, a, b, stream: fill_two[1, 32, stream](x, a, b))
        return numbax.numba_cuda_callable(func, outs), "numba_cuda_callable"
    if kind == "kernel":
        n = len(outs) if isinstance(outs, (tuple, list)) else 1
        return (numbax.numba_cuda_kernel(fill_big if n == 1 else fill_two,
                                         outs, launch_dims=N),
                "numba_cuda_kernel(")
    name = f"x64_custom_{next(_ops)}"
    op = numbax.XLACustomKernel(name)

    def generator(*, outs):
        n = len(outs) if isinstance(outs, (tuple, list)) else 1
        return numbax.numba_cuda_kernel(fill_big if n == 1 else fill_two,
                                        outs, launch_dims=N)
    op.def_kernel(HERE, generator, backend="numba_cuda")
    return (lambda x: op(x, outs=outs)), f"XLACustomKernel('{name}')"


KINDS = ["callable", "kernel", "custom"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", WIDE, ids=lambda d: np.dtype(d).name)
def test_a_64_bit_output_with_x64_off_is_refused_naming_op_and_fix(
        kind, dtype):
    op, label = make(kind, jax.ShapeDtypeStruct((N,), dtype))
    x = jnp.ones(N, jnp.float32)
    name = np.dtype(dtype).name
    for call in (op, jax.jit(op), jax.jit(lambda v: op(v) + 1),
                 lambda v: jax.eval_shape(op, v)):
        with pytest.raises(ValueError) as info:
            call(x)
        message = str(info.value)
        assert label in message
        assert f"outs[0] has dtype {name}" in message
        assert "jax_enable_x64 is off" in message
        assert "jax.config.update('jax_enable_x64', True)" in message
        assert NARROW[dtype] in message


@pytest.mark.parametrize("kind", KINDS)
def test_the_output_index_is_named(kind):
    outs = (jax.ShapeDtypeStruct((N,), jnp.float32),
            jax.ShapeDtypeStruct((N,), jnp.int64))
    op, label = make(kind, outs)
    with pytest.raises(ValueError, match=r"outs\[1\] has dtype int64"):
        jax.jit(op)(jnp.ones(N, jnp.float32))


@pytest.mark.parametrize("kind", KINDS)
def test_x64_is_read_at_call_time_not_when_the_op_is_made(kind):
    # Made with x64 off, called with it on: real int64 all the way through.
    op, _ = make(kind, jax.ShapeDtypeStruct((N,), jnp.int64))
    x = np.ones(N, np.float32)
    with x64_on():
        y = jax.jit(lambda v: op(v) + 1)(x)
        assert y.dtype == np.int64
        np.testing.assert_array_equal(np.asarray(y), np.full(N, BIG + 1))
        assert op(x).dtype == np.int64
    # Made with x64 on, called with it off: refused.
    with x64_on():
        later, _ = make(kind, jax.ShapeDtypeStruct((N,), jnp.int64))
    with pytest.raises(ValueError, match="jax_enable_x64 is off"):
        jax.jit(lambda v: later(v) + 1)(x)


def test_32_bit_outputs_are_unaffected():
    op, _ = make("kernel", jax.ShapeDtypeStruct((N,), jnp.uint32))
    y = jax.jit(lambda v: op(v) + 1)(jnp.ones(N, jnp.float32))
    np.testing.assert_array_equal(np.asarray(y), np.full(N, BIG + 1, np.uint32))


@cuda.jit
def through_f64(x, s, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        s[i] = 3_000_000_000.5  # needs float64: float32 rounds the .5 away
        s[i] += x[i]
        out[i] = s[i] - 3_000_000_000.0


def test_a_64_bit_scratch_buffer_stays_allowed_and_64_bit():
    # Scratch never reaches JAX: XLA allocates it as declared (the custom
    # call's result is f64), and func gets a float64 buffer.
    seen = []

    def func(x, out, s, stream):
        seen.append(np.dtype(s.dtype))
        through_f64[1, 32, stream](x, s, out)

    op = numbax.numba_cuda_callable(
        func, jax.ShapeDtypeStruct((N,), jnp.float32),
        scratch=jax.ShapeDtypeStruct((N,), jnp.float64))
    x = jnp.arange(N, dtype=jnp.float32)
    y = jax.jit(lambda v: op(v) + 1)(x)
    np.testing.assert_array_equal(np.asarray(y), np.arange(N) + 1.5)
    assert seen and all(d == np.float64 for d in seen)
    assert "tensor<4xf64>" in jax.jit(op).lower(x).as_text()
