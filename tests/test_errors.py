"""Errors found when an op is created or called, before anything runs.

Every misuse of an op's arguments (func, kernel, outs, scratch, aliases,
launch configuration, vmap_method, rules and options) and of a call's
inputs gives its exact error type, raised at the call (creation or trace
time) with a message that names the op and the fix, also for XLACustomKernel
kernel generators and rules; numbax refuses rather than crash XLA, truncate
or return wrong results. docs/errors.md lists each row with its test here
(or in the file it names). What goes wrong while XLA runs a program:
test_run_time_errors.py.

Errors on the GPU paths: a func that raises or makes a launch CUDA
refuses fails that call alone (30 calls, failing and good in turn);
vmap_fold refuses whatever a call refuses, with the same error; grad, jvp,
vjp and grad of vmap of an op without rules raise errors that name the op.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numba
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import f32_spec, run_child
from shared_kernels import adds_text, affine, launch_affine, reverse
from conftest import SIMULATOR, assert_close, grid_for, kernel_op, outcome
from shared_kernels import add_one

pytestmark = pytest.mark.gpu

F32 = jnp.float32
SPEC = jax.ShapeDtypeStruct((4,), F32)
RuntimeFailure = jax.errors.JaxRuntimeError
_counter = itertools.count()


# -- creating an op ---------------------------------------------------------

def noop(x, out, stream):
    pass


def run(fn, *args):
    return jax.block_until_ready(fn(*args))


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


@pytest.mark.parametrize("empty", [[], (), {}], ids=["list", "tuple", "dict"])
@pytest.mark.parametrize("form", ["fixed", "function"])
def test_empty_scratch_means_no_scratch_buffer(rng, empty, form):
    # None means no scratch buffer, and so does an empty sequence: a
    # scratch function that builds its list of buffers returns [] for a
    # call that needs none (was: a TypeError that did not say so).
    from conftest import poison

    def launch(x, out, stream):  # no scratch parameter
        affine[1, 64, stream](x, out)
    scratch = empty if form == "fixed" else (lambda x: empty)
    spec = jax.ShapeDtypeStruct((40,), F32)
    op = numbax.numba_cuda_callable(launch, spec, scratch=scratch)
    x = rng.standard_normal(40).astype(np.float32)
    poison((40,), np.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x)), 2 * x + 1,
                               rtol=1e-6)


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
    # 0-d arrays (JAX's, also traced ones, and NumPy's) are traced scalars
    # a callable's func gets a 1-element array, a
    # kernel the value (tests/test_shapes_and_scalars.py); a kernel that
    # reads an array there fails to compile, on the GPU, saying so.
    seen = []
    numbax.numba_cuda_callable(
        lambda x, out, stream: seen.append(tuple(x.shape)), SPEC)(value)
    assert seen == [(1,)]


def test_zero_d_input_for_a_kernel_reading_an_array(gpu_only):
    op = numbax.numba_cuda_kernel(affine, SPEC, launch_dims=4)
    # Numba's own error type (a TypingError), the reason appended.
    with pytest.raises(Exception, match=r"inputs 0 are traced scalars.*"
                       r"pass a 1-element array"):
        jax.jit(op)(jnp.float32(1.0))  # a traced 0-d array


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
    # Every ffi_call vmap_method is accepted; others name them.
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
        numbax.numba_cuda_kernel(launch_affine, SPEC, launch_dims=4)


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
     "vmap_method must be one of None, 'expand_dims', 'broadcast_all', "
     "'legacy_vectorized', 'sequential', 'sequential_unrolled'"),
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


# -- the launch configuration, checked first (before the kernel or Numba) --


def _plain_python(x, out):
    out[0] = x[0]


@pytest.mark.parametrize("kwargs, match", [
    ({}, "needs a launch configuration"),
    ({"grid": 1, "block": 4, "launch_dims": 4}, "not both"),
    ({"grid": 1}, "go together"),
    ({"block": 4}, "go together"),
    ({"grid": 1, "block": 4, "vmap_method": "expand_dims"},
     "explicit grid cannot be combined with vmap_method"),
    ({"launch_dims": 4, "vmap_method": "bogus"},
     "vmap_method must be one of None, 'expand_dims'"),
])
def test_configuration_before_the_kernel_and_numba(monkeypatch, kwargs,
                                                   match):
    with pytest.raises(ValueError, match=match):
        numbax.numba_cuda_kernel(_plain_python, SPEC, **kwargs)

    def no_numba():
        raise ImportError("numbax needs Numba with CUDA support (test)")

    monkeypatch.setattr(numbax.runtime.numba_bridge, "require_cuda", no_numba)
    with pytest.raises(ValueError, match=match):
        numbax.numba_cuda_kernel(reverse, SPEC, **kwargs)


def test_valid_configuration_then_type_error_or_import_error(monkeypatch):
    with pytest.raises(TypeError, match="@cuda.jit"):
        numbax.numba_cuda_kernel(_plain_python, SPEC, launch_dims=4,
                                 vmap_method="broadcast_all")

    def no_numba():
        raise ImportError("numbax needs Numba with CUDA support (test)")

    monkeypatch.setattr(numbax.runtime.numba_bridge, "require_cuda", no_numba)
    with pytest.raises(ImportError, match="Numba with CUDA support"):
        numbax.numba_cuda_kernel(_plain_python, SPEC, launch_dims=4)


# -- shapes, dtypes and options XLA or CUDA could not take -----------------

def test_outs_whose_size_overflows_int64_is_value_error_not_abort():
    # Before: XLA aborted the process ("overflow in static extent product",
    # exit 134), eager and under jit, for callables and kernels alike.
    result = run_child("""
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
            numbax.numba_cuda_kernel(affine, f32_spec(), launch_dims=dims)
    with pytest.raises(ValueError, match="CUDA allows at most"):
        numbax.numba_cuda_kernel(affine, f32_spec(), grid=(2**40,), block=1)


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


def test_output_rank_above_the_call_frame_limit_is_refused_at_creation():
    # It used to be accepted, then fail at run time in the C++ decoder.
    with pytest.raises(ValueError, match="has 33 dimensions.*at most 32"):
        numbax.numba_cuda_callable(lambda x, o, s: None,
                                   jax.ShapeDtypeStruct((1,) * 33, F32))
    numbax.numba_cuda_callable(lambda x, o, s: None,
                               jax.ShapeDtypeStruct((1,) * 32, F32))


def test_non_native_byte_order_names_the_byte_order():
    with pytest.raises(ValueError, match=r"outs\[0\] has dtype >f4 \(float32 "
                       r"in non-native byte order\).*np.dtype\('float32'\)"):
        numbax.numba_cuda_callable(lambda x, o, s: None,
                                   jax.ShapeDtypeStruct((8,), np.dtype(">f4")))


def test_batch_partitionable_must_be_a_bool():
    # "no" is truthy: it used to switch the feature on.
    with pytest.raises(TypeError, match="batch_partitionable must be True or "
                       "False, got str: 'no'"):
        numbax.numba_cuda_callable(lambda x, o, s: None,
                                   jax.ShapeDtypeStruct((4,), F32),
                                   batch_partitionable="no")


def test_batch_partitionable_with_legacy_vectorized_is_refused_at_creation():
    with pytest.raises(ValueError, match="legacy_vectorized"):
        numbax.numba_cuda_callable(lambda x, o, s: None, f32_spec(),
                                   batch_partitionable=True,
                                   vmap_method="legacy_vectorized")


def test_functools_wraps_star_args_wrapper_is_accepted():
    def launch(x, out, stream):
        affine[1, 8, stream](x, out)

    @functools.wraps(launch)
    def wrapper(*args):
        return launch(*args)

    y = numbax.numba_cuda_callable(wrapper, f32_spec())(jnp.ones(8, F32))
    np.testing.assert_allclose(y, np.full(8, 3.0))

    @functools.wraps(launch)
    def too_few(x):
        return None
    with pytest.raises(TypeError, match="cannot take them"):
        numbax.numba_cuda_callable(too_few, f32_spec())(jnp.ones(8, F32))


@pytest.mark.parametrize("bad", [None, {"x": 1.0}, "text"])
def test_non_array_input_names_the_op(bad):
    def f(x, out, stream):
        pass
    with pytest.raises(TypeError, match="numba_cuda_callable\\(.*f\\): "
                       "input 0"):
        numbax.numba_cuda_callable(f, f32_spec())(bad)
    with pytest.raises(TypeError, match="numba_cuda_kernel\\(.*affine\\): "
                       "input 0"):
        numbax.numba_cuda_kernel(affine, f32_spec(), launch_dims=8)(bad)
    op = _custom_op()
    with pytest.raises(TypeError, match=f"{op.name}.*input 0"):
        op(bad, outs=f32_spec())


def test_graph_cache_size_out_of_range_is_value_error():
    before = numbax.graph_cache_size()
    for bad in (10**30, 2**31, 0, -1, 2.0, True):
        with pytest.raises(ValueError, match="graph cache size"):
            numbax.set_graph_cache_size(bad)
    assert numbax.graph_cache_size() == before


# -- differentiation and compilation name the user's op --------------------

def test_grad_of_callable_names_the_users_op():
    def launch(x, out, stream):
        affine[1, 8, stream](x, out)

    op = numbax.numba_cuda_callable(launch, f32_spec())
    loss = lambda v: op(v).sum()  # noqa: E731
    for g in (jax.grad(loss), jax.grad(jax.jit(loss)),
              jax.jit(jax.grad(loss))):
        with pytest.raises(ValueError, match="numba_cuda_callable\\(.*"
                           "launch\\) cannot be differentiated") as info:
            g(jnp.ones(8, F32))
        # The hint for an XLACustomKernel's batched kernel is a kernel's.
        assert "XLACustomKernel that has a JVP rule" not in str(info.value)
    # a derivative that does not flow through the op is fine
    w = jnp.float32(3.0)
    grad = jax.grad(lambda w: (w * op(jnp.ones(8, F32))).sum())(w)
    np.testing.assert_allclose(grad, 24.0)
    x = jnp.ones(8, F32)
    grad = jax.grad(lambda v: (op(jax.lax.stop_gradient(v)) * v).sum())(x)
    np.testing.assert_allclose(grad, np.full(8, 3.0))


def test_kernel_typing_error_at_trace_time(gpu_only):
    op = numbax.numba_cuda_kernel(adds_text, SPEC, launch_dims=4)
    with pytest.raises(numba.core.errors.TypingError,
                       match="Numba could not compile the kernel"):
        jax.jit(op).lower(jnp.ones(4))


def test_compile_errors_name_the_op_first():
    """checks.compiled_naming_op, which both compilers' compile errors go
    through: the same type, the op named first, the original as the cause;
    a type that cannot be built from one message is re-raised as it was."""
    from numbax.trace import checks

    def fails(exc):
        def compile():
            raise exc
        return compile

    with pytest.raises(TypeError, match=r"^op\(k\): could not: bad types$") as got:
        checks.compiled_naming_op(fails(TypeError("bad types")),
                                   "op(k): could not")
    assert isinstance(got.value.__cause__, TypeError)

    class TwoArgs(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)

    original = TwoArgs(1, 2)
    with pytest.raises(TwoArgs) as got:
        checks.compiled_naming_op(fails(original), "op(k)")
    assert got.value is original
    assert checks.compiled_naming_op(lambda: 7, "op(k)") == 7


# -- inputs that are containers, not arrays -----------------------------------

def _container_calls():
    """Each family's op called on one input; a label per family."""
    kernel = kernel_op(add_one, (4,), F32)
    callable_ = numbax.numba_cuda_callable(noop, SPEC)
    custom = numbax.XLACustomKernel("errors_matrix_container_input")
    custom.def_kernel("cpu", lambda *, outs: (lambda v: v + 1), backend="jnp")
    custom.def_kernel("gpu", lambda *, outs: (lambda v: v + 1), backend="jnp")
    return {
        "numba_cuda_kernel(": kernel,
        "numba_cuda_callable(": callable_,
        "XLACustomKernel('errors_matrix_container_input')":
            lambda v: custom(v, outs=SPEC),
    }


@pytest.mark.parametrize("container", [list, tuple], ids=["list", "tuple"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_container_input_is_refused_as_jax_refuses_it(container, jit):
    """A list or tuple input is a TypeError naming the op and jnp.asarray,
    as JAX's own functions refuse one (before: read as one array, so
    op.vmap_fold([1.0] * 8) answered though jax.vmap cannot batch it)."""
    value = container([1.0] * 4)
    for name, op in _container_calls().items():
        fn = jax.jit(op) if jit else op
        with pytest.raises(TypeError) as info:
            run(fn, value)
        text = str(info.value)
        if jit:   # jit's own refusal of a non-array argument, before numbax
            continue
        for part in (name, f"input 0 is {container.__name__}", "jnp.asarray"):
            assert part in text, (name, text)
    kernel = kernel_op(add_one, (4,), F32)
    with pytest.raises(TypeError, match="input 0 is .*jnp.asarray"):
        kernel.vmap_fold(value)


# -- XLACustomKernel: generators and rules that return the wrong thing -----

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


@pytest.mark.skipif(XLACustomKernel is None, reason="no XLACustomKernel")
def test_kernel_generator_returning_more_outputs_than_declared():
    """Two results where outs declares one array: before, a JAX
    TracerArrayConversionError naming neither the op nor the count."""
    op = XLACustomKernel("errors_matrix_generator_tuple")
    for platform in ("cpu", "gpu"):
        op.def_kernel(platform, lambda *, outs: (lambda v: (v * 3, v)),
                      backend="pair")
    with pytest.raises(TypeError, match=r"output 0 of .* is a tuple of 2: .*"
                                        r"not an array: outs declares 1 "
                                        r"output\(s\): float32\[4\]"):
        jax.jit(lambda v: op(v, outs=SPEC))(jnp.ones(4))


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

    f = lambda x: op(x, outs=f32_spec(8))  # noqa: E731
    with pytest.raises(TypeError, match="batching rule returned output 0 of "
                       "shape \\(2, 4\\).*makes that \\(2, 8\\)"):
        jax.vmap(f)(jnp.ones((2, 8), F32))

    @op.def_batching_rule
    def rule_axis1(args, axes, *, outs):
        x = jnp.moveaxis(args[0], axes[0], 0)
        return (2 * x + 1).T, 1  # a correct rule with out_axes=1

    xs = np.arange(16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_allclose(jax.vmap(f)(xs), 2 * xs + 1)


def test_rules_with_wrong_signature_name_the_op():
    op = _custom_op()
    op.def_jvp_rule(lambda t: t)  # missing the primals and outs=
    with pytest.raises(TypeError, match=f"{op.name}.*the JVP rule"
                       ".*cannot take the arguments"):
        jax.jvp(lambda x: op(x, outs=f32_spec()), (jnp.ones(8, F32),),
                (jnp.ones(8, F32),))
    op2 = _custom_op()
    op2.def_batching_rule(lambda args, axes: None)  # no outs=
    with pytest.raises(TypeError, match=f"{op2.name}.*the batching rule"
                       ".*cannot take the arguments"):
        jax.vmap(lambda x: op2(x, outs=f32_spec()))(jnp.ones((2, 8), F32))


N = 64 if SIMULATOR else 4096
F32_GPU = jnp.float32
SPEC_GPU = jax.ShapeDtypeStruct((N,), F32_GPU)


def f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def add_one_launch(x, out, stream):
    add_one[grid_for(N), 256, stream](x, out)


@pytest.mark.usefixtures("x64")
def test_func_exceptions_and_bad_launches_between_good_calls(rng):
    state = {"fail": None}

    def launch(x, out, stream):
        if state["fail"] == "zero":
            1 / 0  # noqa: B018  (raises on purpose)
        if state["fail"] == "launch":
            add_one[1, 2048, stream](x, out)  # a block size CUDA refuses
            return
        add_one[grid_for(N), 256, stream](x, out)

    op = jax.jit(numbax.numba_cuda_callable(launch, SPEC_GPU))
    for i in range(30):
        x = f32(rng, N)
        mode = (None, "zero", "launch")[i % 3]
        if SIMULATOR and mode == "launch":  # the simulator takes 2048 threads
            mode = "zero"
        state["fail"] = mode
        if mode is None:
            assert_close(op(x), x + 1, f"good call {i}")
        else:
            with pytest.raises((jax.errors.JaxRuntimeError, ValueError)) as info:
                jax.block_until_ready(op(x))
            for part in ("ZeroDivisionError",) if mode == "zero" else ():
                assert part in str(info.value), f"{mode} call {i}: {info.value}"
    state["fail"] = None
    assert_close(op(x), x + 1, "final")


# Argument sets a call refuses, or takes; vmap_fold must answer alike.
ODD_ARGS = {
    "no args": lambda x: (),
    "two args": lambda x: (x, x),
    "python float": lambda x: (1.5,),
    "0-d": lambda x: (jnp.float32(2.0),),
    "None": lambda x: (None,),
    "string": lambda x: ("abc",),
    "dict": lambda x: ({"a": 1},),
    "float8": lambda x: (jnp.zeros(N, jnp.float8_e4m3fn),),
    "list": lambda x: ([1.0] * N,),
    "tuple": lambda x: ((1.0,) * N,),
    "int4": lambda x: (jnp.zeros(N, jnp.int4),),
    "2-d": lambda x: (jnp.zeros((4, N), jnp.float32),),
}
# A kernel typing error: the simulator finds it when the kernel runs, after
# the call was traced, so vmap_fold cannot know it.
TYPED_AT_RUN_TIME_IN_THE_SIMULATOR = ("2-d",)
# Scalars alone (a 0-d array is a traced scalar): vmap_fold refuses them
# (TypeError naming the op: jax.vmap has no array to batch) whatever the
# call does.
FOLD_REFUSES_SCALARS_ALONE = ("python float", "0-d")
# Containers: refused by the call, and so by vmap_fold, as JAX refuses them
# (jnp.sin([1.0]) and jax.ffi calls raise TypeError).
CONTAINERS = ("list", "tuple")


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("label", ODD_ARGS)
def test_vmap_fold_refuses_what_the_call_refuses(label, rng):
    if SIMULATOR and label in TYPED_AT_RUN_TIME_IN_THE_SIMULATOR:
        pytest.skip("the simulator finds this kernel typing error at run time")
    if label == "int4" and not hasattr(jnp, "int4"):
        pytest.skip("this JAX has no int4")
    op = kernel_op(add_one, (N,), F32_GPU)
    args = ODD_ARGS[label](jnp.asarray(f32(rng, N)))
    call = outcome(lambda: jax.block_until_ready(op(*args)))
    fold = outcome(op.vmap_fold, *args)
    if label in CONTAINERS:
        assert call == fold == ("err", "TypeError"), (call, fold)
    if label in FOLD_REFUSES_SCALARS_ALONE:
        assert fold == ("err", "TypeError"), fold
        with pytest.raises(TypeError) as info:
            op.vmap_fold(*args)
        for part in ("numba_cuda_kernel(", "every input is a scalar"):
            assert part in str(info.value), str(info.value)
        return
    if call[0] == "err":
        assert fold[0] == "err", f"the call raises {call[1]}, vmap_fold gives {fold[1]}"
        assert call[1] == fold[1], f"the call raises {call[1]}, vmap_fold {fold[1]}"
    else:
        assert fold[0] == "ok", f"the call works, vmap_fold raises {fold[1]}"
    if fold[0] == "err" and fold[1] not in ("TypeError", "ValueError"):
        # A kernel Numba cannot type for these arrays: Numba's own
        # TypingError, raised at trace time with the op named first, is the
        # documented contract (docs/errors.md).
        try:
            op.vmap_fold(*args)
        except Exception as exc:  # noqa: BLE001
            message = str(exc)
        assert fold[1] == "TypingError", f"a raw {fold[1]}"
        assert "numba_cuda_kernel(" in message and "could not compile" in message, message


@pytest.mark.usefixtures("x64")
def test_vmap_fold_takes_shape_dtype_structs():
    decision = kernel_op(add_one, (N,), F32_GPU).vmap_fold(SPEC_GPU)
    assert hasattr(decision, "folds"), decision


DIFFERENTIATE = {
    "grad": lambda op, x: jax.grad(lambda v: op(v).sum())(x),
    "jit(grad)": lambda op, x: jax.jit(jax.grad(lambda v: op(v).sum()))(x),
    "jvp": lambda op, x: jax.jvp(op, (x,), (jnp.ones_like(x),)),
    "vjp": lambda op, x: jax.vjp(op, x)[1](jnp.ones_like(x)),
    "grad(vmap)": lambda op, x: jax.grad(lambda v: jax.vmap(op)(v[None]).sum())(x),
}


def add_one_op(maker):
    """x + 1 by numba_cuda_<maker>, and the name its errors give the op."""
    if maker == "kernel":
        return kernel_op(add_one, (N,), F32_GPU), "add_one"
    return numbax.numba_cuda_callable(add_one_launch, SPEC_GPU, vmap_method="sequential"), \
        "add_one_launch"


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("how", DIFFERENTIATE)
@pytest.mark.parametrize("maker", ["kernel", "callable"])
def test_differentiating_an_op_without_rules_names_it(maker, how, rng):
    op, name = add_one_op(maker)
    with pytest.raises((ValueError, TypeError, NotImplementedError)) as info:
        jax.block_until_ready(DIFFERENTIATE[how](op, jnp.asarray(f32(rng, N))))
    for part in (f"numba_cuda_{maker}", name):
        assert part in str(info.value), str(info.value)


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("maker", ["kernel", "callable"])
def test_stop_gradient_around_an_op_without_rules(maker, rng):
    op, _ = add_one_op(maker)
    x = jnp.asarray(f32(rng, N))
    g = jax.grad(lambda v, w: op(jax.lax.stop_gradient(v)).sum() + (w ** 2).sum(),
                 argnums=1)(x, x)
    assert_close(g, 2 * np.asarray(x), "stop_gradient")
