"""Shapes from the inputs, and scalars by value.

``outs=`` (kernels, callables, XLACustomKernel), ``launch_dims=``
(kernels) and ``scratch=`` (callables) may be functions of the call's
arguments, evaluated when a call is traced, once per signature: one op
object serves every shape under jit, vmap (nested too), export and capture.

A Python or NumPy scalar given to a ``numba_cuda_kernel`` is passed
by value into the kernel's parameter at that position, typed as Numba
types it (or converted to the explicit signature's type); a callable's
func gets the Python value. Scalars are static: part of the key, never
batched.

Every test runs on the CPU simulator; those marked ``gpu`` run on a GPU too
(scripts/gpu_check.sh). Outputs are poisoned (aliased to a NaN-filled input)
wherever a kernel must write every element, so a launch that skipped some
cannot pass.
"""

import json
import os
import subprocess
import sys
import types as pytypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from numba import cuda
from numba import types as nt

import numbax
from numbax.trace import scalar_args
from numbax.compilers import signatures

import shapes_scalars_ops

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = jnp.float32


@cuda.jit
def scale_into(x, alpha, out):
    """out[i] = alpha * x[i]."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = alpha * x[i]


@cuda.jit
def scale_rows(x, alpha, out):
    """2-D: out[r, c] = alpha * x[r, c]."""
    r, c = cuda.grid(2)
    if r < x.shape[0] and c < x.shape[1]:
        out[r, c] = alpha * x[r, c]


def like(x, *rest):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def like_f64(x, *rest):
    return jax.ShapeDtypeStruct(x.shape, jnp.float64)


def nan_like(shape, dtype=np.float32):
    return jnp.full(shape, np.nan, dtype)


@pytest.fixture
def x64():
    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


# -- shapes from the inputs -----------------------------------------------------

@pytest.mark.gpu
def test_one_kernel_op_three_shapes_in_one_program(rng):
    calls = []

    def outs(x, alpha, poison):
        calls.append((x.shape, alpha))
        return jax.ShapeDtypeStruct(x.shape, x.dtype)

    op = numbax.numba_cuda_kernel(
        lambda_free_kernel(), outs=outs,
        launch_dims=lambda x, alpha, poison: x.shape[0],
        input_output_aliases={1: 0})

    @jax.jit
    def program(a, b, c):
        return (op(a, 2.0, nan_like(a.shape)), op(b, 2.0, nan_like(b.shape)),
                op(c, 2.0, nan_like(c.shape)))

    xs = [rng.standard_normal(n).astype(np.float32) for n in (3, 64, 1000)]
    got = program(*xs)
    for g, x in zip(got, xs):
        assert g.shape == x.shape
        np.testing.assert_allclose(np.asarray(g), 2.0 * x, rtol=1e-6)
    # Evaluated at trace time, once per signature.
    assert sorted(s for s, _ in calls) == [(3,), (64,), (1000,)]
    program(*xs)
    op(xs[0], 2.0, nan_like((3,)))  # eager: the same signature again
    assert len(calls) == 3


def lambda_free_kernel():
    """kernel(x, alpha, poison, out): out (aliased to poison) = alpha * x."""
    return _scale_poisoned


@cuda.jit
def _scale_poisoned(x, alpha, poison, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = alpha * x[i]


@pytest.mark.gpu
def test_kernel_op_with_2d_launch_dims_from_the_input(rng):
    op = numbax.numba_cuda_kernel(scale_rows, outs=like,
                                  launch_dims=lambda x, a: x.shape)
    for shape in ((3, 5), (17, 40), (64, 2)):
        x = rng.standard_normal(shape).astype(np.float32)
        # Scalars are static: jit takes them as static arguments.
        got = jax.jit(op, static_argnums=1)(x, 3.0)
        np.testing.assert_allclose(np.asarray(got), 3.0 * x, rtol=1e-6)


@pytest.mark.gpu
def test_shape_functions_under_vmap_and_nested_vmap(rng):
    op = shapes_scalars_ops.scale_add_op
    x = rng.standard_normal((4, 3, 7)).astype(np.float32)
    got = jax.vmap(jax.vmap(lambda r: op(r, 2.0, 1.0)))(x)
    np.testing.assert_allclose(np.asarray(got), 2 * x.astype(np.float64) + 1,
                               rtol=1e-6)
    got = jax.jit(jax.vmap(lambda r: op(r, np.float32(0.5), 0)))(x[0])
    np.testing.assert_allclose(np.asarray(got), 0.5 * x[0], rtol=1e-6)
    # Another shape through the same op object, unbatched.
    np.testing.assert_allclose(np.asarray(op(x[0, 0, :5], 1.0, 0.0)),
                               x[0, 0, :5], rtol=1e-6)


@pytest.mark.gpu
def test_callable_outs_and_scratch_from_the_inputs(rng):
    op = shapes_scalars_ops.two_pass_op
    for n in (1, 31, 200):
        x = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(
            np.asarray(jax.jit(op, static_argnums=1)(x, 3.0)), 3.0 * x + 1,
            rtol=1e-6)


@pytest.mark.gpu
def test_captured_callable_with_shape_functions_and_a_scalar(rng):
    op = numbax.numba_cuda_callable(
        shapes_scalars_ops.two_pass_launch, outs=like, scratch=like,
        capture=True)
    for n in (8, 100):
        x = rng.standard_normal(n).astype(np.float32)
        for _ in range(2):  # the second call replays
            np.testing.assert_allclose(
                np.asarray(jax.jit(lambda x: op(x, 0.5))(x)), 0.5 * x + 1,
                rtol=1e-6)


@pytest.mark.gpu
def test_custom_kernel_outs_from_the_inputs(rng):
    ck = numbax.XLACustomKernel("numbax_test_scale_from_inputs")

    @ck.def_numba_cuda_kernel
    def _(*, alpha, outs):
        op = numbax.numba_cuda_kernel(scale_into, outs,
                                      launch_dims=outs.shape[0])
        return lambda x: op(x, alpha)

    seen = []

    def outs(x, *, alpha):
        seen.append((x.shape, alpha))
        return jax.ShapeDtypeStruct(x.shape, x.dtype)

    for n in (4, 40):
        x = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(np.asarray(ck(x, outs=outs, alpha=2.0)),
                                   2 * x, rtol=1e-6)
    assert seen == [((4,), 2.0), ((40,), 2.0)]


@pytest.mark.gpu
def test_custom_kernel_outs_function_runs_once_per_signature(rng):
    # As for kernels and callables: eager calls, retraces and vmap of the
    # same shapes, dtypes and static arguments call outs once.
    ck = numbax.XLACustomKernel("numbax_test_outs_once")

    @ck.def_numba_cuda_kernel
    def _(*, alpha, outs):
        op = numbax.numba_cuda_kernel(scale_into, outs,
                                      launch_dims=outs.shape[0])
        return lambda x: op(x, alpha)

    seen = []

    def outs(x, *, alpha):
        seen.append((x.shape, np.dtype(x.dtype).name, alpha))
        return jax.ShapeDtypeStruct(x.shape, x.dtype)

    x = rng.standard_normal(8).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(ck(x, outs=outs, alpha=2.0)),
                                   2 * x, rtol=1e-6)
        np.testing.assert_allclose(
            np.asarray(jax.jit(lambda v: ck(v, outs=outs, alpha=2.0))(x)),
            2 * x, rtol=1e-6)
    xs = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(jax.vmap(lambda v: ck(v, outs=outs, alpha=2.0))(xs)),
        2 * xs, rtol=1e-6)
    assert seen == [((8,), "float32", 2.0)]
    # A new signature (shape, static value or its type) calls it again.
    ck(x[:4], outs=outs, alpha=2.0)
    ck(x, outs=outs, alpha=3.0)
    ck(x, outs=outs, alpha=3)
    assert seen[1:] == [((4,), "float32", 2.0), ((8,), "float32", 3.0),
                        ((8,), "float32", 3)]
    assert type(seen[-1][2]) is int


def test_fixed_form_keys_unchanged_and_functions_spelled_fn():
    x = jnp.ones(8, F32)
    fixed = numbax.numba_cuda_kernel(
        scale_into, jax.ShapeDtypeStruct((8,), F32), launch_dims=8)
    text = jax.jit(lambda x: fixed(x, 2.0)).lower(x).as_text()
    assert ("kernel;outs=float32[8];grid=1x1x1;block=8x1x1;smem=0/"
            "in=float32[8];batch=0;bcast=0;scalars=1:float:0x1.0000000000000p+1"
            ) in text
    op = numbax.numba_cuda_kernel(scale_into, like,
                                  launch_dims=lambda x, a: x.shape[0])
    text = jax.jit(lambda x: op(x, 2)).lower(x).as_text()
    assert ("kernel;outs=fn;grid=fn;block=fn;smem=0/in=float32[8];batch=0;"
            "bcast=0;out=float32[8];grid=1x1x1;block=8x1x1;scalars=1:int:2"
            ) in text
    call = numbax.numba_cuda_callable(shapes_scalars_ops.two_pass_launch,
                                      outs=like, scratch=like)
    text = jax.jit(lambda x: call(x, np.float32(2))).lower(x).as_text()
    assert ("callable;outs=fn;scratch=fn;capture=0/in=float32[8];"
            "out=float32[8];scratch=float32[8];"
            "scalars=1:np.float32:0x1.0000000000000p+1") in text


def test_shape_function_errors_name_the_op_and_the_arguments():
    def broken(x, a):
        raise KeyError("no such shape")

    op = numbax.numba_cuda_kernel(scale_into, broken, launch_dims=4)
    with pytest.raises(KeyError, match=r"numba_cuda_kernel\(.*scale_into\): "
                       r"the outs function raised KeyError.*no such shape.*"
                       r"called with \(float32\[4\], 2.0\)"):
        op(jnp.ones(4, F32), 2.0)
    op = numbax.numba_cuda_kernel(scale_into, lambda x, a: (4, 2),
                                  launch_dims=4)
    with pytest.raises(TypeError, match=r"outs \(returned by the outs "
                       r"function for \(float32\[4\], 2.0\)\).*bare shape"):
        op(jnp.ones(4, F32), 2.0)
    op = numbax.numba_cuda_kernel(scale_into, like,
                                  launch_dims=lambda x, a: (1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"scale_into\): launch_dims "
                       r"\(returned by the launch_dims function.*1 to 3 axes"):
        op(jnp.ones(4, F32), 2.0)
    op = numbax.numba_cuda_kernel(scale_into, like,
                                  launch_dims=lambda x, a: (2**40, 2**20))
    with pytest.raises(ValueError, match=r"blocks on axis"):
        op(jnp.ones(4, F32), 2.0)
    call = numbax.numba_cuda_callable(
        lambda x, out, tmp, stream: None, outs=like,
        scratch=lambda x: jax.ShapeDtypeStruct((), F32))
    with pytest.raises(ValueError, match=r"scratch \(returned by the scratch "
                       r"function for \(float32\[4\]\)\)\[0\] is 0-d"):
        call(jnp.ones(4, F32))


def test_shape_functions_are_op_identity_and_launch_dims_checked_once():
    a = numbax.numba_cuda_kernel(scale_into, like, launch_dims=len_of)
    b = numbax.numba_cuda_kernel(scale_into, like, launch_dims=len_of)
    c = numbax.numba_cuda_kernel(scale_into, like_f64, launch_dims=len_of)
    assert a is b and a is not c
    # A launch_dims function with grid/block is refused when created.
    with pytest.raises(ValueError, match="either grid and block, or "
                       "launch_dims"):
        numbax.numba_cuda_kernel(scale_into, like, grid=1, block=1,
                                 launch_dims=len_of)


def len_of(x, *rest):
    return x.shape[0]


def _export_and_run_child(tmp_path, exp, args):
    blob = tmp_path / "program.bin"
    blob.write_bytes(exp.serialize())
    data = tmp_path / "data.npz"
    np.savez(data, a=args[0], b=args[1], c=args[2])
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    if not numbax.simulator_enabled():
        env.pop("NUMBA_ENABLE_CUDASIM")
        env.pop("JAX_PLATFORMS")
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "shapes_scalars_child.py"),
         str(blob), str(data)],
        capture_output=True, text=True, env=env, timeout=300, cwd=HERE)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"child exited {proc.returncode}\n{proc.stdout}\n"
        f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.gpu
def test_export_round_trip_with_shape_functions_and_scalars(tmp_path, rng):
    ops = shapes_scalars_ops
    exp = export.export(jax.jit(ops.program),
                        disabled_checks=numbax.export_disabled_checks())(
        *ops.SPECS)
    # Three shapes, one op object each, in the serialised program's keys.
    text = exp.mlir_module()
    assert text.count("outs=fn;grid=fn;block=fn") == 3
    args = ops.inputs(int(rng.integers(1 << 30)))
    result = _export_and_run_child(tmp_path, exp, args)
    assert result["n"] == 5 and result["err"] < 1e-5, result


# -- scalars by value ---------------------------------------------------------

# Every kind of scalar, and what the kernel must compute with it (numpy's
# view of the same typed value): x * s in float64 (complex for a complex).
SCALARS = [
    pytest.param(True, id="bool"),
    pytest.param(False, id="bool-false"),
    pytest.param(-7, id="int"),
    pytest.param(0.1, id="float"),
    pytest.param(np.float32(0.1), id="np.float32"),
    pytest.param(np.float64(-2.5), id="np.float64"),
    pytest.param(np.float16(1.5), id="np.float16"),
    pytest.param(np.int16(-300), id="np.int16"),
    pytest.param(np.int8(-128), id="np.int8"),
    pytest.param(np.uint8(250), id="np.uint8"),
    pytest.param(np.int32(2**31 - 1), id="np.int32"),
    pytest.param(np.uint64(2**64 - 1), id="np.uint64"),
    pytest.param(2**63 - 1, id="int-max"),
    pytest.param(np.bool_(True), id="np.bool"),
    pytest.param(1.5 - 2j, id="complex"),
    pytest.param(np.complex64(0.1 + 1j), id="np.complex64"),
]


@cuda.jit
def times_scalar(x, s, poison, out):
    """out (aliased to a NaN-filled poison input) = x * s."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * s


@pytest.mark.gpu
@pytest.mark.parametrize("s", SCALARS)
def test_scalar_of_each_kind_matches_numpy(s, rng, x64):
    n = 77
    complex_ = isinstance(s, (complex, np.complexfloating))
    dtype = np.complex128 if complex_ else np.float64
    x = rng.standard_normal(n).astype(dtype)
    if complex_:
        x = x + 1j * rng.standard_normal(n)
    op = numbax.numba_cuda_kernel(
        times_scalar, jax.ShapeDtypeStruct((n,), dtype), launch_dims=n,
        input_output_aliases={1: 0})
    # numpy's product with the value as Numba types it (numba.typeof).
    want = x * np.asarray(s)[()]
    for f in (op, jax.jit(op, static_argnums=1)):
        got = np.asarray(f(x, s, nan_like((n,), dtype)))
        np.testing.assert_allclose(got, want, rtol=1e-12)


@cuda.jit
def store_scalar(s, out):
    out[0] = s


@pytest.mark.gpu
def test_scalar_types_follow_numba_typeof(x64):
    """0.1 is float64, np.float32(0.1) float32: what lands in a float64
    output shows it (and the two are separate keys, never one cache
    entry)."""
    op = numbax.numba_cuda_kernel(
        store_scalar, jax.ShapeDtypeStruct((1,), jnp.float64), grid=1,
        block=1)
    assert np.asarray(op(0.1))[0] == 0.1
    assert np.asarray(op(np.float32(0.1)))[0] == np.float64(np.float32(0.1))
    assert np.asarray(op(0.1))[0] == 0.1
    # An int stays exact in int64 (Numba's int).
    op = numbax.numba_cuda_kernel(
        store_scalar, jax.ShapeDtypeStruct((1,), jnp.int64), grid=1, block=1)
    assert int(np.asarray(op(2**62 + 1))[0]) == 2**62 + 1
    assert int(np.asarray(op(True))[0]) == 1


@pytest.mark.gpu
def test_each_value_is_a_new_key():
    x = jnp.ones(4, F32)
    op = numbax.numba_cuda_kernel(scale_into, like, launch_dims=4)
    texts = [jax.jit(lambda x, a=a: op(x, a)).lower(x).as_text()
             for a in (1.0, 2.0, np.float32(1.0))]
    keys = [t.split('key = "')[1].split('"')[0] for t in texts]
    assert len(set(keys)) == 3
    assert keys[0].endswith("scalars=1:float:0x1.0000000000000p+0")
    assert keys[2].endswith("scalars=1:np.float32:0x1.0000000000000p+0")


@pytest.mark.gpu
@pytest.mark.parametrize("vmap_method", [None, "sequential"])
def test_vmap_with_a_scalar_never_batches_it(vmap_method, rng):
    kw = {} if vmap_method is None else dict(vmap_method=vmap_method)
    op = numbax.numba_cuda_kernel(scale_into, like,
                                  launch_dims=lambda x, a: x.shape[0], **kw)
    x = rng.standard_normal((6, 9)).astype(np.float32)
    got = jax.vmap(lambda r: op(r, np.float32(-2)))(x)
    np.testing.assert_allclose(np.asarray(got), -2 * x, rtol=1e-6)
    # Nested, with an input shared by the inner level.
    got = jax.vmap(jax.vmap(lambda r: op(r, 0.5)))(x.reshape(2, 3, 9))
    np.testing.assert_allclose(np.asarray(got).reshape(6, 9), 0.5 * x,
                               rtol=1e-6)
    decision = op.vmap_fold(jnp.ones(9, F32), 2.0)
    assert decision.folds == (vmap_method is None)


@cuda.jit
def scale_and_offset(x, a, y, b, out):
    """out = a * x + b * y: two scalars between and after arrays."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = a * x[i] + b * y[i]


@pytest.mark.gpu
def test_scalars_between_arrays_under_vmap_with_a_broadcast_input(rng):
    op = numbax.numba_cuda_kernel(scale_and_offset, like,
                                  launch_dims=lambda x, *r: x.shape[0])
    x = rng.standard_normal((5, 11)).astype(np.float32)
    y = rng.standard_normal(11).astype(np.float32)
    got = jax.vmap(lambda r: op(r, 2.0, y, np.float32(3)))(x)
    np.testing.assert_allclose(np.asarray(got), 2 * x + 3 * y, rtol=1e-5)
    got = jax.jit(op, static_argnums=(1, 3))(x[0], -1, y, True)
    np.testing.assert_allclose(np.asarray(got), -x[0] + y, rtol=1e-5)


@pytest.mark.gpu
def test_callable_gets_the_python_value():
    seen = []

    def launch(x, flag, n, alpha, out, stream):
        seen.append((type(flag), flag, type(n), n, type(alpha), alpha))
        scale_into[1, 32, stream](x, alpha, out)

    op = numbax.numba_cuda_callable(launch, like)
    x = jnp.arange(4, dtype=F32)
    np.testing.assert_allclose(np.asarray(op(x, True, 3, np.float32(2))),
                               2 * np.arange(4))
    got = jax.jit(op, static_argnums=(1, 2, 3))(x, False, 7, 0.5)
    np.testing.assert_allclose(np.asarray(got), 0.5 * np.arange(4))
    assert seen[0] == (bool, True, int, 3, np.float32, np.float32(2))
    assert seen[1] == (bool, False, int, 7, float, 0.5)


# -- traced scalars -------------------------------------------

@cuda.jit
def scale_shift(x, a, b, out):
    """out = a * x + b, every element written (no poison needed)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = a * x[i] + b


@pytest.mark.gpu
def test_jit_of_a_kernel_op_with_a_python_scalar(rng):
    """jax.jit(op)(x, 2.0): jit traces 2.0 into a 0-d array, which the
    kernel now reads on the device (it was refused, telling the user to
    pass the Python scalar they had passed)."""
    n = 37
    op = numbax.numba_cuda_kernel(scale_into, like, launch_dims=n)
    x = rng.standard_normal(n).astype(np.float32)
    got = jax.jit(op)(x, 2.0)
    np.testing.assert_allclose(np.asarray(got), 2.0 * x, rtol=1e-6)
    # A 0-d array outside jit takes the same way; a Python scalar stays
    # by value.
    np.testing.assert_allclose(np.asarray(op(x, jnp.float32(-3))), -3 * x,
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(op(x, 0.25)), 0.25 * x, rtol=1e-6)


@pytest.mark.gpu
def test_traced_scalar_changing_every_call_traces_once(rng):
    n = 50
    traces = []

    def step(x, a, b):
        traces.append(1)  # runs once per trace
        return op(x, a, b)

    seen = []

    def outs(x, a, b):  # sees the traced scalars as 0-d, never a value
        seen.append((a.shape, a.dtype, b.shape))
        return like(x)

    op = numbax.numba_cuda_kernel(scale_shift, outs,
                                  launch_dims=lambda x, *r: x.shape[0])
    jitted = jax.jit(step)
    direct = jax.jit(op)
    x = rng.standard_normal(n).astype(np.float32)
    values = rng.standard_normal((10, 2)).astype(np.float32)
    for a, b in values:
        want = a * x + b
        np.testing.assert_allclose(np.asarray(jitted(x, a, float(b))), want,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(direct(x, a, float(b))), want,
                                   rtol=1e-5, atol=1e-6)
    assert len(traces) == 1
    assert jitted._cache_size() == 1 and direct._cache_size() == 1
    assert seen == [((), np.float32, ())]
    # One key for every value: it names the traced positions, not values.
    texts = {jax.jit(op).lower(x, float(a), float(b)).as_text()
             for a, b in values[:3]}
    assert len(texts) == 1
    key = next(iter(texts)).split('key = "')[1].split('"')[0]
    assert key.endswith(";traced=1,2") and "scalars=" not in key, key


@pytest.mark.gpu
def test_traced_and_static_scalars_mixed(rng):
    op = numbax.numba_cuda_kernel(scale_and_offset, like,
                                  launch_dims=lambda x, *r: x.shape[0])
    x = rng.standard_normal(21).astype(np.float32)
    y = rng.standard_normal(21).astype(np.float32)
    f = jax.jit(lambda x, y, b: op(x, 2.0, y, b))  # a closed over, b traced
    for b in (-1.5, 4.0):
        np.testing.assert_allclose(np.asarray(f(x, y, b)), 2 * x + b * y,
                                   rtol=1e-5)
    assert f._cache_size() == 1


@pytest.mark.gpu
@pytest.mark.parametrize("vmap_method", [None, "sequential"])
def test_vmap_over_traced_scalars(vmap_method, rng):
    """A batched traced scalar: each slice gets its own value, folded or
    one launch per slice; an unbatched one is shared; nested vmaps too."""
    kw = {} if vmap_method is None else dict(vmap_method=vmap_method)
    op = numbax.numba_cuda_kernel(scale_shift, like,
                                  launch_dims=lambda x, *r: x.shape[0], **kw)
    x = rng.standard_normal((6, 13)).astype(np.float32)
    a = rng.standard_normal(6).astype(np.float32)
    b = np.float32(0.5)
    want = a[:, None] * x + b
    got = jax.vmap(op, in_axes=(0, 0, None))(x, a, b)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    got = jax.jit(jax.vmap(op, in_axes=(None, 0, None)))(x[0], a, b)
    np.testing.assert_allclose(np.asarray(got), a[:, None] * x[0] + b,
                               rtol=1e-5, atol=1e-6)
    got = jax.vmap(jax.vmap(op, in_axes=(0, None, 0)),
                   in_axes=(0, 0, None))(
        x.reshape(2, 3, 13), a[:2], a[2:5])
    want = (a[:2, None, None] * x.reshape(2, 3, 13)
            + a[2:5][None, :, None])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    decision = op.vmap_fold(jax.ShapeDtypeStruct((13,), F32),
                            jax.ShapeDtypeStruct((), F32), 1.0)
    assert decision.folds == (vmap_method is None)


@pytest.mark.gpu
def test_traced_scalar_dtype_is_honoured():
    """The body gets the traced value's own type: an int32 keeps the digits
    a float32 would round away, a float32 keeps the fraction an int would
    drop. (Not overflow: Numba computes int32 * int32 in int64 on the GPU,
    where the simulator's NumPy scalars wrap.)"""
    to_int = numbax.numba_cuda_kernel(
        store_scalar, jax.ShapeDtypeStruct((1,), jnp.int32), grid=1, block=1)
    to_float = numbax.numba_cuda_kernel(
        store_scalar, jax.ShapeDtypeStruct((1,), F32), grid=1, block=1)
    assert int(jax.jit(to_int)(jnp.int32(2**24 + 1))[0]) == 2**24 + 1
    assert float(jax.jit(to_float)(jnp.float32(0.5))[0]) == 0.5
    assert float(jax.jit(to_float)(3)[0]) == 3.0  # a weak int traced as int32


@pytest.mark.gpu
def test_traced_scalar_dtype_with_x64(x64):
    op = numbax.numba_cuda_kernel(
        store_scalar, jax.ShapeDtypeStruct((1,), jnp.float64), grid=1,
        block=1)
    f = jax.jit(op)
    assert float(f(0.1)[0]) == 0.1  # float64 traced
    assert float(f(jnp.float32(0.1))[0]) == float(np.float32(0.1))
    assert float(f(2**40 + 1)[0]) == 2**40 + 1  # int64 traced
    assert f._cache_size() == 3  # one per dtype, not per value
    f(0.7), f(jnp.float32(0.2)), f(5)
    assert f._cache_size() == 3


@pytest.mark.gpu
def test_callable_gets_a_traced_scalar_as_a_one_element_array(rng):
    seen = []

    def launch(x, a, out, stream):
        seen.append((tuple(a.shape), np.dtype(a.dtype)))
        scale_from_array[1, 64, stream](x, a, out)

    shapes = []

    def outs(x, a):
        shapes.append(a.shape)
        return like(x)

    op = numbax.numba_cuda_callable(launch, outs, vmap_method="sequential")
    jitted = jax.jit(op)
    x = rng.standard_normal(40).astype(np.float32)
    for a in rng.standard_normal(10).astype(np.float32):
        np.testing.assert_allclose(np.asarray(jitted(x, a)), a * x,
                                   rtol=1e-6)
    assert jitted._cache_size() == 1
    assert set(seen) == {((1,), np.dtype(np.float32))}
    assert shapes == [()]  # the outs function sees the 0-d array
    # Under vmap: each slice's value.
    a = rng.standard_normal(3).astype(np.float32)
    got = jax.vmap(op, in_axes=(None, 0))(x, a)
    np.testing.assert_allclose(np.asarray(got), a[:, None] * x, rtol=1e-6)


@cuda.jit
def scale_from_array(x, a, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = a[0] * x[i]


def test_traced_scalar_refusals_name_jit_and_the_static_ways(monkeypatch):
    """Where a traced scalar cannot be taken, the message says jit traced
    it and shows static_argnums and closing over the value."""
    x = jnp.ones(4, F32)
    like_4 = jax.ShapeDtypeStruct((4,), F32)
    aliased = numbax.numba_cuda_kernel(times_scalar, like, launch_dims=4,
                                       input_output_aliases={1: 0})
    with pytest.raises(TypeError, match=(
            r"times_scalar\): input 1 is a traced scalar \(a 0-d float32 "
            r"array: jax.jit traces a Python scalar.*input_output_aliases"
            r".*static_argnums=1.*closed over")):
        jax.jit(aliased)(x, 2.0, x)
    callable_op = numbax.numba_cuda_callable(
        lambda x, a, b, out, stream: None, like, input_output_aliases={2: 0})
    with pytest.raises(TypeError, match=r"input 1 is a traced scalar.*"
                       r"static_argnums=1"):
        jax.jit(callable_op)(x, 2.0, x)
    # Sharding rules name array operands only.
    ruled = numbax.numba_cuda_kernel(scale_into, like_4, launch_dims=4,
                                     batch_partitionable=True)
    with pytest.raises(TypeError, match=r"input 1 is a traced scalar.*"
                       r"sharding rule.*static_argnums=1"):
        jax.jit(ruled)(x, 2.0)
    ruled_callable = numbax.numba_cuda_callable(
        lambda x, a, out, stream: None, like_4, sharding_rule="i, -> i")
    with pytest.raises(TypeError, match=r"input 1 is a traced scalar.*"
                       r"sharding rule.*static_argnums=1"):
        jax.jit(ruled_callable)(x, 2.0)
    # A compiler that takes no scalars (numba-cuda-mlir) refuses it so.
    from numbax.compilers.numba_cuda import NumbaCuda

    class NoScalars(NumbaCuda):
        name = "numba-cuda-mlir"
        takes_scalars = False

    op = numbax.numba_cuda_kernel(scale_into, like, launch_dims=4)
    monkeypatch.setattr(op, "compiler", NoScalars())
    with pytest.raises(TypeError, match=(
            r"input 1 is a traced scalar.*not for numba-cuda-mlir ones.*"
            r"static_argnums=1.*closed over")):
        jax.jit(op)(x, 2.0)


def test_custom_kernel_scalar_input_names_the_op_and_static_keywords(rng):
    # A scalar given to an XLACustomKernel is an input of its primitive (a
    # 0-d array, which a jnp backend takes as it is); the numbax kernel its
    # generator returns cannot take one, and the message names this op and
    # the static keyword argument, not the inner kernel and "pass a Python
    # scalar" (which the user did).
    ck = numbax.XLACustomKernel("numbax_test_scalar_input")

    @ck.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(scale_into, outs, launch_dims=4)

    ck.def_kernel("cpu", lambda *, outs: lambda x, a: x * a, backend="jnp")
    spec = jax.ShapeDtypeStruct((4,), F32)
    x = rng.standard_normal(4).astype(np.float32)
    calls = {
        "eager": lambda: ck(x, 2.0, outs=spec, backend="numba_cuda"),
        "jit": lambda: jax.jit(lambda v, a: ck(
            v, a, outs=spec, backend="numba_cuda"))(x, 2.0),
        "vmap": lambda: jax.vmap(lambda v: ck(
            v, 2.0, outs=spec, backend="numba_cuda"))(np.stack([x, x])),
    }
    for how, call in calls.items():
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert message.startswith(
            "XLACustomKernel('numbax_test_scalar_input'): input 1 is 0-d"), \
            (how, message)
        assert "static keyword argument, op(x, outs=..., alpha=2.0)" in \
            message and "1-element array" in message, (how, message)
        assert "pass a Python or NumPy scalar" not in message, how
    # A jnp backend still takes the scalar as the 0-d array it is.
    np.testing.assert_allclose(
        np.asarray(ck(x, 2.0, outs=spec, backend="jnp")), 2 * x, rtol=1e-6)


def test_scalars_numba_cannot_pass_are_refused_clearly():
    op = numbax.numba_cuda_kernel(scale_into, like, launch_dims=4)
    with pytest.raises(TypeError, match=r"input 1 is a scalar Numba cannot "
                       r"type.*1-element array"):
        jax.jit(lambda x: op(x, 2**70))(jnp.ones(4, F32))


def test_aliases_count_array_inputs_only(rng):
    op = numbax.numba_cuda_kernel(times_scalar, like, launch_dims=4,
                                  input_output_aliases={1: 0})
    x = rng.standard_normal(4).astype(np.float32)
    # Input 1 of the aliases is the poison array (argument 2).
    np.testing.assert_allclose(np.asarray(op(x, 3.0, nan_like((4,)))),
                               3 * x, rtol=1e-6)


def test_scalar_keys_round_trip_exactly():
    for value in (True, False, 0, -5, 2**80, 0.1, -0.0, float("inf"),
                  float("nan"), 1 - 2j, np.float32(0.1), np.float16(-2),
                  np.int8(-128), np.uint64(2**64 - 1), np.bool_(False),
                  np.complex64(1j), np.float64(1e-300)):
        text = scalar_args.encode(value)
        assert not set(text) & set("/;,="), text
        back = scalar_args.decode(text)
        assert type(back) is type(value)
        if value != value:  # NaN
            assert back != back
        elif isinstance(value, int):
            assert back == value
        else:  # bit for bit (-0.0 stays -0.0)
            assert np.asarray(back).tobytes() == np.asarray(value).tobytes()


# -- explicit signatures ---------------------------------------------------------

F32A = nt.Array(nt.float32, 1, "A")
F32C = nt.Array(nt.float32, 1, "C")


def _stand_in(signature):
    """What compilers/signatures.py reads of a dispatcher compiled for one signature."""
    from numba.cuda.typing.context import Context

    def kernel_body(x, alpha, out):
        pass
    return pytypes.SimpleNamespace(
        overloads={tuple(signature): "version0"}, specialized=True,
        _can_compile=False, typingctx=Context(), py_func=kernel_body)


def test_wrong_typed_scalar_for_an_explicit_signature_is_a_clear_error():
    kernel = _stand_in((F32A, nt.float32, F32A))
    # An int or float converts to the float32 parameter, as Numba's launch.
    assert signatures.select_signature(
        kernel, (F32C, nt.float64, F32C), "op", 2) == (F32A, nt.float32, F32A)
    # A complex does not: refused, naming the argument and both types.
    with pytest.raises(TypeError, match=r"takes float32 as argument 1 \(input "
                       r"1, 'alpha'\), but the scalar there is complex128"):
        signatures.select(kernel, (F32C, nt.complex128, F32C), "op", 2)
    # An array where the signature has a scalar.
    with pytest.raises(TypeError, match="but the array there is"):
        signatures.select(kernel, (F32C, F32C, F32C), "op", 2)
    where = "argument 1 ('n')"
    s = scalar_args.canonical(1, 2.5)
    with pytest.raises(TypeError, match=r"argument 1 \('n'\) is int32 in the "
                       r"kernel's signature, but numbax passes the scalar "
                       r"float 2.5.*pass an int"):
        scalar_args.converted(s, nt.int32, "op", where)
    with pytest.raises(ValueError, match=r"does not fit in it \(-32768 to "
                       r"32767\)"):
        scalar_args.converted(scalar_args.canonical(1, 40000), nt.int16, "op",
                           where)
    with pytest.raises(TypeError, match="a boolean in the kernel's signature"):
        scalar_args.converted(scalar_args.canonical(1, 1), nt.boolean, "op", where)
    with pytest.raises(TypeError, match="pass an array there"):
        scalar_args.converted(s, F32A, "op", where)
    # What does convert: as ctypes would (an int to a float parameter).
    assert scalar_args.converted(scalar_args.canonical(1, 3), nt.float32, "op",
                              where) == np.float32(3)
    assert scalar_args.parameter(scalar_args.canonical(2, 1.5), nt.float32, "op",
                              where) == (2, "f", np.float32(1.5).tobytes())


@pytest.mark.gpu
def test_explicit_signature_scalars_on_the_gpu(gpu_only, rng):
    kernel = cuda.jit("void(float32[:], int32, float32[:])")(_add_n)
    op = numbax.numba_cuda_kernel(kernel, like, launch_dims=16)
    x = rng.standard_normal(16).astype(np.float32)
    # An int64 value converted to the signature's int32.
    np.testing.assert_allclose(np.asarray(op(x, 3)), x + 3, rtol=1e-6)
    with pytest.raises(TypeError, match="is int32 in the kernel's signature"):
        op(x, 2.5)
    with pytest.raises(ValueError, match="does not fit"):
        op(x, 2**40)
    with pytest.raises(TypeError, match="but the scalar there is complex128"):
        op(x, 1j)


def _add_n(x, n, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + n
