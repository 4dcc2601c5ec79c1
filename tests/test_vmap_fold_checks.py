"""op.vmap_fold and the simulator's fold reader (issue 24, items 6 and 8).

vmap_fold(*args) runs the checks a call runs, so it never gives a verdict
for arguments the call refuses. The simulator's reader of kernel bytecode
counts as a read of every grid axis whatever it cannot see through: device
functions reached through default arguments, getattr and dunder lookups.
"""

import operator

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import numbax

N = 8


@cuda.jit
def copy(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i]


def copy_op(**kw):
    return numbax.numba_cuda_kernel(
        copy, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N, **kw)


# -- item 6: vmap_fold checks what a call checks (both modes) --------------------

@pytest.mark.gpu
@pytest.mark.parametrize("args, error, match", [
    ((), TypeError, r"numbax calls kernel\(out_0\)"),
    ((jnp.ones(N), jnp.ones(N)), TypeError,
     r"numbax calls kernel\(in_0, in_1, out_0\)"),
    ((jnp.float32(1.5),), ValueError, r"input 0 is 0-d"),
    ((jax.ShapeDtypeStruct((), jnp.float32),), ValueError, r"input 0 is 0-d"),
    ((jnp.ones(N, ml_dtypes.int4),), ValueError,
     r"input 0 has dtype int4, a sub-byte type"),
    ((None,), TypeError, r"input 0 is NoneType"),
    (("text",), TypeError, r"input 0 is not an array JAX can hold"),
    ((jax.ShapeDtypeStruct((2**62, 4), jnp.float32),), ValueError,
     r"more than XLA can address"),
], ids=["no-args", "too-many", "float", "0-d-struct", "int4", "none", "str",
        "huge-struct"])
def test_vmap_fold_refuses_what_a_call_refuses(args, error, match):
    op = copy_op()
    with pytest.raises(error, match=match) as from_fold:
        op.vmap_fold(*args)
    assert "numbax.numba_cuda_kernel(" in str(from_fold.value)
    # The call itself gives the same error, word for word.
    if not any(isinstance(a, jax.ShapeDtypeStruct) for a in args):
        with pytest.raises(error) as from_call:
            op(*args)
        assert str(from_call.value) == str(from_fold.value)


@pytest.mark.gpu
def test_call_on_a_shape_dtype_struct_points_to_eval_shape():
    op = copy_op()
    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    with pytest.raises(TypeError, match=r"input 0 is a jax.ShapeDtypeStruct"
                       r".*jax.eval_shape\(op, ...\)"):
        op(spec)
    assert jax.eval_shape(op, spec).shape == (N,)


@pytest.mark.gpu
def test_vmap_fold_checks_aliases_and_accepts_what_a_call_accepts():
    op = copy_op(input_output_aliases={0: 0})
    with pytest.raises(ValueError, match="cannot alias output 0"):
        op.vmap_fold(jnp.ones(N, jnp.int32))
    # Arrays, ShapeDtypeStructs and lists (which a call takes too).
    for arg in (jnp.ones(N, jnp.float32),
                jax.ShapeDtypeStruct((N,), jnp.float32),
                np.ones(N, np.float32)):
        decision = op.vmap_fold(arg)
        assert decision.folds, decision
    assert copy_op().vmap_fold([0.0] * N).folds


# -- item 8: what the simulator's reader cannot see through -----------------------

@cuda.jit(device=True)
def block_z():
    return cuda.blockIdx.z


@cuda.jit
def through_default(x, out, f=block_z):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = f()


@cuda.jit
def through_kwonly_default(x, out, *, f=block_z):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = f()


@cuda.jit
def through_getattr(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = getattr(cuda, "blockIdx").z  # noqa: B009 - on purpose


@cuda.jit
def through_attrgetter(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = operator.attrgetter("blockIdx")(cuda).z


@pytest.mark.parametrize("kernel", [through_default, through_kwonly_default,
                                    through_getattr, through_attrgetter])
def test_vmap_equals_the_per_slice_loop_when_z_is_reached_indirectly(
        simulator_only, kernel):
    op = numbax.numba_cuda_kernel(
        kernel, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    xs = jnp.ones((3, N), jnp.float32)
    looped = np.stack([np.asarray(op(x)) for x in xs])
    np.testing.assert_array_equal(looped, 0.0)  # blockIdx.z of one launch
    for f in (jax.vmap(op), jax.jit(jax.vmap(op))):
        np.testing.assert_array_equal(np.asarray(f(xs)), looped)
    decision = op.vmap_fold(xs[0])
    # Folding on z would be wrong; folding on y (never read) is right.
    assert decision.axis != "z", decision


def test_reader_counts_dunder_lookups_and_unknown_names_as_reads():
    from numbax import _fold

    def dunder(out):
        out[0] = cuda.__dict__["blockIdx"].z

    def unknown(out):
        out[0] = not_defined_anywhere.z  # noqa: F821

    for func in (dunder, unknown, through_getattr):
        read, why = _fold.axes_read_by_python(func)
        assert read is None and why, (func, read, why)
    # A default argument is followed like a global: its read of z is seen.
    for func in (through_default, through_kwonly_default):
        read, why = _fold.axes_read_by_python(func)
        assert why is None and 2 in read, (read, why)


def test_reader_still_folds_plain_kernels_and_builtins(simulator_only):
    @cuda.jit
    def plain(x, out):
        i = cuda.grid(1)
        n = min(len(out), x.shape[0])
        if i < n:
            out[i] = abs(x[i]) + float(max(i, 0))

    op = numbax.numba_cuda_kernel(
        plain, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    decision = op.vmap_fold(jnp.ones(N, jnp.float32))
    assert decision.folds and decision.axis == "z", decision
