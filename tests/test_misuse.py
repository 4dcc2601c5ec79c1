"""Misuse of the API: what numbax does instead of crashing, returning wrong
results, leaking or failing unclearly (docs/reliability.md, "Bad input and
misuse"; the messages are in docs/errors.md).

Each test runs in both modes (simulator in CI, real CUDA under the `gpu`
marker) unless it says otherwise; outputs are poisoned or compared against
numpy on fresh data so that a skipped write shows.
"""

import functools
import gc
import itertools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR, random_array
from shared_kernels import affine

pytestmark = pytest.mark.gpu

F32 = jnp.float32
_counter = itertools.count()


@cuda.jit
def write_first(x, out):
    if cuda.grid(1) == 0:
        x[0] = 42.0
        out[0] = 1.0


def _spec(n=8):
    return jax.ShapeDtypeStruct((n,), F32)


def _run_child(code: str, timeout=300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter in this test's mode."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
        text=True, timeout=timeout, env=dict(os.environ))


# -- crashes ----------------------------------------------------------------

def test_outs_whose_size_overflows_int64_is_value_error_not_abort():
    # Before: XLA aborted the process ("overflow in static extent product",
    # exit 134), eager and under jit, for callables and kernels alike.
    result = _run_child("""
        import jax, jax.numpy as jnp, numbax
        from numba import cuda

        @cuda.jit
        def k(x, o):
            pass

        def f(x, o, s):
            pass

        huge = jax.ShapeDtypeStruct((2**40, 2**40), jnp.float32)
        bytes_only = jax.ShapeDtypeStruct((2**62,), jnp.float32)
        x = jnp.ones(4, jnp.float32)
        cases = {
            "callable": lambda: numbax.numba_cuda_callable(f, huge)(x),
            "callable jit": lambda: jax.jit(
                numbax.numba_cuda_callable(f, huge))(x),
            "callable bytes": lambda: numbax.numba_cuda_callable(
                f, bytes_only),
            "scratch": lambda: numbax.numba_cuda_callable(
                f, jax.ShapeDtypeStruct((4,), jnp.float32), scratch=huge),
            "kernel": lambda: numbax.numba_cuda_kernel(
                k, huge, launch_dims=4)(x),
            "custom kernel": lambda: numbax.XLACustomKernel("ovf")(
                x, outs=huge),
        }
        for name, case in cases.items():
            try:
                case()
            except ValueError as exc:
                assert "more than XLA can address" in str(exc), exc
                assert "outs[0]" in str(exc) or "scratch[0]" in str(exc), exc
                print(name, "ok")
            else:
                raise AssertionError(name + ": no error")
        print("DONE")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DONE" in result.stdout
    assert "numba_cuda_callable(__main__.f)" not in result.stderr


def test_launch_dims_beyond_cuda_limits_are_refused_at_creation():
    for dims in (2**62, (2**40, 2**40), (1, 1, 2**40)):
        with pytest.raises(ValueError, match="CUDA allows at most"):
            numbax.numba_cuda_kernel(affine, _spec(), launch_dims=dims)
    with pytest.raises(ValueError, match="CUDA allows at most"):
        numbax.numba_cuda_kernel(affine, _spec(), grid=(2**40,), block=1)


def test_non_integer_extent_is_refused_not_truncated():
    def f(x, o, s):
        pass
    for extent in (4.7, 4.0, np.float32(3.5)):
        with pytest.raises(TypeError, match="non-integer extent"):
            numbax.numba_cuda_callable(
                f, jax.ShapeDtypeStruct((extent,), F32))
    with pytest.raises(TypeError, match="non-integer extent"):
        numbax.numba_cuda_kernel(
            affine, jax.ShapeDtypeStruct((2, 4.7), F32), launch_dims=4)
    # numpy integers are ints
    op = numbax.numba_cuda_callable(
        f, jax.ShapeDtypeStruct((np.int64(4),), F32))
    assert op.out_specs[0].shape == (4,)


def kept_reported(match):
    """A kept array is an error in the simulator (where reading it later can
    crash the process) and a RuntimeWarning on a GPU."""
    if SIMULATOR:
        return pytest.raises(Exception, match=match)
    return pytest.warns(RuntimeWarning, match=match)


def test_kept_output_is_reported_naming_it():
    kept = []

    def keeps(x, out, stream):
        affine[1, 8, stream](x, out)
        kept.append(out)

    op = numbax.numba_cuda_callable(keeps, _spec())
    with kept_reported("func kept a reference to its "
                       "output 0 \\(argument 1\\)"):
        jax.block_until_ready(op(jnp.ones(8, F32)))


def test_kept_view_of_input_is_reported_naming_it():
    kept = []

    def keeps_view(x, out, stream):
        affine[1, 8, stream](x, out)
        kept.append(x[2:])  # a view, not the array itself

    op = numbax.numba_cuda_callable(keeps_view, _spec())
    with kept_reported("kept a reference to its input 0"):
        jax.block_until_ready(jax.jit(op)(jnp.ones(8, F32)))


def test_kept_array_is_not_handed_to_a_later_call():
    kept = []

    def f(x, out, stream):
        affine[1, 8, stream](x, out)
        if not kept:
            kept.append(out)
        else:
            # The kept object must not come back over the next call's
            # buffer under the name func kept.
            assert all(out is not k for k in kept)

    op = jax.jit(numbax.numba_cuda_callable(f, _spec()))
    x = jnp.arange(8, dtype=F32)
    with kept_reported("func kept a reference"):
        jax.block_until_ready(op(x))
    for _ in range(3):
        np.testing.assert_allclose(op(x), 2 * np.arange(8) + 1)


def test_reference_cycle_inside_func_is_not_reported_as_kept():
    def f(x, out, stream):
        affine[1, 8, stream](x, out)
        try:
            raise RuntimeError("handled")
        except RuntimeError as exc:
            tb = exc.__traceback__  # frame <-> traceback cycle holding x
        assert tb is not None

    gc.disable()  # only numbax's own collection may break the cycle
    try:
        y = numbax.numba_cuda_callable(f, _spec())(jnp.ones(8, F32))
        np.testing.assert_allclose(y, np.full(8, 3.0))
    finally:
        gc.enable()


@pytest.mark.usefixtures("simulator_only")
def test_kept_view_of_large_buffer_does_not_crash_the_process():
    # Before: a view of a large buffer kept by func and read after the call
    # segfaulted (exit 139) in the simulator.
    result = _run_child("""
        import jax, jax.numpy as jnp, numpy as np, numbax
        kept = []
        def f(x, out, stream):
            kept.append(x[1:])
        n = 1 << 24
        op = numbax.numba_cuda_callable(
            f, jax.ShapeDtypeStruct((4,), jnp.float32))
        try:
            jax.block_until_ready(op(jnp.ones(n, jnp.float32)))
        except Exception as exc:
            assert "func kept a reference to its input 0" in str(exc), exc
            print("ERROR NAMED")
        # the process goes on working
        ok = numbax.numba_cuda_callable(
            lambda x, o, s: None, jax.ShapeDtypeStruct((4,), jnp.float32))
        jax.block_until_ready(ok(jnp.ones(n, jnp.float32)))
        print("DONE")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ERROR NAMED" in result.stdout and "DONE" in result.stdout


# -- silent wrong results -----------------------------------------------------

@pytest.mark.usefixtures("simulator_only")
def test_simulator_inputs_are_read_only_and_the_error_names_the_input():
    def writes_input(x, y, out, stream):
        write_first[1, 8, stream](y, out)

    op = numbax.numba_cuda_callable(writes_input, _spec())
    x, y = jnp.ones(8, F32), jnp.zeros(8, F32)
    with pytest.raises(Exception, match="func wrote to input 1, which is "
                       "read-only"):
        jax.block_until_ready(op(x, y))
    np.testing.assert_array_equal(y, np.zeros(8))  # unchanged

    def writes_host_side(x, out, stream):
        x[0] = 5  # a write outside a kernel too

    with pytest.raises(Exception, match="func wrote to input 0"):
        jax.block_until_ready(
            numbax.numba_cuda_callable(writes_host_side, _spec())(x))
    kernel_op = numbax.numba_cuda_kernel(write_first, _spec(), launch_dims=8)
    with pytest.raises(Exception, match="func wrote to input 0"):
        jax.block_until_ready(kernel_op(x))
    np.testing.assert_array_equal(x, np.ones(8))


@cuda.jit
def double_first_8(x, out):
    i = cuda.grid(1)
    if i < 8:
        out[i] = x[i] * 2


# Views of a (4, 4) input, each holding 8 of its elements; numpy computes
# the same view of the input's values for the expected result.
_INPUT_VIEWS = {
    "reshape-then-slice": lambda y: y.reshape(y.size)[:8],
    "ravel-then-slice": lambda y: y.ravel()[8:],
    "strided": lambda y: y.reshape(16)[::2],
    "view-then-reshape": lambda y: y.view(np.float32)[1:3].reshape(8),
    "squeeze": lambda y: y[None].squeeze()[2:].reshape(8),
    "bound-to-a-stream": lambda y: (
        y.bind(0) if hasattr(y, "bind") else y)[:2].reshape(8),
    "transposed": lambda y: y.T.reshape(16)[8:],
    "np.asarray": lambda y: np.asarray(y).reshape(16)[4:12],
}


@pytest.mark.usefixtures("simulator_only")
@pytest.mark.parametrize("view", list(_INPUT_VIEWS))
def test_simulator_kernels_read_inputs_through_views(view, rng):
    # Issue 38, item 6: a func passing a reshaped or sliced input to a
    # kernel failed with "ValueError: assignment destination is read-only":
    # the view was a bare numpy array, which Numba's simulator copies to a
    # device array and back after the launch, into the read-only input.
    make = _INPUT_VIEWS[view]

    def func(y, out, stream):
        double_first_8[1, 8, stream](make(y), out)

    op = numbax.numba_cuda_callable(
        func, _spec(), name=f"test_misuse.input_view.{view}")
    data = random_array(rng, (4, 4), np.float32)
    expected = 2 * make(data.copy())
    np.testing.assert_array_equal(jax.jit(op)(jnp.asarray(data)), expected)
    np.testing.assert_array_equal(op(jnp.asarray(data)), expected)


@pytest.mark.usefixtures("simulator_only")
@pytest.mark.parametrize("view", ["reshape-then-slice", "ravel-then-slice",
                                  "strided", "np.asarray"])
def test_simulator_kernel_writing_an_input_view_names_the_input(view):
    make = _INPUT_VIEWS[view]

    def func(x, y, out, stream):
        write_first[1, 8, stream](make(y), out)

    op = numbax.numba_cuda_callable(
        func, _spec(), name=f"test_misuse.input_view_write.{view}")
    x, y = jnp.ones(8, F32), jnp.zeros((4, 4), F32)
    with pytest.raises(Exception, match="func wrote to input 1, which is "
                       "read-only.*input_output_aliases"):
        jax.block_until_ready(op(x, y))
    np.testing.assert_array_equal(y, np.zeros((4, 4)))  # unchanged


@pytest.mark.usefixtures("simulator_only")
def test_simulator_host_copy_of_an_input_is_funcs_own(rng):
    # A copy of an input (copy_to_host, astype) is func's to write: before,
    # it refused writes with a false "func wrote to input 0".
    def func(y, out, stream):
        h = y.copy_to_host()
        h[0] = 100.0
        double_first_8[1, 8, stream](h, out)

    op = numbax.numba_cuda_callable(
        func, _spec(), name="test_misuse.input_host_copy")
    data = random_array(rng, (8,), np.float32)
    expected = 2 * data
    expected[0] = 200.0
    np.testing.assert_array_equal(op(jnp.asarray(data)), expected)


def test_aliased_input_stays_writable(rng):
    def bump(x, out, stream):
        write_first[1, 8, stream](x, out)  # writes x[0] = 42 in place

    op = numbax.numba_cuda_callable(bump, _spec(),
                                    input_output_aliases={0: 0})
    data = random_array(rng, (8,), np.float32)
    y = jax.jit(op, donate_argnums=0)(jnp.asarray(data))
    expected = data.copy()
    expected[0] = 1.0  # out[0] = 1 after x[0] = 42: the same buffer
    np.testing.assert_array_equal(y, expected)


def test_check_inputs_mode_names_the_modified_input(monkeypatch):
    monkeypatch.setenv("NUMBAX_CHECK_INPUTS", "1")

    if SIMULATOR:
        def writes_input(x, y, out, stream):
            # The simulator's inputs are read-only; go around that to reach
            # the write a GPU func could make.
            a = y._ary
            a.flags.writeable = True
            np.ndarray.__setitem__(a, 0, 42.0)
            affine[1, 8, stream](x, out)
    else:
        def writes_input(x, y, out, stream):
            write_first[1, 8, stream](y, out)

    op = numbax.numba_cuda_callable(writes_input, _spec())
    with pytest.raises(Exception, match="func modified input 1 \\(found by "
                       "NUMBAX_CHECK_INPUTS=1\\)"):
        jax.block_until_ready(op(jnp.ones(8, F32), jnp.zeros(8, F32)))

    def clean(x, y, out, stream):
        affine[1, 8, stream](x, out)
    checked = numbax.numba_cuda_callable(clean, _spec())
    y = jax.jit(checked)(jnp.arange(8, dtype=F32), jnp.zeros(8, F32))
    np.testing.assert_allclose(y, 2 * np.arange(8) + 1)
    plain = numbax.numba_cuda_callable(clean, _spec())
    monkeypatch.delenv("NUMBAX_CHECK_INPUTS")
    assert numbax.numba_cuda_callable(clean, _spec())._called is clean
    assert plain._called is not clean  # read when the op is created


def test_has_side_effect_calls_are_neither_merged_nor_dropped():
    calls = []

    def counter(x, out, stream):
        calls.append(1)
        affine[1, 8, stream](x, out)

    x = jnp.ones(8, F32)
    for flag, expected in ((False, 1), (True, 3)):
        calls.clear()
        op = numbax.numba_cuda_callable(counter, _spec(),
                                        has_side_effect=flag)
        a, b = jax.jit(lambda v: (op(v), op(v)))(x)  # noqa: B023
        jax.block_until_ready((a, b))
        # the result is unused: only has_side_effect keeps the call
        jax.block_until_ready(jax.jit(lambda v: (op(v), v)[1])(x))  # noqa: B023
        assert len(calls) == expected, flag
        np.testing.assert_allclose(a, np.full(8, 3.0))
    with pytest.raises(TypeError, match="has_side_effect must be True or "
                       "False"):
        numbax.numba_cuda_callable(counter, _spec(), has_side_effect="yes")


def test_has_side_effect_with_batch_partitionable():
    calls = []

    def counter(x, out, stream):
        calls.append(1)
        affine[1, 8, stream](x, out)

    op = numbax.numba_cuda_callable(counter, _spec(), has_side_effect=True,
                                    batch_partitionable=True)
    jax.block_until_ready(jax.jit(lambda v: (op(v), op(v), v)[2])(
        jnp.ones(8, F32)))
    assert len(calls) == 2


def _custom_op():
    op = numbax.XLACustomKernel(f"test_rel2_{next(_counter)}")
    op.def_numba_cuda_kernel(lambda *, outs: numbax.numba_cuda_kernel(
        affine, outs, launch_dims=outs.shape[0]))
    return op


def test_batching_rule_with_wrong_shape_is_refused():
    op = _custom_op()

    @op.def_batching_rule
    def rule(args, axes, *, outs):
        return jnp.zeros((2, 4), F32), 0  # outs is (8,): needs (2, 8)

    f = lambda x: op(x, outs=_spec(8))  # noqa: E731
    with pytest.raises(TypeError, match="batching rule returned output 0 of "
                       "shape \\(2, 4\\).*makes that \\(2, 8\\)"):
        jax.vmap(f)(jnp.ones((2, 8), F32))

    @op.def_batching_rule
    def rule_axis1(args, axes, *, outs):
        x = jnp.moveaxis(args[0], axes[0], 0)
        return (2 * x + 1).T, 1  # a correct rule with out_axes=1

    xs = np.arange(16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_allclose(jax.vmap(f)(xs), 2 * xs + 1)


# -- leaks ----------------------------------------------------------------------

def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                    reason="needs /proc")
def test_kernel_recreated_per_call_shares_one_compiled_op():
    def my_op(v):
        return numbax.numba_cuda_kernel(affine, _spec(), launch_dims=8)(v)

    x = jnp.arange(8, dtype=F32)
    assert numbax.numba_cuda_kernel(affine, _spec(), launch_dims=8) is \
        numbax.numba_cuda_kernel(affine, _spec(), launch_dims=8)
    assert numbax.numba_cuda_kernel(affine, _spec(), launch_dims=8) is not \
        numbax.numba_cuda_kernel(affine, _spec(), launch_dims=8,
                                 threads_per_block=128)
    for _ in range(20):  # warm up
        jax.block_until_ready(my_op(x))
    size, rss = numbax.registry_size(), _rss_mb()
    for _ in range(300):
        y = my_op(x)
    np.testing.assert_allclose(y, 2 * np.arange(8) + 1)
    assert numbax.registry_size() == size
    # Before: about 1.4 MB per call (one compiled program each).
    assert _rss_mb() - rss < 30


# -- unclear errors ----------------------------------------------------------

def test_expand_dims_with_unbatched_aliased_input_broadcasts_it(rng):
    @cuda.jit
    def add_into(acc, x, out):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            out[i, j] = acc[i, j] + x[i, j]

    def f(acc, x, out, stream):
        # expand_dims: 2-D arrays under vmap, 1-D otherwise
        n = out.shape[out.ndim - 1]
        a2, x2, o2 = (a.reshape(a.size // n, n) for a in (acc, x, out))
        add_into[(o2.shape[0], 1), (1, o2.shape[1]), stream](a2, x2, o2)

    op = numbax.numba_cuda_callable(f, _spec(4), vmap_method="expand_dims",
                                    input_output_aliases={0: 0})
    acc = random_array(rng, (4,), np.float32)
    xs = random_array(rng, (3, 4), np.float32)
    out = jax.jit(jax.vmap(op, in_axes=(None, 0)))(jnp.asarray(acc), xs)
    np.testing.assert_allclose(out, acc[None] + xs, rtol=1e-6)
    out = jax.vmap(op, in_axes=(None, 0))(jnp.asarray(acc), xs)
    np.testing.assert_allclose(out, acc[None] + xs, rtol=1e-6)


def test_batch_partitionable_with_legacy_vectorized_is_refused_at_creation():
    with pytest.raises(ValueError, match="legacy_vectorized"):
        numbax.numba_cuda_callable(lambda x, o, s: None, _spec(),
                                   batch_partitionable=True,
                                   vmap_method="legacy_vectorized")


def test_functools_wraps_star_args_wrapper_is_accepted():
    def launch(x, out, stream):
        affine[1, 8, stream](x, out)

    @functools.wraps(launch)
    def wrapper(*args):
        return launch(*args)

    y = numbax.numba_cuda_callable(wrapper, _spec())(jnp.ones(8, F32))
    np.testing.assert_allclose(y, np.full(8, 3.0))

    @functools.wraps(launch)
    def too_few(x):
        return None
    with pytest.raises(TypeError, match="cannot take them"):
        numbax.numba_cuda_callable(too_few, _spec())(jnp.ones(8, F32))


@pytest.mark.parametrize("bad", [None, {"x": 1.0}, "text"])
def test_non_array_input_names_the_op(bad):
    def f(x, out, stream):
        pass
    with pytest.raises(TypeError, match="numba_cuda_callable\\(.*f\\): "
                       "input 0"):
        numbax.numba_cuda_callable(f, _spec())(bad)
    with pytest.raises(TypeError, match="numba_cuda_kernel\\(.*affine\\): "
                       "input 0"):
        numbax.numba_cuda_kernel(affine, _spec(), launch_dims=8)(bad)
    op = _custom_op()
    with pytest.raises(TypeError, match=f"{op.name}.*input 0"):
        op(bad, outs=_spec())


def test_rules_with_wrong_signature_name_the_op():
    op = _custom_op()
    op.def_jvp_rule(lambda t: t)  # missing the primals and outs=
    with pytest.raises(TypeError, match=f"{op.name}.*the JVP rule"
                       ".*cannot take the arguments"):
        jax.jvp(lambda x: op(x, outs=_spec()), (jnp.ones(8, F32),),
                (jnp.ones(8, F32),))
    op2 = _custom_op()
    op2.def_batching_rule(lambda args, axes: None)  # no outs=
    with pytest.raises(TypeError, match=f"{op2.name}.*the batching rule"
                       ".*cannot take the arguments"):
        jax.vmap(lambda x: op2(x, outs=_spec()))(jnp.ones((2, 8), F32))


def test_exception_with_lone_surrogate_keeps_its_traceback():
    def raises(x, out, stream):
        raise ValueError("bad \udc80 byte")

    with pytest.raises(Exception) as info:
        jax.block_until_ready(
            numbax.numba_cuda_callable(raises, _spec())(jnp.ones(8, F32)))
    text = str(info.value)
    assert "Traceback" in text and "in raises" in text
    assert "bad \\udc80 byte" in text


def test_graph_cache_size_out_of_range_is_value_error():
    before = numbax.graph_cache_size()
    for bad in (10**30, 2**31, 0, -1, 2.0, True):
        with pytest.raises(ValueError, match="graph cache size"):
            numbax.set_graph_cache_size(bad)
    assert numbax.graph_cache_size() == before


def test_grad_of_callable_names_the_users_op():
    def launch(x, out, stream):
        affine[1, 8, stream](x, out)

    op = numbax.numba_cuda_callable(launch, _spec())
    loss = lambda v: op(v).sum()  # noqa: E731
    for g in (jax.grad(loss), jax.grad(jax.jit(loss)),
              jax.jit(jax.grad(loss))):
        with pytest.raises(ValueError, match="numba_cuda_callable\\(.*"
                           "launch\\) cannot be differentiated"):
            g(jnp.ones(8, F32))
    # a derivative that does not flow through the op is fine
    w = jnp.float32(3.0)
    grad = jax.grad(lambda w: (w * op(jnp.ones(8, F32))).sum())(w)
    np.testing.assert_allclose(grad, 24.0)
    x = jnp.ones(8, F32)
    grad = jax.grad(lambda v: (op(jax.lax.stop_gradient(v)) * v).sum())(x)
    np.testing.assert_allclose(grad, np.full(8, 3.0))


@pytest.mark.usefixtures("simulator_only")
def test_check_inputs_setting_is_per_op_and_survives_a_rebuilt_entry(
        monkeypatch):
    # Before: ops of one func shared the first op's entry (so an op created
    # with NUMBAX_CHECK_INPUTS=1 could run unchecked), and an entry rebuilt
    # from the key (a deserialised program) called the bare func.
    from numbax import _registry

    def g(x, out, stream):
        affine[1, 8, stream](x, out)

    x = jnp.ones(8, F32)
    monkeypatch.delenv("NUMBAX_CHECK_INPUTS", raising=False)
    plain = numbax.numba_cuda_callable(g, _spec())
    monkeypatch.setenv("NUMBAX_CHECK_INPUTS", "1")
    checked = numbax.numba_cuda_callable(g, _spec())
    assert checked._called is not g and plain._called is g
    keys = {}
    for op in (plain, checked):
        np.testing.assert_allclose(jax.jit(op)(x), np.full(8, 3.0))
        keys[op] = op._key([x])
        assert _registry._entries[keys[op]].func_ref() is op._called
    assert keys[plain] != keys[checked]
    # As a process that only created the ops finds the key:
    del _registry._entries[keys[checked]]
    _registry._memo.clear()
    resolved = _registry._resolve_callable(keys[checked], "cpu")[0]
    assert getattr(resolved, "__wrapped__", resolved) is checked._called


# -- found by the closing hostile pass ---------------------------------------

def test_batch_partitionable_must_be_a_bool():
    # "no" is truthy: it used to switch the feature on.
    with pytest.raises(TypeError, match="batch_partitionable must be True or "
                       "False, got str: 'no'"):
        numbax.numba_cuda_callable(lambda x, o, s: None,
                                   jax.ShapeDtypeStruct((4,), F32),
                                   batch_partitionable="no")


def test_non_native_byte_order_names_the_byte_order():
    with pytest.raises(ValueError, match=r"outs\[0\] has dtype >f4 \(float32 "
                       r"in non-native byte order\).*np.dtype\('float32'\)"):
        numbax.numba_cuda_callable(lambda x, o, s: None,
                                   jax.ShapeDtypeStruct((8,), np.dtype(">f4")))


def test_output_rank_above_the_call_frame_limit_is_refused_at_creation():
    # It used to be accepted, then fail at run time in the C++ decoder.
    with pytest.raises(ValueError, match="has 33 dimensions.*at most 32"):
        numbax.numba_cuda_callable(lambda x, o, s: None,
                                   jax.ShapeDtypeStruct((1,) * 33, F32))
    numbax.numba_cuda_callable(lambda x, o, s: None,
                               jax.ShapeDtypeStruct((1,) * 32, F32))
