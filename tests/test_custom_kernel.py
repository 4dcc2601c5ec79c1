"""XLACustomKernel: Numba kernels as JAX primitives (jit, vmap, jvp, grad, backends).

The CSR worked example (examples/differentiable_op.py, docs/custom_kernel.md)
is imported and tested here against dense jnp references.
"""

import gc
import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from numba import cuda

import numbax
from numbax.custom_kernel import NUMBA_CUDA, is_undefined_primal
from conftest import SIMULATOR, random_array, x64_enabled

pytestmark = pytest.mark.gpu

F32 = jnp.float32
# The platform tests run on, and the other one.
HERE = "cpu" if SIMULATOR else "gpu"
OTHER = "gpu" if SIMULATOR else "cpu"

_EXAMPLE_PATH = (Path(__file__).resolve().parents[1] / "examples"
                 / "differentiable_op.py")
_spec = importlib.util.spec_from_file_location(
    "numbax_example_differentiable_op", _EXAMPLE_PATH)
ex = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ex)

_counter = itertools.count()


def new_op(prefix: str) -> numbax.XLACustomKernel:
    """An op with a name no other test uses (duplicate names warn)."""
    return numbax.XLACustomKernel(f"test_ck_{prefix}_{next(_counter)}")


@pytest.fixture
def x64():
    with x64_enabled(True):
        yield


# -- the CSR worked example -----------------------------------------------------

M, N = 20, 30


@pytest.fixture
def csr(rng):
    indptr, indices, data, dense = ex.random_csr(rng, M, N, 0.2, np.float64)
    assert indptr[1] == 0 and 0 < len(data) < M * N  # an empty row; sparse
    return indptr, indices, data, dense


def matvec(indptr, indices, data, x, **kw):
    spec = jax.ShapeDtypeStruct((len(indptr) - 1,), data.dtype)
    return ex.csr_matvec(indptr, indices, data, x, outs=spec, **kw)


def dense_of(indptr, indices, data):
    return ex.dense_from_csr(indptr, indices, data, (len(indptr) - 1, N))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csr_forward_eager_and_jit(csr, rng, x64, dtype):
    indptr, indices, data, dense = csr
    data, dense = data.astype(dtype), dense.astype(dtype)
    x = rng.standard_normal(N).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for fn in (matvec, jax.jit(matvec)):
        y = fn(indptr, indices, data, x)
        assert y.dtype == dtype and y.shape == (M,)
        np.testing.assert_allclose(y, dense @ x, rtol=tol, atol=tol)


def test_csr_check_grads_fwd_and_rev(csr, rng, x64):
    indptr, indices, data, _ = csr
    x = rng.standard_normal(N)
    f = lambda d, v: matvec(indptr, indices, d, v)  # noqa: E731
    check_grads(f, (data, x), order=1, modes=("fwd", "rev"))
    check_grads(jax.jit(f), (data, x), order=1, modes=("fwd", "rev"))


def test_csr_jit_grad_matches_jnp_reference(csr, rng, x64):
    indptr, indices, data, _ = csr
    x = rng.standard_normal(N)

    def loss(d, v):
        return jnp.sum(jnp.tanh(matvec(indptr, indices, d, v)) ** 2)

    def loss_ref(d, v):
        return jnp.sum(jnp.tanh(dense_of(indptr, indices, d) @ v) ** 2)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(data, x)
    expected = jax.grad(loss_ref, argnums=(0, 1))(data, x)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # The backward pass runs the Numba backward ops, not dense algebra.
    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(data, x))
    assert "csr_matvec_t[" in jaxpr and "csr_data_grad[" in jaxpr


def test_csr_jvp_matches_reference(csr, rng, x64):
    indptr, indices, data, dense = csr
    x, tx = rng.standard_normal(N), rng.standard_normal(N)
    tdata = rng.standard_normal(len(data))
    y, ty = jax.jvp(lambda d, v: matvec(indptr, indices, d, v),
                    (data, x), (tdata, tx))
    tdense = np.asarray(dense_of(indptr, indices, tdata))
    np.testing.assert_allclose(y, dense @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ty, tdense @ x + dense @ tx,
                               rtol=1e-12, atol=1e-12)


def test_csr_linear_transpose_is_the_backward_kernel(csr, rng, x64):
    indptr, indices, data, dense = csr
    x, ct = rng.standard_normal(N), rng.standard_normal(M)
    t_x = jax.linear_transpose(lambda v: matvec(indptr, indices, data, v), x)
    np.testing.assert_allclose(t_x(ct)[0], dense.T @ ct, rtol=1e-12,
                               atol=1e-12)
    t_d = jax.linear_transpose(lambda d: matvec(indptr, indices, d, x), data)
    rows = np.repeat(np.arange(M), np.diff(indptr))
    np.testing.assert_allclose(t_d(ct)[0], ct[rows] * x[indices],
                               rtol=1e-12, atol=1e-12)


def test_csr_vmap_matches_loop(csr, rng, x64):
    indptr, indices, data, dense = csr
    xs = rng.standard_normal((4, N))
    ds = rng.standard_normal((3, len(data)))
    loop = np.stack([matvec(indptr, indices, data, v) for v in xs])
    np.testing.assert_allclose(loop, xs @ dense.T, rtol=1e-12, atol=1e-12)

    f = lambda d, v: matvec(indptr, indices, d, v)  # noqa: E731
    np.testing.assert_allclose(jax.jit(jax.vmap(f, in_axes=(None, 0)))(data, xs),
                               loop, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(jax.vmap(f, in_axes=(None, 1))(data, xs.T),
                               loop, rtol=1e-12, atol=1e-12)
    # A batched matrix falls back to the default loop.
    np.testing.assert_allclose(
        jax.jit(jax.vmap(f, in_axes=(0, None)))(ds, xs[0]),
        np.stack([f(d, xs[0]) for d in ds]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        jax.vmap(f)(ds, xs[:3]),
        np.stack([f(d, v) for d, v in zip(ds, xs[:3])]),
        rtol=1e-12, atol=1e-12)


def test_csr_user_batching_rule_replaces_the_loop(csr, rng, x64):
    indptr, indices, data, _ = csr
    xs = rng.standard_normal((4, N))
    f = lambda d, v: matvec(indptr, indices, d, v)  # noqa: E731
    batched_x = str(jax.make_jaxpr(jax.vmap(f, in_axes=(None, 0)))(data, xs))
    assert "csr_matmat[" in batched_x and "scan[" not in batched_x
    # NotImplemented from the rule: the default, which for a numbax kernel
    # is the kernel's own batching (one launch when it folds),
    # not a loop.
    ds = rng.standard_normal((2, len(data)))
    batched_d = str(jax.make_jaxpr(jax.vmap(f, in_axes=(0, None)))(ds, xs[0]))
    assert "csr_matmat[" not in batched_d and "scan[" not in batched_d
    assert "numbax_kernel[" in batched_d and "batch=2" in batched_d


def test_csr_grad_and_vmap_compose(csr, rng, x64):
    indptr, indices, data, _ = csr
    xs = rng.standard_normal((3, N))

    def loss(d, v):
        return jnp.sum(jnp.sin(matvec(indptr, indices, d, v)))

    def loss_ref(d, v):
        return jnp.sum(jnp.sin(dense_of(indptr, indices, d) @ v))

    # vmap of grad: per-example gradients.
    per_example = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)),
                                   in_axes=(None, 0)))(data, xs)
    expected = jax.vmap(jax.grad(loss_ref, argnums=(0, 1)),
                        in_axes=(None, 0))(data, xs)
    for got, want in zip(per_example, expected):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)

    # grad of vmap: goes through the user batching rule's csr_matmat and
    # its own JVP and transpose rules.
    def batch_loss(d, v):
        return jnp.sum(jax.vmap(loss, in_axes=(None, 0))(d, v))

    def batch_loss_ref(d, v):
        return jnp.sum(jax.vmap(loss_ref, in_axes=(None, 0))(d, v))

    got = jax.jit(jax.grad(batch_loss, argnums=(0, 1)))(data, xs)
    want = jax.grad(batch_loss_ref, argnums=(0, 1))(data, xs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_example_script_runs(x64, capsys):
    assert ex.main() == 0
    assert "matches jnp reference: True" in capsys.readouterr().out


# -- kernel generators and static arguments ---------------------------------------

def make_scale_kernel(factor):
    @cuda.jit
    def scale(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = factor * x[i]
    return scale


def test_generator_gets_static_kwargs_and_outs_and_is_cached(rng):
    op = new_op("scale")
    calls = []

    @op.def_numba_cuda_kernel
    def gen(*, factor, outs):
        calls.append((factor, outs))
        return numbax.numba_cuda_kernel(make_scale_kernel(factor), outs,
                                        launch_dims=outs.shape[0])

    x = random_array(rng, (50,), np.float32)
    spec = jax.ShapeDtypeStruct((50,), F32)
    np.testing.assert_allclose(op(x, outs=spec, factor=3.0), 3 * x, rtol=1e-6)
    # A new jit lowers again, but the generated kernel is reused.
    np.testing.assert_allclose(
        jax.jit(lambda v: op(v, outs=spec, factor=3.0))(x), 3 * x, rtol=1e-6)
    assert calls == [(3.0, spec)]
    # Another static value generates another kernel.
    np.testing.assert_allclose(
        jax.jit(lambda v: op(v, outs=spec, factor=-0.5))(x), -0.5 * x,
        rtol=1e-6)
    assert [c[0] for c in calls] == [3.0, -0.5]


@pytest.mark.parametrize("family", ["kernel", "callable"])
def test_generator_returning_a_function_that_creates_the_op(rng, family):
    # The reference's own style: the generator returns a function that
    # creates the op when it is called, while the XLACustomKernel lowers.
    # Nothing else refers to that op: the compiled program keeps it (it
    # failed at run time, "not registered in this process", before).
    op = new_op(f"creates_{family}")

    @op.def_numba_cuda_kernel
    def gen(*, factor, outs):
        kernel = make_scale_kernel(factor)
        n = outs.shape[-1]

        def run(v):
            if family == "kernel":
                return numbax.numba_cuda_kernel(kernel, outs,
                                                launch_dims=n)(v)

            def func(a, out, stream):
                kernel[1, n, stream](a, out)
            return numbax.numba_cuda_callable(
                func, outs, vmap_method="sequential")(v)
        return run

    x = random_array(rng, (4, 50), np.float32)
    spec = jax.ShapeDtypeStruct((50,), F32)
    np.testing.assert_allclose(op(x[0], outs=spec, factor=3.0), 3 * x[0],
                               rtol=1e-6)
    f = jax.jit(lambda v: op(v, outs=spec, factor=-2.0))
    np.testing.assert_allclose(f(x[1]), -2 * x[1], rtol=1e-6)
    gc.collect()
    np.testing.assert_allclose(f(x[2]), -2 * x[2], rtol=1e-6)
    g = jax.jit(jax.vmap(lambda v: op(v, outs=spec, factor=0.5)))
    gc.collect()
    np.testing.assert_allclose(g(x), 0.5 * x, rtol=1e-6)


def test_generator_picks_kernel_per_shape_and_dtype(rng, x64):
    op = new_op("pershape")

    @op.def_numba_cuda_kernel
    def gen(*, outs):
        # A different kernel per output dtype: double or negate.
        factor = 2.0 if outs.dtype == np.float64 else -1.0
        return numbax.numba_cuda_kernel(make_scale_kernel(factor), outs,
                                        launch_dims=outs.shape[0])

    for dtype, factor in ((np.float64, 2.0), (np.float32, -1.0)):
        for n in (7, 64):
            x = random_array(rng, (n,), dtype)
            y = op(x, outs=jax.ShapeDtypeStruct((n,), dtype))
            assert y.dtype == dtype and y.shape == (n,)
            np.testing.assert_allclose(y, factor * x, rtol=1e-6)


@pytest.mark.parametrize("value", [[1, 2], np.arange(3), {"a": 1}])
def test_unhashable_static_kwarg_is_type_error_naming_it(value):
    op = new_op("unhashable")
    op.def_kernel(HERE, lambda *, outs, **kw: (lambda x: x), backend="jax")
    with pytest.raises(TypeError, match="'sizes' must be hashable"):
        op(jnp.ones(3), outs=jax.ShapeDtypeStruct((3,), F32), sizes=value)


@cuda.jit
def double_and_square(x, double, square):
    i = cuda.grid(1)
    if i < x.shape[0]:
        double[i] = 2 * x[i]
        square[i] = x[i] * x[i]


def test_pytree_outs_and_one_jvp_rule_for_all_inputs(rng):
    op = new_op("pytree")
    op.def_numba_cuda_kernel(lambda *, outs: numbax.numba_cuda_kernel(
        double_and_square, outs, launch_dims=outs["double"].shape[0]))
    seen = []

    @op.def_jvp_rule
    def jvp(tangents, x, *, outs):
        seen.append(outs)
        (t,) = tangents
        return {"double": 2 * t, "square": 2 * x * t}

    n = 40
    spec = jax.ShapeDtypeStruct((n,), F32)
    outs = {"double": spec, "square": spec}
    x = random_array(rng, (n,), np.float32)
    y = jax.jit(lambda v: op(v, outs=outs))(x)
    assert set(y) == {"double", "square"}
    np.testing.assert_allclose(y["double"], 2 * x, rtol=1e-6)
    np.testing.assert_allclose(y["square"], x * x, rtol=1e-6)
    # The tangent is jnp code: reverse mode needs no transpose rule.
    g = jax.jit(jax.grad(lambda v: jnp.sum(op(v, outs=outs)["square"])
                         + jnp.sum(op(v, outs=outs)["double"])))(x)
    np.testing.assert_allclose(g, 2 * x + 2, rtol=1e-5, atol=1e-5)
    assert seen and seen[0] == outs


@cuda.jit
def gather_kernel(x, idx, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[idx[i]]


def test_one_jvp_rule_gets_none_for_integer_inputs(rng):
    op = new_op("gather")
    op.def_numba_cuda_kernel(lambda *, outs: numbax.numba_cuda_kernel(
        gather_kernel, outs, launch_dims=outs.shape[0]))
    tangents_seen = []

    @op.def_jvp_rule
    def jvp(tangents, x, idx, *, outs):
        tangents_seen.append(tangents)
        return tangents[0][idx]

    x = random_array(rng, (10,), np.float32)
    idx = rng.integers(0, 10, 6).astype(np.int32)
    spec = jax.ShapeDtypeStruct((6,), F32)
    tx = random_array(rng, (10,), np.float32)
    y, ty = jax.jvp(lambda v: op(v, idx, outs=spec), (x,), (tx,))
    np.testing.assert_allclose(y, x[idx])
    np.testing.assert_allclose(ty, tx[idx])
    assert tangents_seen[0][1] is None
    g = jax.grad(lambda v: jnp.sum(op(v, idx, outs=spec) ** 2))(x)
    expected = np.zeros(10, np.float32)
    np.add.at(expected, idx, 2 * x[idx])
    np.testing.assert_allclose(g, expected, rtol=1e-6)


def test_missing_rules_name_the_op_and_the_def_method(rng):
    """Before: JAX's "Differentiation rule for 'name' not implemented" and
    "Transpose rule (for reverse-mode differentiation) for 'name' not
    implemented", naming neither def_jvp_rule nor def_transpose_rule."""
    op = new_op("norules")
    op.def_kernel(HERE, lambda *, outs: (lambda x: 2 * x), backend="jax")
    spec = jax.ShapeDtypeStruct((4,), F32)
    no_jvp = rf"{op.name}'\) has no JVP rule.*op.def_jvp_rule\("
    no_transpose = rf"{op.name}'\) has no transpose rule.*op.def_transpose_rule\("
    with pytest.raises(NotImplementedError, match=no_jvp):
        jax.jvp(lambda v: op(v, outs=spec), (jnp.ones(4),), (jnp.ones(4),))
    with pytest.raises(NotImplementedError, match=no_jvp):
        jax.grad(lambda v: jnp.sum(op(v, outs=spec)))(jnp.ones(4))
    with pytest.raises(NotImplementedError, match=no_jvp):
        jax.jit(jax.grad(lambda v: jnp.sum(op(v, outs=spec))))(jnp.ones(4))
    with pytest.raises(NotImplementedError, match=no_transpose):
        jax.linear_transpose(lambda v: op(v, outs=spec), jnp.ones(4, F32))(
            jnp.ones(4, F32))
    # Linear JVP through the op itself, but no transpose rule.
    op.def_jvp_rule(lambda t, x, *, outs: op(t, outs=outs), per_input=True)
    _, t = jax.jvp(lambda v: op(v, outs=spec), (jnp.ones(4),),
                   (jnp.arange(4.0, dtype=F32),))
    np.testing.assert_allclose(t, 2 * np.arange(4.0))
    with pytest.raises(NotImplementedError, match=no_transpose):
        jax.grad(lambda v: jnp.sum(op(v, outs=spec)))(jnp.ones(4))
    with pytest.raises(NotImplementedError, match=no_transpose):
        jax.jit(jax.grad(lambda v: jnp.sum(op(v, outs=spec))))(jnp.ones(4))
    # With the rule, both work; stop_gradient still runs without any rule.
    op.def_transpose_rule(lambda ct, x, *, outs: (2 * ct,))
    np.testing.assert_allclose(
        jax.grad(lambda v: jnp.sum(op(v, outs=spec)))(jnp.ones(4)), 2.0)
    bare = new_op("norules_stopped")
    bare.def_kernel(HERE, lambda *, outs: (lambda x: 2 * x), backend="jax")
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(
        bare(jax.lax.stop_gradient(v), outs=spec) + v))(jnp.ones(4)), 1.0)


# -- batching ---------------------------------------------------------------------

@cuda.jit
def reverse_affine(x, w, out):
    # Each element depends on the whole slice and on w: a wrong batching
    # (mixed slices, shared w) shows.
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        out[i] = w[0] * x[n - 1 - i] + w[1]


def _reverse_affine_op():
    op = new_op("revaffine")
    op.def_numba_cuda_kernel(lambda *, outs: numbax.numba_cuda_kernel(
        reverse_affine, outs, launch_dims=outs.shape[0]))
    return op


def test_default_batching_loop_matches_python_loop(rng):
    op = _reverse_affine_op()
    n = 12
    spec = jax.ShapeDtypeStruct((n,), F32)
    f = lambda x, w: op(x, w, outs=spec)  # noqa: E731
    xs = random_array(rng, (3, n), np.float32)
    ws = random_array(rng, (3, 2), np.float32)
    ref = lambda x, w: w[0] * x[::-1] + w[1]  # noqa: E731
    cases = [
        ((0, None), (xs, ws[0]), [(x, ws[0]) for x in xs]),
        ((None, 0), (xs[0], ws), [(xs[0], w) for w in ws]),
        ((0, 0), (xs, ws), list(zip(xs, ws))),
        ((1, 0), (xs.T, ws), list(zip(xs, ws))),
    ]
    for in_axes, args, pairs in cases:
        out = jax.jit(jax.vmap(f, in_axes=in_axes))(*args)
        loop = np.stack([f(x, w) for x, w in pairs])
        np.testing.assert_allclose(out, loop, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out, [ref(x, w) for x, w in pairs],
                                   rtol=1e-6, atol=1e-6)
    # out_axes other than 0, and nested vmap.
    out = jax.vmap(f, in_axes=(0, None), out_axes=1)(xs, ws[0])
    np.testing.assert_allclose(out, np.stack([ref(x, ws[0]) for x in xs], 1),
                               rtol=1e-6, atol=1e-6)
    xss = random_array(rng, (2, 3, n), np.float32)
    nested = jax.jit(jax.vmap(jax.vmap(f, in_axes=(0, None)),
                              in_axes=(0, None)))(xss, ws[1])
    np.testing.assert_allclose(
        nested, [[ref(x, ws[1]) for x in row] for row in xss],
        rtol=1e-6, atol=1e-6)


def test_user_batching_rule_replaces_default(rng):
    op = _reverse_affine_op()
    n = 10
    spec = jax.ShapeDtypeStruct((n,), F32)
    calls = []

    @op.def_batching_rule
    def rule(args, axes, *, outs):
        calls.append(tuple(axes))
        x, w = args
        if axes[1] is not None:
            return NotImplemented
        x = jnp.moveaxis(x, axes[0], 0)
        # One jnp computation for the whole batch, on axis 1.
        return (w[0] * x[:, ::-1] + w[1]).T, 1

    xs = random_array(rng, (4, n), np.float32)
    ws = random_array(rng, (4, 2), np.float32)
    f = lambda x, w: op(x, w, outs=spec)  # noqa: E731
    out = jax.jit(jax.vmap(f, in_axes=(0, None)))(xs, ws[0])
    np.testing.assert_allclose(out, ws[0, 0] * xs[:, ::-1] + ws[0, 1],
                               rtol=1e-6, atol=1e-6)
    jaxpr = str(jax.make_jaxpr(jax.vmap(f, in_axes=(0, None)))(xs, ws[0]))
    assert op.name not in jaxpr  # the user's jnp code, no op, no loop
    out = jax.vmap(f)(xs, ws)  # NotImplemented: the loop
    np.testing.assert_allclose(out, ws[:, :1] * xs[:, ::-1] + ws[:, 1:],
                               rtol=1e-6, atol=1e-6)
    assert calls == [(0, None), (0, None), (0, 0)]


def test_batching_rule_with_bad_result_is_type_error(rng):
    op = _reverse_affine_op()
    op.def_batching_rule(lambda args, axes, *, outs: "oops")
    with pytest.raises(TypeError, match="must return \\(outputs, out_axes\\)"):
        jax.vmap(lambda x: op(x, jnp.ones(2, F32),
                              outs=jax.ShapeDtypeStruct((3,), F32)))(
            jnp.ones((2, 3), F32))


@pytest.mark.parametrize("out_axes, moved_to", [
    (-1, -1), (np.int64(1), 1), (-2, 0), (np.int32(-1), -1), ([-1], -1),
    ((np.int64(1),), 1)], ids=["-1", "np.int64(1)", "-2", "np.int32(-1)",
                               "[-1]", "(np.int64(1),)"])
def test_batching_rule_out_axes_negative_or_numpy_int_is_normalised(
        rng, out_axes, moved_to):
    """-1 means the output's last axis (as in jax.vmap): numbax hands JAX a
    non-negative Python int (before: -1 and np.int64 passed numbax's check,
    then JAX failed with 'batch dim should be int or None')."""
    op = new_op("outaxes")
    op.def_kernel(HERE, lambda *, outs: (lambda x: 3 * x), backend="jax")
    op.def_batching_rule(lambda args, axes, *, outs: (
        [3 * jnp.moveaxis(args[0], axes[0], moved_to)], out_axes))
    xs = random_array(rng, (2, 5), np.float32)
    # A list of outs, so that out_axes may have its structure.
    f = lambda v: op(v, outs=[jax.ShapeDtypeStruct((5,), F32)])[0]  # noqa: E731
    np.testing.assert_allclose(jax.vmap(f)(xs), 3 * xs, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(f))(xs), 3 * xs, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(f, in_axes=1)(xs.T), 3 * xs, rtol=1e-6)


@pytest.mark.parametrize("out_axes", [2, -3, True, 1.0],
                         ids=["2", "-3", "True", "1.0"])
def test_batching_rule_out_axes_out_of_range_is_type_error(out_axes):
    op = new_op("outaxesbad")
    op.def_kernel(HERE, lambda *, outs: (lambda x: 3 * x), backend="jax")
    op.def_batching_rule(lambda args, axes, *, outs: (3 * args[0], out_axes))
    with pytest.raises(TypeError, match=rf"{op.name}.*out_axis|{op.name}"
                                        r".*out_axes"):
        jax.vmap(lambda v: op(v, outs=SPEC4))(jnp.ones((2, 4), F32))


# -- backends and platforms ------------------------------------------------------

def _plus(k):
    return lambda *, outs: (lambda x: x + k)


@cuda.jit
def times_ten(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 10 * x[i]


def _times_ten_gen(*, outs):
    return numbax.numba_cuda_kernel(times_ten, outs, launch_dims=outs.shape[0])


def test_first_kernel_is_default_asdefault_set_default_and_per_call(rng):
    op = new_op("backends")
    op.def_kernel(HERE, _plus(1), backend="one")
    op.def_kernel(HERE, _plus(2), backend="two")
    x = random_array(rng, (5,), np.float32)
    spec = jax.ShapeDtypeStruct((5,), F32)
    call = lambda **kw: np.asarray(op(x, outs=spec, **kw))  # noqa: E731
    assert op.default_backend(HERE) == "one"
    np.testing.assert_allclose(call(), x + 1)
    np.testing.assert_allclose(call(backend="two"), x + 2)
    np.testing.assert_allclose(
        jax.jit(lambda v: op(v, outs=spec, backend="two"))(x), x + 2)
    # set_default takes effect for the next call, eager included.
    op.set_default(HERE, "two")
    np.testing.assert_allclose(call(), x + 2)
    op.def_kernel(HERE, _plus(3), backend="three", asdefault=True)
    np.testing.assert_allclose(call(), x + 3)
    op.def_kernel(HERE, _plus(4), backend="four")
    np.testing.assert_allclose(call(), x + 3)
    assert op.available_backends(HERE) == ("one", "two", "three", "four")


def test_numba_cuda_kernel_is_default_where_it_runs(rng):
    op = new_op("numbadefault")
    op.def_numba_cuda_kernel(_times_ten_gen)
    x = random_array(rng, (9,), np.float32)
    spec = jax.ShapeDtypeStruct((9,), F32)
    assert op.default_backend("gpu") == NUMBA_CUDA
    assert op.default_backend(HERE) == NUMBA_CUDA
    np.testing.assert_allclose(jax.jit(lambda v: op(v, outs=spec))(x), 10 * x,
                               rtol=1e-6)


def test_simulator_numba_cuda_on_cpu_unless_cpu_kernel_registered(
        simulator_only, rng):
    op = new_op("simcpu")
    op.def_numba_cuda_kernel(_times_ten_gen)
    x = random_array(rng, (9,), np.float32)
    spec = jax.ShapeDtypeStruct((9,), F32)
    assert op.available_backends("cpu") == (NUMBA_CUDA,)
    np.testing.assert_allclose(op(x, outs=spec), 10 * x, rtol=1e-6)
    # An explicit CPU kernel becomes the CPU default...
    op.def_kernel("cpu", _plus(1), backend="jax")
    assert op.default_backend("cpu") == "jax"
    assert op.default_backend("gpu") == NUMBA_CUDA
    np.testing.assert_allclose(op(x, outs=spec), x + 1, rtol=1e-6)
    # ...and the Numba kernel stays selectable, per call or as the default.
    np.testing.assert_allclose(op(x, outs=spec, backend=NUMBA_CUDA), 10 * x,
                               rtol=1e-6)
    op.set_default("cpu", NUMBA_CUDA)
    np.testing.assert_allclose(op(x, outs=spec), 10 * x, rtol=1e-6)


def test_rules_inherit_the_backend_of_the_call(rng):
    op = new_op("inherit")
    op.def_numba_cuda_kernel(_times_ten_gen)
    op.def_kernel(HERE, lambda *, outs: (lambda x: 10 * x), backend="jax")
    op.def_jvp_rule(lambda t, x, *, outs: op(t, outs=outs), per_input=True)
    op.def_transpose_rule(lambda ct, x, *, outs: (op(ct, outs=outs),))
    spec = jax.ShapeDtypeStruct((6,), F32)
    x = random_array(rng, (6,), np.float32)
    for backend in ("jax", NUMBA_CUDA):
        f = lambda v: jnp.sum(op(v, outs=spec, backend=backend) ** 2)  # noqa: E731,B023
        np.testing.assert_allclose(jax.jit(jax.grad(f))(x), 200 * x, rtol=1e-5)
        jaxpr = jax.make_jaxpr(jax.grad(f))(x).jaxpr
        params = [e.params["backends"] for e in jaxpr.eqns
                  if e.primitive is op.primitive]
        assert len(params) == 2  # forward, and transpose of the tangent
        assert all(dict(p)[HERE] == backend for p in params)


# -- errors -----------------------------------------------------------------------

SPEC4 = jax.ShapeDtypeStruct((4,), F32)


def test_no_kernel_for_platform_names_the_platforms_that_have_one():
    op = new_op("elsewhere")
    op.def_kernel(OTHER, _plus(1), backend="jax")
    with pytest.raises(NotImplementedError,
                       match=f"no kernel for platform '{HERE}'.*{OTHER}"):
        op(jnp.ones(4, F32), outs=SPEC4)
    with pytest.raises(NotImplementedError, match=f"{OTHER}"):
        jax.jit(lambda v: op(v, outs=SPEC4))(jnp.ones(4, F32))


def test_numba_cuda_only_without_simulator_names_the_fix(gpu_only):
    op = new_op("gpuonly")
    op.def_numba_cuda_kernel(_times_ten_gen)
    cpu = jax.devices("cpu")[0]
    with pytest.raises(NotImplementedError, match="NUMBA_ENABLE_CUDASIM"):
        jax.jit(lambda v: op(v, outs=SPEC4))(
            jax.device_put(jnp.ones(4, F32), cpu))


_GPU_ONLY_ON_THE_CPU = """
import jax, jax.numpy as jnp
from numba import cuda
import numbax

@cuda.jit
def k(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i]

op = numbax.XLACustomKernel("gpu_only_on_the_cpu")
op.def_numba_cuda_kernel(lambda *, outs: numbax.numba_cuda_kernel(
    k, outs, launch_dims=outs.shape[0]))
spec = jax.ShapeDtypeStruct((4,), jnp.float32)
f = lambda v: op(v, outs=spec)
for name, call in [("call", lambda: f(jnp.ones(4))),
                   ("vmap", lambda: jax.vmap(f)(jnp.ones((2, 4)))),
                   ("jit-vmap", lambda: jax.jit(jax.vmap(f))(jnp.ones((2, 4))))]:
    try:
        call()
        print(name, "| no error")
    except Exception as exc:
        print(name, "|", type(exc).__name__, "|", str(exc).splitlines()[0])
"""


def test_vmap_of_a_gpu_only_op_on_the_cpu_says_what_the_call_says():
    """Without the simulator a numba_cuda-only op has no CPU kernel: under
    jax.vmap too the error says so (before: the GPU kernel was vmapped on
    the CPU and Numba raised CudaSupportError)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", _GPU_ONLY_ON_THE_CPU],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(line.split(" | ", 1) for line in proc.stdout.splitlines())
    assert set(lines) == {"call", "vmap", "jit-vmap"}, proc.stdout
    assert lines["call"].startswith("NotImplementedError | "), lines
    assert "no kernel for platform 'cpu'" in lines["call"]
    assert "NUMBA_ENABLE_CUDASIM=1" in lines["call"]
    assert lines["vmap"] == lines["call"], lines
    assert lines["jit-vmap"] == lines["call"], lines


def test_op_without_kernels_is_an_error():
    op = new_op("empty")
    with pytest.raises(NotImplementedError, match="has no kernels"):
        op(jnp.ones(4, F32), outs=SPEC4)


def test_generator_error_names_op_backend_and_original_error():
    op = new_op("raises")

    def gen(*, outs, mode):
        raise ValueError(f"unsupported mode {mode!r}")

    op.def_kernel(HERE, gen, backend="fancy")
    with pytest.raises(ValueError) as info:
        op(jnp.ones(4, F32), outs=SPEC4, mode="x")
    message = str(info.value)
    assert op.name in message and "'fancy'" in message
    assert "unsupported mode 'x'" in message
    # The generator's own error is chained (jax 0.8 - 0.9 put their
    # JaxStackTraceBeforeTransformation in between).
    causes = []
    cause = info.value.__cause__
    while cause is not None and len(causes) < 10:
        causes.append(cause)
        cause = cause.__cause__
    assert any(type(c) is ValueError and "unsupported mode" in str(c)
               for c in causes), causes
    # The next call (another static value) works once the generator does.
    op.def_kernel(HERE, lambda *, outs, mode: (lambda x: x * 2),
                  backend="fancy")
    np.testing.assert_allclose(op(jnp.ones(4, F32), outs=SPEC4, mode="x"), 2)


def test_kernel_output_mismatch_is_type_error():
    op = new_op("mismatch")
    op.def_kernel(HERE, lambda *, outs: (lambda x: x[:2]), backend="jax")
    with pytest.raises(TypeError, match=r"float32\[2\], but outs declares "
                                        r"float32\[4\]"):
        op(jnp.ones(4, F32), outs=SPEC4)
    op.def_kernel(HERE, lambda *, outs: 42, backend="notfn", asdefault=True)
    with pytest.raises(TypeError, match="not a function"):
        op(jnp.ones(4, F32), outs=SPEC4)


def test_unknown_backend_and_bad_registrations():
    op = new_op("bad")
    op.def_kernel(HERE, _plus(1), backend="jax")
    with pytest.raises(ValueError, match="unknown backend 'nope'.*jax"):
        op(jnp.ones(4, F32), outs=SPEC4, backend="nope")
    with pytest.raises(ValueError, match="no 'nope' kernel"):
        op.set_default(HERE, "nope")
    with pytest.raises(ValueError, match="'cpu' or 'gpu'"):
        op.def_kernel("tpu", _plus(1), backend="x")
    with pytest.raises(ValueError, match="rocm.*not supported"):
        op.def_kernel("rocm", _plus(1), backend="x")
    with pytest.raises(TypeError, match="callable"):
        op.def_numba_cuda_kernel("not a function")
    with pytest.raises(TypeError, match="outs="):
        op(jnp.ones(4, F32))
    with pytest.raises(TypeError, match="ShapeDtypeStruct"):
        op(jnp.ones(4, F32), outs=[1, 2])
    with pytest.raises(TypeError, match="non-empty string"):
        numbax.XLACustomKernel("")


def test_the_reference_s_spellings_of_the_registration_methods(rng):
    # kg= is the reference's name for the generator; its def_kernel takes
    # (backend, platform, kg), numbax's the platform first and the backend
    # by keyword: that order is refused naming the fix, never misread.
    x = random_array(rng, (4,), np.float32)
    by_kg = new_op("kg")
    assert by_kg.def_numba_cuda_kernel(kg=_plus(2)) is not None
    np.testing.assert_allclose(by_kg(x, outs=SPEC4), x + 2, rtol=1e-6)
    keywords = new_op("kg_def_kernel")
    keywords.def_kernel(backend="jax", platform=HERE, kg=_plus(3))
    np.testing.assert_allclose(keywords(x, outs=SPEC4), x + 3, rtol=1e-6)
    cpu_kg = new_op("kg_cpu")
    cpu_kg.def_numba_kernel(kg=_plus(4))
    assert cpu_kg.available_backends("cpu") == ("numba",)
    op = new_op("reference_order")
    with pytest.raises(TypeError, match=r"def_kernel takes \(platform, "
                       r"kernel_generator.*reference's order.*Write "
                       r"def_kernel\(platform, kg, backend=backend\)"):
        op.def_kernel("numba", "cpu", _plus(1))
    with pytest.raises(TypeError, match="both kernel_generator and kg"):
        op.def_kernel(HERE, _plus(1), backend="jax", kg=_plus(1))
    with pytest.raises(TypeError, match="needs backend="):
        op.def_kernel(HERE, _plus(1))
    assert op.available_backends(HERE) == ()
    # get_default and def_jvp_rule2 (one rule per input, the reference's
    # rule(tangent, *primals, **params)) are there under its names.
    assert by_kg.get_default(HERE) == by_kg.default_backend(HERE)
    assert op.get_default(HERE) is None
    prod = new_op("jvp2")
    prod.def_kernel(HERE, lambda *, outs: (lambda a, b: a * b), backend="jax")
    prod.def_jvp_rule2(lambda ta, a, b, *, outs: ta * b,
                       lambda tb, a, b, *, outs: a * tb)
    y = random_array(rng, (4,), np.float32)
    da, db = jax.grad(lambda a, b: jnp.sum(prod(a, b, outs=SPEC4)),
                      argnums=(0, 1))(x, y)
    np.testing.assert_allclose(da, y, rtol=1e-6)
    np.testing.assert_allclose(db, x, rtol=1e-6)


@pytest.mark.parametrize("platform", ["tpu", "rocm", 1, None])
def test_unknown_platform_names_the_op_in_every_method(platform):
    """Before: "platform must be 'cpu' or 'gpu', got 'tpu'" without the op."""
    op = new_op("platforms")
    op.def_kernel(HERE, _plus(1), backend="jax")
    calls = {
        "def_kernel": lambda: op.def_kernel(platform, _plus(1), backend="x"),
        "set_default": lambda: op.set_default(platform, "jax"),
        "available_backends": lambda: op.available_backends(platform),
        "default_backend": lambda: op.default_backend(platform),
    }
    for method, call in calls.items():
        with pytest.raises(ValueError) as info:
            call()
        text = str(info.value)
        assert text.startswith(f"XLACustomKernel('{op.name}'): {method}: "
                               "platform "), (method, text)
        assert "'cpu'" in text and "'gpu'" in text, text


def test_duplicate_name_warns():
    name = f"test_ck_duplicate_{next(_counter)}"
    numbax.XLACustomKernel(name)
    with pytest.warns(UserWarning, match=f"'{name}' already exists"):
        numbax.XLACustomKernel(name)


def test_transpose_rule_must_return_one_entry_per_input():
    op = new_op("badtranspose")
    op.def_kernel(HERE, lambda *, outs: (lambda x, y: x * y), backend="jax")
    op.def_jvp_rule(None, lambda t, x, y, *, outs: op(x, t, outs=outs))
    op.def_transpose_rule(lambda ct, x, y, *, outs: x * ct)  # not a tuple
    with pytest.raises(TypeError, match="one entry per input"):
        jax.grad(lambda y: jnp.sum(op(jnp.ones(4, F32), y, outs=SPEC4)))(
            jnp.ones(4, F32))
    # Fixed: the transpose of y -> x * y.
    op.def_transpose_rule(
        lambda ct, x, y, *, outs: (None, x * ct if is_undefined_primal(y)
                                   else None))
    g = jax.grad(lambda y: jnp.sum(op(jnp.arange(4.0, dtype=F32), y,
                                      outs=SPEC4)))(jnp.ones(4, F32))
    np.testing.assert_allclose(g, np.arange(4.0))


def test_integer_tangent_or_cotangent_is_type_error_not_zero_grad():
    """A JVP rule that casts its tangent to an integer has no derivative
    through the cast: grad would be silently zero. Refused, naming the op."""
    op = new_op("inttangent")
    op.def_kernel(HERE, lambda *, outs: (lambda x: 3 * x), backend="jax")
    op.def_jvp_rule(lambda t, x, *, outs: (3 * t).astype(jnp.int32),
                    per_input=True)
    x = jnp.arange(4.0, dtype=F32)
    with pytest.raises(TypeError, match="inttangent.*tangent of dtype int32"
                       ".*float32"):
        jax.grad(lambda v: jnp.sum(op(v, outs=SPEC4)))(x)
    with pytest.raises(TypeError, match="tangent of dtype int32"):
        jax.jvp(lambda v: op(v, outs=SPEC4), (x,), (jnp.ones(4, F32),))
    # A float tangent of the output's dtype: the right gradient.
    op.def_jvp_rule(lambda t, x, *, outs: 3 * t, per_input=True)
    np.testing.assert_allclose(
        jax.grad(lambda v: jnp.sum(op(v, outs=SPEC4)))(x), np.full(4, 3.0))

    lin = new_op("intcotangent")
    lin.def_kernel(HERE, lambda *, outs: (lambda x, y: x * y), backend="jax")
    lin.def_jvp_rule(None, lambda t, x, y, *, outs: lin(x, t, outs=outs))
    lin.def_transpose_rule(
        lambda ct, x, y, *, outs: (None, (x * ct).astype(jnp.int32)))
    with pytest.raises(TypeError, match="cotangent of dtype int32"):
        jax.grad(lambda y: jnp.sum(lin(jnp.full(4, 1.5, F32), y,
                                       outs=SPEC4)))(jnp.ones(4, F32))


# -- dict outs: a flat tuple is never matched to the keys by position -----------
#
# JAX flattens a dict in sorted key order, so a flat tuple returned for dict
# outs was matched to the keys sorted, not in the order the dict was written:
# outs={"double": ..., "cube": ...} and a kernel returning (2x, x**3) gave
# y["cube"] == 2x, silently. Neither order is safe to assume (a rule sees
# outs as a dict in sorted order), so a flat tuple for dict outs is refused,
# naming the keys; a dict with the same keys is matched key by key.

DICT_SPEC = jax.ShapeDtypeStruct((4,), F32)
DICT_OUTS = {"double": DICT_SPEC, "cube": DICT_SPEC}  # not in sorted order


def _flat_or_dict(flat):
    def pair(x):
        double, cube = 2 * x, x ** 3
        return (double, cube) if flat else {"cube": cube, "double": double}
    return pair


@pytest.mark.parametrize("container", [tuple, list])
def test_dict_outs_kernel_flat_tuple_is_refused_not_swapped(container):
    op = new_op("dictflat")
    op.def_kernel(HERE, lambda *, outs: (
        lambda x: container(_flat_or_dict(True)(x))), backend="jax")
    x = jnp.arange(1.0, 5.0, dtype=F32)
    for call in (lambda v: op(v, outs=DICT_OUTS),
                 jax.jit(lambda v: op(v, outs=DICT_OUTS))):
        with pytest.raises(TypeError, match=(
                r"dictflat.*the 'jax' kernel.*returned a "
                f"{container.__name__} of 2.*outs is a dict.*"
                r"'cube', 'double'.*return a dict with the same keys")):
            call(x)
    # A dict (any key order) is matched key by key.
    op.def_kernel(HERE, lambda *, outs: _flat_or_dict(False), backend="jax")
    y = jax.jit(lambda v: op(v, outs=DICT_OUTS))(x)
    np.testing.assert_allclose(y["double"], 2 * x)
    np.testing.assert_allclose(y["cube"], x ** 3)


def test_dict_outs_nested_in_a_tuple_flat_result_is_refused():
    op = new_op("dictnested")
    op.def_kernel(HERE, lambda *, outs: (
        lambda x: (x, 2 * x, x ** 3)), backend="jax")
    outs = (DICT_SPEC, DICT_OUTS)
    with pytest.raises(TypeError, match=r"outs.*dict.*same keys"):
        op(jnp.ones(4, F32), outs=outs)


def test_tuple_outs_still_take_a_flat_list():
    # Positional matching stays where it is unambiguous: outs written as a
    # sequence, a result of the other sequence type or a flat one.
    op = new_op("tupleflat")
    op.def_kernel(HERE, lambda *, outs: (lambda x: [2 * x, x ** 3]),
                  backend="jax")
    x = jnp.arange(1.0, 5.0, dtype=F32)
    double, cube = op(x, outs=(DICT_SPEC, DICT_SPEC))
    np.testing.assert_allclose(double, 2 * x)
    np.testing.assert_allclose(cube, x ** 3)
    op.def_kernel(HERE, lambda *, outs: (lambda x: (2 * x, x, x ** 3)),
                  backend="jax")
    double, (same, cube) = op(x, outs=(DICT_SPEC, [DICT_SPEC, DICT_SPEC]))
    np.testing.assert_allclose(same, x)
    np.testing.assert_allclose(cube, x ** 3)


def test_dict_outs_jvp_flat_tuple_is_refused_not_swapped():
    op = new_op("dictjvp")
    op.def_kernel(HERE, lambda *, outs: _flat_or_dict(False), backend="jax")
    op.def_jvp_rule(lambda t, x, *, outs: (2 * t, 3 * x ** 2 * t),
                    per_input=True)
    x = jnp.arange(1.0, 5.0, dtype=F32)
    t = jnp.ones(4, F32)
    with pytest.raises(TypeError, match=(
            r"dictjvp.*the JVP rule of input 0 returned a tuple of 2.*"
            r"outs is a dict.*'cube', 'double'.*same keys")):
        jax.jvp(lambda v: op(v, outs=DICT_OUTS), (x,), (t,))
    op.def_jvp_rule(
        lambda t, x, *, outs: {"double": 2 * t, "cube": 3 * x ** 2 * t},
        per_input=True)
    _, ty = jax.jvp(lambda v: op(v, outs=DICT_OUTS), (x,), (t,))
    np.testing.assert_allclose(ty["double"], 2 * t)
    np.testing.assert_allclose(ty["cube"], 3 * x ** 2)


def test_dict_outs_batching_rule_flat_tuple_is_refused_not_swapped():
    op = new_op("dictbatch")
    op.def_kernel(HERE, lambda *, outs: _flat_or_dict(False), backend="jax")
    xs = jnp.arange(1.0, 9.0, dtype=F32).reshape(2, 4)
    f = jax.vmap(lambda v: op(v, outs=DICT_OUTS))

    op.def_batching_rule(
        lambda args, axes, *, outs: ((2 * args[0], args[0] ** 3), 0))
    with pytest.raises(TypeError, match=(
            r"dictbatch.*the batching rule returned.*tuple of 2.*"
            r"outs is a dict.*'cube', 'double'.*same keys")):
        f(xs)
    # out_axes as a flat tuple for dict outs: which axis is whose?
    op.def_batching_rule(lambda args, axes, *, outs: (
        {"double": 2 * args[0], "cube": (args[0] ** 3).T}, (0, 1)))
    with pytest.raises(TypeError, match=(
            r"dictbatch.*out_axes \(0, 1\).*outs is a dict.*same keys")):
        f(xs)
    op.def_batching_rule(lambda args, axes, *, outs: (
        {"double": 2 * args[0], "cube": (args[0] ** 3).T},
        {"double": 0, "cube": 1}))
    y = f(xs)
    np.testing.assert_allclose(y["double"], 2 * xs)
    np.testing.assert_allclose(y["cube"], xs ** 3)


def test_complex_tangent_or_cotangent_for_a_real_value_is_type_error():
    """A complex tangent for a real output was cast to it, its imaginary part
    dropped in silence. Refused, naming the op, the output and the dtypes."""
    op = new_op("complextangent")
    op.def_kernel(HERE, lambda *, outs: (lambda x: 3 * x), backend="jax")
    op.def_jvp_rule(lambda t, x, *, outs: (3 * t).astype(jnp.complex64),
                    per_input=True)
    x = jnp.arange(4.0, dtype=F32)
    match = (r"complextangent.*gave output 0 a tangent of dtype complex64, "
             r"but the output is float32.*jnp.real")
    with pytest.raises(TypeError, match=match):
        jax.jvp(lambda v: op(v, outs=SPEC4), (x,), (jnp.ones(4, F32),))
    with pytest.raises(TypeError, match=match):
        jax.grad(lambda v: jnp.sum(op(v, outs=SPEC4)))(x)
    # A real tangent for a complex output is exact: accepted.
    cop = new_op("complexout")
    cspec = jax.ShapeDtypeStruct((4,), jnp.complex64)
    cop.def_kernel(HERE, lambda *, outs: (lambda x: (3 * x).astype(outs.dtype)),
                   backend="jax")
    cop.def_jvp_rule(lambda t, x, *, outs: 3 * t, per_input=True)
    _, t = jax.jvp(lambda v: cop(v, outs=cspec), (x,), (jnp.ones(4, F32),))
    assert t.dtype == jnp.complex64
    np.testing.assert_allclose(t, np.full(4, 3.0))

    lin = new_op("complexcotangent")
    lin.def_kernel(HERE, lambda *, outs: (lambda x, y: x * y), backend="jax")
    lin.def_jvp_rule(None, lambda t, x, y, *, outs: lin(x, t, outs=outs))
    lin.def_transpose_rule(
        lambda ct, x, y, *, outs: (None, (x * ct).astype(jnp.complex64)))
    with pytest.raises(TypeError, match=r"complexcotangent.*gave input 1 a "
                       r"cotangent of dtype complex64, but the input is "
                       r"float32.*jnp.real"):
        jax.grad(lambda y: jnp.sum(lin(jnp.full(4, 1.5, F32), y,
                                       outs=SPEC4)))(jnp.ones(4, F32))
