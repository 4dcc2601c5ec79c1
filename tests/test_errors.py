"""The bad-input matrix: every misuse gives its exact error type and a message
that names the fix. docs/errors.md lists each row with its test here.

Errors found when an op is created or traced are Python exceptions raised at
the call; errors found while XLA runs the program arrive as
jax.errors.JaxRuntimeError carrying func's exception type, message and
traceback.
"""

import faulthandler
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numba
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR
from shared_kernels import affine

pytestmark = pytest.mark.gpu

F32 = jnp.float32
SPEC = jax.ShapeDtypeStruct((4,), F32)
RuntimeFailure = jax.errors.JaxRuntimeError


def affine_op(x, out, stream):
    affine[1, 32, stream](x, out)


def noop(x, out, stream):
    pass


def run(fn, *args):
    return jax.block_until_ready(fn(*args))


@pytest.fixture
def no_deadlock():
    """Fails the run (dumping every thread's stack) instead of hanging CI if
    the test deadlocks; pytest-timeout is not a dependency."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# -- creating an op ---------------------------------------------------------

@pytest.mark.parametrize("func", [3, None, "affine_op"])
def test_func_not_callable(func):
    with pytest.raises(TypeError, match="func must be callable.*pass the "
                                        "Python function"):
        numbax.numba_cuda_callable(func, SPEC)


@pytest.mark.parametrize("outs, match", [
    (None, "must be a jax.ShapeDtypeStruct or a sequence/pytree"),
    ([], "must be a jax.ShapeDtypeStruct or a sequence/pytree"),
    (4, r"outs\[0\] must be a jax.ShapeDtypeStruct"),
    ("float32", r"outs\[0\] must be a jax.ShapeDtypeStruct"),
    ((4, 2), r"not a bare shape \(4, 2\): write jax.ShapeDtypeStruct"),
    ([SPEC, object()], r"outs\[1\] must be a jax.ShapeDtypeStruct"),
], ids=["None", "empty", "int", "str", "shape", "object"])
def test_outs_not_shape_dtype_struct(outs, match):
    with pytest.raises(TypeError, match=match):
        numbax.numba_cuda_callable(noop, outs)
    with pytest.raises(TypeError, match=match):
        numbax.numba_cuda_kernel(affine, outs, launch_dims=4)


def test_scratch_not_shape_dtype_struct():
    with pytest.raises(TypeError, match=r"scratch\[0\] must be a "
                                        "jax.ShapeDtypeStruct"):
        numbax.numba_cuda_callable(noop, SPEC, scratch=5)


def test_non_static_output_shape():
    class Spec:
        shape, dtype = (object(),), np.float32
    with pytest.raises(TypeError, match="non-static shape.*concrete shapes"):
        numbax.numba_cuda_callable(noop, Spec())


def test_negative_output_dimension():
    with pytest.raises(ValueError, match="negative dimension"):
        numbax.numba_cuda_callable(noop, jax.ShapeDtypeStruct((4, -1), F32))


# Sub-byte types (float8 is accepted, as uint8 bits: tests/test_float8.py).
UNSUPPORTED = [jnp.int4, jnp.uint4] + [
    getattr(ml_dtypes, n) for n in ("int2", "uint2", "float4_e2m1fn")
    if hasattr(ml_dtypes, n)]


@pytest.mark.parametrize("dtype", UNSUPPORTED, ids=lambda d: np.dtype(d).name)
def test_unsupported_output_dtype(dtype):
    spec = jax.ShapeDtypeStruct((4,), dtype)
    with pytest.raises(ValueError, match=r"outs\[0\] has dtype .*cannot use"
                                         r".*convert with \.astype"):
        numbax.numba_cuda_callable(noop, spec)
    with pytest.raises(ValueError, match=r"convert with \.astype"):
        numbax.numba_cuda_kernel(affine, spec, launch_dims=4)


@pytest.mark.parametrize("dtype", UNSUPPORTED, ids=lambda d: np.dtype(d).name)
def test_unsupported_input_dtype(dtype):
    x = jnp.ones(4, dtype)
    with pytest.raises(ValueError, match=r"input 0 has dtype .*cannot use"
                                         r".*convert with \.astype"):
        numbax.numba_cuda_callable(noop, SPEC)(x)
    with pytest.raises(ValueError, match=r"input 0 has dtype .*\.astype"):
        numbax.numba_cuda_kernel(affine, SPEC, launch_dims=4)(x)


def test_prng_key_input():
    keys = jax.random.split(jax.random.key(0), 4)
    with pytest.raises(ValueError, match=r"dtype key<fry>.*"
                                         r"jax\.random\.key_data"):
        numbax.numba_cuda_callable(noop, SPEC)(keys)


@pytest.mark.parametrize("value", ["abc", object()], ids=["str", "object"])
def test_non_numeric_input(value):
    with pytest.raises(TypeError, match="input 0 is not an array JAX can hold"
                                        ".*Pass a numeric jax or numpy array"):
        numbax.numba_cuda_callable(noop, SPEC)(value)


@pytest.mark.parametrize("value", [jnp.float32(1.0), np.array(2.0)],
                         ids=["jax", "numpy-0d-array"])
def test_zero_d_input(value):
    # 0-d arrays (JAX's, also traced ones, and NumPy's) are buffers numbax
    # cannot hand a kernel; the message offers both fixes. (Python and
    # NumPy scalars are passed by value: tests/test_shapes_and_scalars.py.)
    both = (r"input 0 is 0-d.*pass a Python or NumPy scalar.*passes by "
            r"value.*or wrap it in a 1-d array, e.g. jnp.array\(\[value\]\)")
    with pytest.raises(ValueError, match=both):
        numbax.numba_cuda_callable(noop, SPEC)(value)
    with pytest.raises(ValueError, match=both):
        numbax.numba_cuda_kernel(affine, SPEC, launch_dims=4)(value)
    op = numbax.numba_cuda_kernel(affine, SPEC, launch_dims=4)
    with pytest.raises(ValueError, match=both):
        jax.jit(op)(value)  # a traced 0-d array


def test_zero_d_output():
    spec = jax.ShapeDtypeStruct((), F32)
    with pytest.raises(ValueError, match=r"0-d.*use shape \(1,\)"):
        numbax.numba_cuda_callable(noop, spec)
    with pytest.raises(ValueError, match=r"use shape \(1,\)"):
        numbax.numba_cuda_kernel(affine, spec, launch_dims=4)


ALIAS_CASES = [
    # (aliases, inputs, error type, match)
    ({0: 0}, [jnp.ones(5)], ValueError,
     r"input 0 \(float32\[5\]\) cannot alias output 0 \(float32\[4\]\): "
     "aliased buffers need the same shape and dtype"),
    ({0: 0}, [jnp.ones(4, jnp.int32)], ValueError,
     r"input 0 \(int32\[4\]\) cannot alias output 0.*same shape and dtype"),
    ({1: 0}, [jnp.ones(4)], ValueError,
     r"key 1 is not an input index \(there are 1 inputs\)"),
    ({-1: 0}, [jnp.ones(4)], ValueError, "key -1 is not an input index"),
    ({0: 1}, [jnp.ones(4)], ValueError,
     r"value 1 is not an output index \(there are 1 outputs\)"),
    ({0: 0, 1: 0}, [jnp.ones(4), jnp.ones(4)], ValueError,
     "two inputs alias the same output.*at most one input's buffer"),
    ({True: 0}, [jnp.ones(4), jnp.ones(4)], TypeError,
     r"key True must be an int index: the dict is \{input index: output"),
    ({0: "0"}, [jnp.ones(4)], TypeError, "value '0' must be an int index"),
    ([(0, 0)], [jnp.ones(4)], TypeError,
     r"must be a dict \{input index: output index\}"),
]


@pytest.mark.parametrize("aliases, inputs, error, match", ALIAS_CASES,
                         ids=["shape", "dtype", "input-index", "negative",
                              "output-index", "two-to-one", "bool-key",
                              "str-value", "not-a-dict"])
def test_bad_aliases(aliases, inputs, error, match):
    def func(*args):
        pass
    with pytest.raises(error, match=match):
        numbax.numba_cuda_callable(func, SPEC,
                                   input_output_aliases=aliases)(*inputs)

    @cuda.jit
    def kernel(*args):
        pass
    op = numbax.numba_cuda_kernel(kernel, SPEC, launch_dims=4,
                                  input_output_aliases=aliases)
    with pytest.raises(error, match=match):
        op(*inputs)


def test_numpy_int_aliases_are_accepted():
    @cuda.jit
    def bump(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] += 1

    def op(x, out, stream):
        bump[1, 32, stream](x, out)

    fn = numbax.numba_cuda_callable(
        op, SPEC, input_output_aliases={np.int64(0): np.int32(0)})
    np.testing.assert_array_equal(jax.jit(fn)(jnp.arange(4.0)),
                                  np.arange(4.0) + 1)


LAUNCH_CASES = [
    ({}, "needs a launch configuration: grid=..., block=... or launch_dims"),
    ({"grid": 1, "block": 4, "launch_dims": 4}, "not both"),
    ({"grid": 1}, "go together: give both"),
    ({"launch_dims": -1}, "negative extent"),
    ({"grid": 1.0, "block": 4}, "must be an int or a sequence of 1 to 3 ints"),
    ({"grid": (1, 1.5), "block": 4}, "must hold ints"),
    ({"launch_dims": (1, 2, 3, 4)}, "1 to 3 axes"),
    ({"grid": 1, "block": 2048}, "CUDA allows at most 1024 there: use "
                                 "smaller blocks and a larger grid"),
    ({"grid": 1, "block": (64, 32)}, "2048 threads; CUDA allows at most 1024 "
                                     "per block"),
    ({"grid": 1, "block": (1, 1, 128)}, "at most 64 there"),
    ({"grid": (1, 70000), "block": 32}, "at most 65535 there: use larger "
                                        "blocks, or loop inside the kernel"),
    ({"launch_dims": (16, 2_000_000)}, "at most 65535 there"),
    ({"launch_dims": 4, "threads_per_block": 2048},
     "threads_per_block must be an int from 1 to 1024"),
    ({"launch_dims": 4, "threads_per_block": 0}, "threads_per_block"),
    ({"launch_dims": 4, "shared_mem": -1}, r"shared_mem must be an int >= 0"),
    ({"launch_dims": 4, "shared_mem": 2**40}, r"below 2\*\*31"),
    ({"grid": 1, "block": 4, "vmap_method": "sequential"},
     "explicit grid cannot be combined with vmap_method"),
    # Issue 11: every ffi_call vmap_method is accepted; others name them.
    ({"launch_dims": 4, "vmap_method": "expand_dimz"},
     "vmap_method must be one of None, 'expand_dims', 'broadcast_all', "
     "'legacy_vectorized', 'sequential'; got 'expand_dimz'"),
]


@pytest.mark.parametrize("kwargs, match", LAUNCH_CASES,
                         ids=lambda v: str(v)[:40] if isinstance(v, dict)
                         else "")
def test_wrong_launch_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        numbax.numba_cuda_kernel(affine, SPEC, **kwargs)


def test_shared_mem_beyond_the_device(gpu_only):
    # Below numbax's own bound, above any device's: refused when the
    # program is compiled (the kernel is loaded then), naming the limit.
    op = numbax.numba_cuda_kernel(affine, SPEC, launch_dims=4,
                                  shared_mem=1 << 30)
    with pytest.raises(RuntimeFailure, match="shared_mem=1073741824 bytes is "
                                             "more than the device allows"):
        run(jax.jit(op), jnp.ones(4))


def test_empty_launch_is_not_a_limit_error():
    # A zero extent launches nothing (outputs are zero-filled), however big
    # the other extents are.
    op = numbax.numba_cuda_kernel(affine, SPEC, grid=(0, 70000), block=32)
    np.testing.assert_array_equal(jax.jit(op)(jnp.ones(4)), np.zeros(4))


def test_kernel_not_a_dispatcher():
    with pytest.raises(TypeError, match=r"decorated with @cuda.jit.*wrap "
                                        "plain Python launch code with "
                                        "numba_cuda_callable"):
        numbax.numba_cuda_kernel(affine_op, SPEC, launch_dims=4)


def test_kernel_is_a_device_function():
    @cuda.jit(device=True)
    def twice(v):
        return 2 * v

    with pytest.raises(TypeError, match=r"device function.*wrap it in a "
                                        "@cuda.jit kernel that calls it"):
        numbax.numba_cuda_kernel(twice, SPEC, launch_dims=4)


def test_kernel_wrong_arity():
    op = numbax.numba_cuda_kernel(affine, SPEC, launch_dims=4)
    with pytest.raises(TypeError, match=r"calls kernel\(in_0, in_1, out_0\)"
                                        ".*one parameter per input, then per "
                                        "output"):
        op(jnp.ones(4), jnp.ones(4))


def test_func_wrong_arity():
    fn = numbax.numba_cuda_callable(lambda x, out: None, SPEC)
    with pytest.raises(TypeError, match=r"calls func\(in_0, out_0, stream\)"
                                        ".*then the stream"):
        fn(jnp.ones(4))
    two = numbax.numba_cuda_callable(
        lambda a, b, c, out, stream: None, SPEC,
        scratch=jax.ShapeDtypeStruct((2,), F32))
    with pytest.raises(TypeError, match=r"func\(in_0, out_0, scratch_0, "
                                        r"stream\), 4 positional"):
        jax.jit(two)(jnp.ones(4))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"vmap_method": "bogus"}, ValueError,
     "vmap_method must be one of None, 'sequential'"),
    ({"capture": "yes"}, TypeError, "capture must be True or False"),
    ({"name": 3}, TypeError, "name must be a str"),
], ids=["vmap_method", "capture", "name"])
def test_bad_callable_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        numbax.numba_cuda_callable(noop, SPEC, **kwargs)


def test_vmap_without_vmap_method():
    fn = numbax.numba_cuda_callable(noop, SPEC)
    with pytest.raises(NotImplementedError, match="vmap_method"):
        jax.vmap(fn)(jnp.ones((3, 4)))


@pytest.mark.parametrize("kwargs", [
    {}, {"vmap_method": "sequential"},
    {"vmap_method": "expand_dims", "input_output_aliases": {0: 0}},
    {"vmap_method": "expand_dims", "batch_partitionable": True}],
    ids=["no-vmap_method", "sequential", "aliased", "partitionable"])
@pytest.mark.parametrize("outer", ["eager", "jit", "vmap"])
def test_linear_transpose_of_a_callable_names_the_op(kwargs, outer):
    """Before: JAX's refusal named its own internals ('custom_vmap_call',
    'The FFI call to `numbax_callable`', 'numbax_callable_batch')."""
    fn = numbax.numba_cuda_callable(noop, SPEC, **kwargs)
    wrapped = {"eager": fn, "jit": jax.jit(fn),
               "vmap": lambda v: jax.vmap(fn)(v[None])[0]}[outer]
    if outer == "vmap" and not kwargs:
        pytest.skip("a callable without vmap_method cannot be vmapped")
    with pytest.raises(ValueError, match=r"^numba_cuda_callable\(\S*noop\) "
                                         r"cannot be differentiated: numbax "
                                         r"cannot see what func computes"):
        jax.linear_transpose(wrapped, jnp.ones(4, F32))(jnp.ones(4, F32))
    # Still runs, eagerly and under jit.
    assert run(jax.jit(wrapped), jnp.ones(4)).shape == (4,)


# -- func fails while XLA runs it --------------------------------------------

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
        assert "test_errors.py" in message  # the user's frame is shown


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
    @cuda.jit
    def bad(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = x[i] + "text"

    def op(x, out, stream):
        bad[1, 32, stream](x, out)

    fn = numbax.numba_cuda_callable(op, SPEC)
    with pytest.raises(RuntimeFailure, match="(?s)func raised.*TypingError"):
        run(jax.jit(fn), jnp.ones(4))


def test_kernel_typing_error_at_trace_time(gpu_only):
    @cuda.jit
    def bad(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = x[i] + "text"

    op = numbax.numba_cuda_kernel(bad, SPEC, launch_dims=4)
    with pytest.raises(numba.core.errors.TypingError,
                       match="Numba could not compile the kernel"):
        jax.jit(op).lower(jnp.ones(4))


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
        affine_op(x, out, stream)
        return out

    fn = numbax.numba_cuda_callable(op, SPEC)
    with pytest.raises(RuntimeFailure, match="func returned a value; it must "
                                             "write its results into the "
                                             "output arrays .* return None"):
        run(jax.jit(fn), jnp.ones(4))


# -- func calls JAX: a clear error, never a deadlock -------------------------

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
        affine_op(x, out, stream)

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
        affine_op(x, out, stream)

    fn = numbax.numba_cuda_callable(op, SPEC)
    np.testing.assert_array_equal(run(jax.jit(fn), jnp.ones(4)), [3, 3, 3, 3])
    assert seen and "func called JAX" in seen[0]


def test_func_may_read_numpy_and_host_copies_of_jax_arrays(no_deadlock):
    # Reading a JAX array that is already computed is no dispatch: allowed.
    weights = np.asarray(jnp.arange(4.0))
    seen = []

    def op(x, out, stream):
        seen.append(np.asarray(_captured).sum() + weights.sum())
        affine_op(x, out, stream)

    fn = numbax.numba_cuda_callable(op, SPEC)
    run(jax.jit(fn), jnp.ones(4))
    assert seen == [9.0]


def test_guard_is_active_on_this_jax():
    from numbax import _guard
    assert _guard.install()
    pairs = _guard.guard_pairs()
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


# -- programs that name ops this process does not have -----------------------

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


# Stale programs (compiled after their op's function was collected):
# tests/test_leaks.py::test_stale_program_after_func_collected.


# -- XLACustomKernel: a kernel generator that returns the wrong thing --------

XLACustomKernel = getattr(numbax, "XLACustomKernel", None)


@pytest.mark.skipif(XLACustomKernel is None, reason="no XLACustomKernel")
def test_kernel_generator_returns_wrong_thing():
    op = XLACustomKernel("errors_matrix_generator")
    op.def_kernel("cpu", lambda *, outs: 42, backend="broken")
    op.def_kernel("gpu", lambda *, outs: 42, backend="broken")
    with pytest.raises(TypeError, match="kernel generator of backend 'broken'"
                                        " returned int, not a function of the"
                                        " inputs"):
        jax.jit(lambda v: op(v, outs=SPEC))(jnp.ones(4))


@pytest.mark.skipif(XLACustomKernel is None, reason="no XLACustomKernel")
def test_kernel_generator_returning_a_bare_kernel_names_the_fix():
    """A generator that returns its @cuda.jit kernel itself (before: Numba's
    "Kernel launch configuration was not specified", naming neither the op
    nor numbax's wrapper)."""
    op = XLACustomKernel("errors_matrix_bare_kernel")
    op.def_numba_cuda_kernel(lambda *, outs: affine)
    op.def_kernel("cpu", lambda *, outs: affine, backend="bare")
    for call in (lambda: op(jnp.ones(4), outs=SPEC),
                 lambda: jax.jit(lambda v: op(v, outs=SPEC))(jnp.ones(4))):
        with pytest.raises(TypeError) as info:
            call()
        text = str(info.value)
        assert "XLACustomKernel('errors_matrix_bare_kernel')" in text
        assert "returned the @cuda.jit kernel" in text
        assert "numbax.numba_cuda_kernel(kernel, outs, " in text


@pytest.mark.skipif(XLACustomKernel is None, reason="no XLACustomKernel")
def test_kernel_generator_output_mismatch():
    op = XLACustomKernel("errors_matrix_generator_shape")
    for platform in ("cpu", "gpu"):
        op.def_kernel(platform, lambda *, outs: (lambda v: v[:2]),
                      backend="short")
    with pytest.raises(TypeError, match=r"output 0 of .* is float32\[2\], but "
                                        r"outs declares float32\[4\]"):
        jax.jit(lambda v: op(v, outs=SPEC))(jnp.ones(4))


def test_compile_errors_name_the_op_first():
    """_checks.compiled_naming_op, which both compilers' compile errors go
    through: the same type, the op named first, the original as the cause;
    a type that cannot be built from one message is re-raised as it was."""
    from numbax import _checks

    def fails(exc):
        def compile():
            raise exc
        return compile

    with pytest.raises(TypeError, match=r"^op\(k\): could not: bad types$") as got:
        _checks.compiled_naming_op(fails(TypeError("bad types")),
                                   "op(k): could not")
    assert isinstance(got.value.__cause__, TypeError)

    class TwoArgs(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)

    original = TwoArgs(1, 2)
    with pytest.raises(TwoArgs) as got:
        _checks.compiled_naming_op(fails(original), "op(k)")
    assert got.value is original
    assert _checks.compiled_naming_op(lambda: 7, "op(k)") == 7
