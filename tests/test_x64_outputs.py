"""64-bit outputs with jax_enable_x64 off, for all three op kinds.

JAX's convention, which the reference follows (its own test_float64 and
test_different_dtypes): with x64 off, jnp.ones(n, jnp.float64) is float32,
with a warning. numbax does the same: an op declaring int64/float64/uint64/
complex128 outs returns their 32-bit types, its kernel is compiled for (and
func gets) the 32-bit arrays XLA really allocates, and a warning names the
op once. Read per call (x64 may be switched after the op is made).

History: numbax first returned real 64-bit arrays, which the next jitted op
read as 32-bit (a kernel writing 3e9 into an int64 output, then
jit(op(x) + 1), gave -1294967295); then it refused such outputs, which
broke the reference's own tests. Scratch buffers never reach JAX, so a
64-bit scratch buffer stays 64-bit (XLA keeps it as declared).
"""

import warnings

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


@cuda.jit
def twice_plus_one(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 2 + 1


@cuda.jit
def copy_and_twice(x, a, b):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] = x[i]
        b[i] = x[i] * 2 + 1


def make_computing(kind, outs):
    """An op of `kind` whose (last) output is x * 2 + 1 (the first a copy
    of x, with two outputs)."""
    n = len(outs) if isinstance(outs, (tuple, list)) else 1
    kernel = twice_plus_one if n == 1 else copy_and_twice
    if kind == "callable":
        def func(x, *rest):
            *outputs, stream = rest
            kernel[1, 32, stream](x, *outputs)
        return numbax.numba_cuda_callable(func, outs), "numba_cuda_callable("
    if kind == "kernel":
        # Its own name: numbax interns kernel ops made alike, and each test
        # needs an op that has not warned yet.
        name = f"x64_kernel_{next(_ops)}"
        return (numbax.numba_cuda_kernel(kernel, outs, launch_dims=N,
                                         name=name), "numba_cuda_kernel(")
    name = f"x64_custom_{next(_ops)}"
    op = numbax.XLACustomKernel(name)

    def generator(*, outs):
        return numbax.numba_cuda_kernel(kernel, outs, launch_dims=N)
    op.def_kernel(HERE, generator, backend="numba_cuda")
    return (lambda x: op(x, outs=outs)), f"XLACustomKernel('{name}')"


def fresh_input(dtype):
    """Random inputs of the 32-bit type JAX holds with x64 off (small and
    non-negative, so that x * 2 + 1 fits any of them)."""
    narrow = np.dtype(NARROW[dtype])
    values = np.random.default_rng().integers(0, 1000, N)
    return values.astype(narrow)


def x64_warnings(caught, label):
    return [w for w in caught if "jax_enable_x64 is off" in str(w.message)
            and label in str(w.message)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", WIDE, ids=lambda d: np.dtype(d).name)
def test_a_64_bit_output_with_x64_off_becomes_32_bit_with_one_warning(
        kind, dtype):
    # The reference's test_float64 pattern: outs declared 64-bit, x64 off.
    op, label = make_computing(kind, jax.ShapeDtypeStruct((N,), dtype))
    narrow = np.dtype(NARROW[dtype])
    x = fresh_input(dtype)
    want = x * narrow.type(2) + narrow.type(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in (op, jax.jit(op)):
            y = call(x)
            assert y.dtype == narrow, (y.dtype, narrow)
            np.testing.assert_array_equal(np.asarray(y), want)
        # Nothing written as 64-bit and read as 32-bit: the next op reads
        # what the kernel wrote.
        y = jax.jit(lambda v: op(v) + 1)(x)
        np.testing.assert_array_equal(np.asarray(y), want + narrow.type(1))
        assert jax.eval_shape(op, x).dtype == narrow
    found = x64_warnings(caught, label)
    assert len(found) == 1, [str(w.message) for w in caught]
    message = str(found[0].message)
    assert f"outs[0] {np.dtype(dtype).name} -> {narrow.name}" in message
    assert "jax.config.update('jax_enable_x64', True)" in message


@pytest.mark.parametrize("kind", KINDS)
def test_only_the_64_bit_outputs_narrow_and_the_warning_names_them(kind):
    # The reference's test_different_dtypes pattern: outputs of several
    # dtypes, one of them 64-bit.
    outs = (jax.ShapeDtypeStruct((N,), jnp.float32),
            jax.ShapeDtypeStruct((N,), jnp.int64))
    op, label = make_computing(kind, outs)
    x = np.random.default_rng().integers(0, 1000, N).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a, b = jax.jit(op)(x)
    assert (a.dtype, b.dtype) == (np.float32, np.int32)
    np.testing.assert_array_equal(np.asarray(a), x)
    np.testing.assert_array_equal(np.asarray(b), (x * 2 + 1).astype(np.int32))
    found = x64_warnings(caught, label)
    assert len(found) == 1 and "outs[1] int64 -> int32" in str(
        found[0].message) and "outs[0]" not in str(found[0].message)


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
    # Made with x64 on, called with it off: 32-bit.
    with x64_on():
        later, _ = make_computing(kind, jax.ShapeDtypeStruct((N,), jnp.int64))
    x = fresh_input(np.int64)
    with pytest.warns(UserWarning, match="jax_enable_x64 is off"):
        y = jax.jit(lambda v: later(v) + 1)(x)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(y), x * 2 + 2)


def test_a_narrowed_kernel_key_spells_its_outputs_and_resolves_from_them():
    # A program exported with x64 off and run where numbax resolves the key
    # again (here after clear_caches, as in a fresh process): the kernel is
    # built for the 32-bit outputs the key spells, not the declared ones.
    op, _ = make_computing("kernel", jax.ShapeDtypeStruct((N,), jnp.float64))
    x = fresh_input(np.float64)
    with pytest.warns(UserWarning, match="jax_enable_x64 is off"):
        exp = jax.export.export(
            jax.jit(op), disabled_checks=numbax.export_disabled_checks())(
            jax.ShapeDtypeStruct((N,), jnp.float32))
    text = exp.mlir_module()
    assert ";out=float32[4]" in text and "f64" not in text
    numbax.clear_caches()
    again = jax.export.deserialize(exp.serialize())
    y = again.call(x)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(y), x * 2 + 1)


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
