"""What goes wrong while XLA runs a program, and what numbax does about it.

A callable's func runs inside XLA's execution: an exception it raises (its
own, Numba's, a kernel's in the simulator) or a value it returns arrives as
jax.errors.JaxRuntimeError with func's exception type, message and
traceback; a JAX call made from func fails clearly instead of deadlocking;
an array func keeps after it returns is reported naming it, never handed
to a later call; an input func writes is refused in the simulator and
named by NUMBAX_CHECK_INPUTS on a GPU; ``has_side_effect`` calls are
neither merged nor dropped; and a program naming an op this process does
not have fails naming the key. Each test runs in both modes (simulator in
CI, real CUDA under the `gpu` marker) unless it says otherwise; outputs are
poisoned or compared against numpy on fresh data so that a skipped write
shows. Errors found before anything runs: test_errors.py.
"""

import faulthandler
import gc
import threading

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR, f32_spec, random_array, run_child
from shared_kernels import adds_text, affine, launch_affine

pytestmark = pytest.mark.gpu

F32 = jnp.float32
SPEC = jax.ShapeDtypeStruct((4,), F32)
RuntimeFailure = jax.errors.JaxRuntimeError


def run(fn, *args):
    return jax.block_until_ready(fn(*args))


@pytest.fixture
def no_deadlock():
    """Fails the run (dumping every thread's stack) instead of hanging CI if
    the test deadlocks; pytest-timeout is not a dependency."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# -- func fails while XLA runs it -------------------------------------------

def test_func_raises_python_error():
    def op(x, out, stream):
        raise ZeroDivisionError("planted failure 7")

    fn = numbax.numba_cuda_callable(op, SPEC, name="errors.raises")
    for f in (fn, jax.jit(fn)):
        with pytest.raises(RuntimeFailure) as info:
            run(f, jnp.ones(4))
        message = str(info.value)
        assert "numbax op 'errors.raises/" in message
        assert "func raised" in message and "Traceback" in message
        assert "ZeroDivisionError: planted failure 7" in message
        assert "test_run_time_errors.py" in message  # the user's frame is shown


@numba.njit
def _typing_error(x):
    return x + "text"  # no int + str in nopython mode


@numba.njit
def _compile_error(x):
    import os  # noqa: F401  (an unsupported opcode in nopython mode)
    return x


@pytest.mark.parametrize("helper, error", [
    (_typing_error, "numba.core.errors.TypingError"),
    (_compile_error, "numba.core.errors.UnsupportedBytecodeError"),
], ids=["typing", "compile"])
def test_func_numba_error(helper, error):
    # A Numba typing or compile error inside func (here a CPU njit helper,
    # which compiles the same way with or without a GPU).
    def op(x, out, stream):
        helper(1)

    fn = numbax.numba_cuda_callable(op, SPEC)
    with pytest.raises(RuntimeFailure, match=f"(?s)func raised.*{error}"):
        run(jax.jit(fn), jnp.ones(4))
    # The failure is not cached: the next call compiles and fails again.
    with pytest.raises(RuntimeFailure, match=error):
        run(fn, jnp.ones(4))


def test_cuda_kernel_typing_error_inside_func(gpu_only):
    def op(x, out, stream):
        adds_text[1, 32, stream](x, out)

    fn = numbax.numba_cuda_callable(op, SPEC)
    with pytest.raises(RuntimeFailure, match="(?s)func raised.*TypingError"):
        run(jax.jit(fn), jnp.ones(4))


def test_simulated_kernel_error_surfaces(simulator_only):
    # On the CPU numba_cuda_kernel runs through the simulator, where a
    # kernel's Python error (here an out-of-bounds write) surfaces too.
    @cuda.jit
    def oob(x, out):
        out[cuda.grid(1) + 100] = 1

    op = numbax.numba_cuda_kernel(oob, SPEC, launch_dims=4)
    with pytest.raises(RuntimeFailure, match="(?s)func raised.*IndexError"):
        run(jax.jit(op), jnp.ones(4))


def test_func_returns_a_value():
    def op(x, out, stream):
        launch_affine(x, out, stream)
        return out

    fn = numbax.numba_cuda_callable(op, SPEC)
    with pytest.raises(RuntimeFailure, match="func returned a value; it must "
                                             "write its results into the "
                                             "output arrays .* return None"):
        run(jax.jit(fn), jnp.ones(4))


def test_exception_with_lone_surrogate_keeps_its_traceback():
    def raises(x, out, stream):
        raise ValueError("bad \udc80 byte")

    with pytest.raises(Exception) as info:
        jax.block_until_ready(
            numbax.numba_cuda_callable(raises, f32_spec())(jnp.ones(8, F32)))
    text = str(info.value)
    assert "Traceback" in text and "in raises" in text
    assert "bad \\udc80 byte" in text


# -- func calls JAX: a clear error, never a deadlock ------------------------

GUARD_MESSAGE = (r"(?s)func raised.*RuntimeError: numbax: func called JAX "
                 r"\({}\) while XLA is running it.*Do the JAX work outside "
                 r"func.*or pass the arrays func needs in as inputs")


_captured = jnp.arange(3.0)


_warm_jit = jax.jit(lambda a: a * 2)


_warm_jit(_captured)  # its C++ fast path is warm before func calls it


JAX_CALLS = {
    # jnp functions are jitted themselves: they fail at their jit.
    "eager-jnp": (lambda: jnp.sin(jnp.ones(3)), r"\w+"),
    "captured-array": (lambda: _captured + 1, "jit"),
    "device_put": (lambda: jax.device_put(np.ones(3)), "device_put"),
    "fresh-jit": (lambda: jax.jit(lambda a: a + 1)(np.ones(3)), "jit"),
    "warm-jit": (lambda: _warm_jit(_captured), "jit"),
}


@pytest.mark.parametrize("call", list(JAX_CALLS))
@pytest.mark.parametrize("outer", ["eager", "jit"])
def test_func_calls_jax(no_deadlock, call, outer):
    jax_call, primitive = JAX_CALLS[call]

    def op(x, out, stream):
        jax_call()
        launch_affine(x, out, stream)

    fn = numbax.numba_cuda_callable(op, SPEC)
    f = jax.jit(fn) if outer == "jit" else fn
    with pytest.raises(RuntimeFailure,
                       match=GUARD_MESSAGE.format(primitive)):
        run(f, jnp.ones(4))
    # JAX works afterwards, on this thread and in new programs.
    from jax._src import core
    assert core.trace_ctx.trace is core.eval_trace
    np.testing.assert_allclose(_warm_jit(_captured), [0, 2, 4])
    np.testing.assert_allclose(jnp.cos(jnp.zeros(2)), [1, 1])


def test_func_calls_jax_in_capture_mode(no_deadlock):
    def op(x, out, stream):
        jnp.ones(3)

    fn = numbax.numba_cuda_callable(op, SPEC, capture=True)
    with pytest.raises(RuntimeFailure, match="func called JAX"):
        run(jax.jit(fn), jnp.ones(4))


def test_func_that_catches_the_guard_error_still_works(no_deadlock):
    seen = []

    def op(x, out, stream):
        try:
            jnp.ones(3)
        except RuntimeError as exc:
            seen.append(str(exc))
        launch_affine(x, out, stream)

    fn = numbax.numba_cuda_callable(op, SPEC)
    np.testing.assert_array_equal(run(jax.jit(fn), jnp.ones(4)), [3, 3, 3, 3])
    assert seen and "func called JAX" in seen[0]


def test_func_may_read_numpy_and_host_copies_of_jax_arrays(no_deadlock):
    # Reading a JAX array that is already computed is no dispatch: allowed.
    weights = np.asarray(jnp.arange(4.0))
    seen = []

    def op(x, out, stream):
        seen.append(np.asarray(_captured).sum() + weights.sum())
        launch_affine(x, out, stream)

    fn = numbax.numba_cuda_callable(op, SPEC)
    run(jax.jit(fn), jnp.ones(4))
    assert seen == [9.0]


def test_guard_is_active_on_this_jax():
    from numbax.runtime import guard
    assert guard.install()
    pairs = guard.guard_pairs()
    # (swap, value) pairs: two C++ config swaps on jax >= 0.10, one Python
    # swap of the TracingContext on jax 0.8 - 0.9.
    from jax._src import core
    assert len(pairs) == (4 if hasattr(core, "trace_state_strong_ref") else 2)
    assert all(callable(swap) for swap in pairs[::2])


def test_func_calls_jax_from_several_threads(no_deadlock):
    def op(x, out, stream):
        jnp.ones(3)

    fn = jax.jit(numbax.numba_cuda_callable(op, SPEC))
    errors = []

    def worker():
        for _ in range(5):
            try:
                run(fn, jnp.ones(4))
            # Racing threads may get jaxlib's ValueError: docs/errors.md.
            except (RuntimeFailure, ValueError) as exc:
                errors.append("func called JAX" in str(exc))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [True] * 15


# -- arrays func keeps after it returns -------------------------------------

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

    op = numbax.numba_cuda_callable(keeps, f32_spec())
    with kept_reported("func kept a reference to its "
                       "output 0 \\(argument 1\\)"):
        jax.block_until_ready(op(jnp.ones(8, F32)))


def test_kept_slice_of_a_sequential_vmap_is_reported_naming_it():
    # A sequential vmap's func gets slices from the cache slots of its
    # slice (CallSite::SlotOf): a kept one is found there, named by its
    # place among func's arguments.
    kept = []

    def keeps(x, out, stream):
        affine[1, 8, stream](x, out)
        if len(kept) < 1:
            kept.append(out)

    op = numbax.numba_cuda_callable(keeps, f32_spec(),
                                    vmap_method="sequential")
    with kept_reported("func kept a reference to its "
                       "output 0 \\(argument 1\\)"):
        jax.block_until_ready(jax.jit(jax.vmap(op))(jnp.ones((3, 8), F32)))


def test_kept_view_of_input_is_reported_naming_it():
    kept = []

    def keeps_view(x, out, stream):
        affine[1, 8, stream](x, out)
        kept.append(x[2:])  # a view, not the array itself

    op = numbax.numba_cuda_callable(keeps_view, f32_spec())
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

    op = jax.jit(numbax.numba_cuda_callable(f, f32_spec()))
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
        y = numbax.numba_cuda_callable(f, f32_spec())(jnp.ones(8, F32))
        np.testing.assert_allclose(y, np.full(8, 3.0))
    finally:
        gc.enable()


@pytest.mark.usefixtures("simulator_only")
def test_kept_view_of_large_buffer_does_not_crash_the_process():
    # Before: a view of a large buffer kept by func and read after the call
    # segfaulted (exit 139) in the simulator.
    result = run_child("""
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


# -- inputs func writes -----------------------------------------------------

@cuda.jit
def write_first(x, out):
    if cuda.grid(1) == 0:
        x[0] = 42.0
        out[0] = 1.0


@pytest.mark.usefixtures("simulator_only")
def test_simulator_inputs_are_read_only_and_the_error_names_the_input():
    def writes_input(x, y, out, stream):
        write_first[1, 8, stream](y, out)

    op = numbax.numba_cuda_callable(writes_input, f32_spec())
    x, y = jnp.ones(8, F32), jnp.zeros(8, F32)
    with pytest.raises(Exception, match="func wrote to input 1, which is "
                       "read-only"):
        jax.block_until_ready(op(x, y))
    np.testing.assert_array_equal(y, np.zeros(8))  # unchanged

    def writes_host_side(x, out, stream):
        x[0] = 5  # a write outside a kernel too

    with pytest.raises(Exception, match="func wrote to input 0"):
        jax.block_until_ready(
            numbax.numba_cuda_callable(writes_host_side, f32_spec())(x))
    kernel_op = numbax.numba_cuda_kernel(write_first, f32_spec(), launch_dims=8)
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
    # A func passing a reshaped or sliced input to a
    # kernel failed with "ValueError: assignment destination is read-only":
    # the view was a bare numpy array, which Numba's simulator copies to a
    # device array and back after the launch, into the read-only input.
    make = _INPUT_VIEWS[view]

    def func(y, out, stream):
        double_first_8[1, 8, stream](make(y), out)

    op = numbax.numba_cuda_callable(
        func, f32_spec(), name=f"test_misuse.input_view.{view}")
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
        func, f32_spec(), name=f"test_misuse.input_view_write.{view}")
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
        func, f32_spec(), name="test_misuse.input_host_copy")
    data = random_array(rng, (8,), np.float32)
    expected = 2 * data
    expected[0] = 200.0
    np.testing.assert_array_equal(op(jnp.asarray(data)), expected)


def test_aliased_input_stays_writable(rng):
    def bump(x, out, stream):
        write_first[1, 8, stream](x, out)  # writes x[0] = 42 in place

    op = numbax.numba_cuda_callable(bump, f32_spec(),
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

    op = numbax.numba_cuda_callable(writes_input, f32_spec())
    with pytest.raises(Exception, match="func modified input 1 \\(found by "
                       "NUMBAX_CHECK_INPUTS=1\\)"):
        jax.block_until_ready(op(jnp.ones(8, F32), jnp.zeros(8, F32)))

    def clean(x, y, out, stream):
        affine[1, 8, stream](x, out)
    checked = numbax.numba_cuda_callable(clean, f32_spec())
    y = jax.jit(checked)(jnp.arange(8, dtype=F32), jnp.zeros(8, F32))
    np.testing.assert_allclose(y, 2 * np.arange(8) + 1)
    plain = numbax.numba_cuda_callable(clean, f32_spec())
    monkeypatch.delenv("NUMBAX_CHECK_INPUTS")
    assert numbax.numba_cuda_callable(clean, f32_spec())._called is clean
    assert plain._called is not clean  # read when the op is created


@pytest.mark.usefixtures("simulator_only")
def test_check_inputs_setting_is_per_op_and_survives_a_rebuilt_entry(
        monkeypatch):
    # Before: ops of one func shared the first op's entry (so an op created
    # with NUMBAX_CHECK_INPUTS=1 could run unchecked), and an entry rebuilt
    # from the key (a deserialised program) called the bare func.
    from numbax.runtime import registry

    def g(x, out, stream):
        affine[1, 8, stream](x, out)

    x = jnp.ones(8, F32)
    monkeypatch.delenv("NUMBAX_CHECK_INPUTS", raising=False)
    plain = numbax.numba_cuda_callable(g, f32_spec())
    monkeypatch.setenv("NUMBAX_CHECK_INPUTS", "1")
    checked = numbax.numba_cuda_callable(g, f32_spec())
    assert checked._called is not g and plain._called is g
    keys = {}
    for op in (plain, checked):
        np.testing.assert_allclose(jax.jit(op)(x), np.full(8, 3.0))
        keys[op] = op._key([x])
        assert registry._entries[keys[op]].func_ref() is op._called
    assert keys[plain] != keys[checked]
    # As a process that only created the ops finds the key:
    del registry._entries[keys[checked]]
    registry._memo.clear()
    resolved = registry._resolve_callable(keys[checked], "cpu")[0]
    assert getattr(resolved, "__wrapped__", resolved) is checked._called


# -- func does more than write its outputs: has_side_effect ----------------

def test_has_side_effect_calls_are_neither_merged_nor_dropped():
    calls = []

    def counter(x, out, stream):
        calls.append(1)
        affine[1, 8, stream](x, out)

    x = jnp.ones(8, F32)
    for flag, expected in ((False, 1), (True, 3)):
        calls.clear()
        op = numbax.numba_cuda_callable(counter, f32_spec(),
                                        has_side_effect=flag)
        a, b = jax.jit(lambda v: (op(v), op(v)))(x)  # noqa: B023
        jax.block_until_ready((a, b))
        # the result is unused: only has_side_effect keeps the call
        jax.block_until_ready(jax.jit(lambda v: (op(v), v)[1])(x))  # noqa: B023
        assert len(calls) == expected, flag
        np.testing.assert_allclose(a, np.full(8, 3.0))
    with pytest.raises(TypeError, match="has_side_effect must be True or "
                       "False"):
        numbax.numba_cuda_callable(counter, f32_spec(), has_side_effect="yes")


def test_has_side_effect_with_batch_partitionable():
    calls = []

    def counter(x, out, stream):
        calls.append(1)
        affine[1, 8, stream](x, out)

    op = numbax.numba_cuda_callable(counter, f32_spec(), has_side_effect=True,
                                    batch_partitionable=True)
    jax.block_until_ready(jax.jit(lambda v: (op(v), op(v), v)[2])(
        jnp.ones(8, F32)))
    assert len(calls) == 2


# -- programs that name ops this process does not have ---------------------

def test_program_with_unregistered_key():
    def program(v):
        return jax.ffi.ffi_call("numbax_callable", SPEC)(v, key="no.such/op")

    for f in (program, jax.jit(program)):
        with pytest.raises(RuntimeFailure,
                           match="numbax callable 'no.such/op' is not "
                                 "registered in this process. Create the "
                                 "same op"):
            run(f, jnp.ones(4))


def test_kernel_program_with_unregistered_key(gpu_only):
    def program(v):
        return jax.ffi.ffi_call("numbax_kernel", SPEC)(v, key="no.such/kernel")

    with pytest.raises(RuntimeFailure,
                       match="numbax kernel 'no.such/kernel' is not "
                             "registered in this process"):
        run(jax.jit(program), jnp.ones(4))
