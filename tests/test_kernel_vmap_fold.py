"""How jax.vmap launches a numba_cuda_kernel: the fold decision and its evidence.

The rule (kernel/vmap.py, ``decide``) and ``op.vmap_fold`` /
``FoldDecision``: vmap_fold runs the checks a call runs, so it never gives
a verdict for arguments the call refuses, and the decision explains itself
for nested levels. The evidence, read by each compiler's fold reader
(compilers/grid_reads.py): PTX, the code numba-cuda links in, and in the
simulator the kernel's bytecode, where whatever the reader cannot see
through (default arguments, getattr, dunder lookups, a tuple of device
functions) counts as a read of every grid axis. What vmap computes:
test_kernel_vmap.py.
"""

import operator
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numba
import numpy as np
import pytest
from numba import cuda

import numbax
from numbax.compilers import grid_reads
from numbax.kernel import vmap
from conftest import random_array
from shared_kernels import reverse, stencil_reads_grid

N = 8


# -- the rule ---------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kwargs, folds, text", [
    (dict(vmap_method="sequential", grid=(4, 1, 1), cooperative=False,
          axes_read=frozenset()), False, "sequential"),
    (dict(vmap_method=None, grid=(4, 1, 1), cooperative=True,
          axes_read=frozenset()), False, "cooperative"),
    (dict(vmap_method=None, grid=(4, 2, 3), cooperative=False,
          axes_read=frozenset()), False, "all three grid axes"),
    (dict(vmap_method=None, grid=(4, 1, 1), cooperative=False,
          axes_read=None, unreadable="x"), False, "cannot read"),
    (dict(vmap_method=None, grid=(4, 1, 1), cooperative=False,
          axes_read=frozenset({0, 1, 2})), False, "reads grid axis z/y"),
    (dict(vmap_method=None, grid=(4, 1, 1), cooperative=False,
          axes_read=frozenset({0})), True, "axis z"),
    (dict(vmap_method="expand_dims", grid=(4, 1, 1), cooperative=False,
          axes_read=frozenset({0, 2})), True, "axis y"),
    (dict(vmap_method=None, grid=(4, 4, 1), cooperative=False,
          axes_read=frozenset({0, 1, 2})), False, "reads grid axis z"),
])
def test_decide(kwargs, folds, text):
    decision = vmap.decide(**kwargs)
    assert decision.folds is folds
    assert text in decision.reason


@pytest.mark.gpu
def test_fold_decision_explains_nesting(rng):
    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    op = numbax.numba_cuda_kernel(reverse, spec, launch_dims=N)
    x = random_array(rng, (N,), np.float32)
    decision = op.vmap_fold(x)
    assert decision.folds
    assert decision.launches(16, 16) == 1
    assert decision.launches(300, 250) == 2
    assert "nested" in decision.explain(16, 16)
    per = numbax.numba_cuda_kernel(stencil_reads_grid, spec,
                                   launch_dims=N).vmap_fold(x, x[:3])
    assert per.launches(4, 5, 6) == 120
    assert "120 launches" in per.explain(4, 5, 6)


# -- vmap_fold checks what a call checks ------------------------------------

@cuda.jit
def copy(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i]


def copy_op(**kw):
    return numbax.numba_cuda_kernel(
        copy, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("args, error, match", [
    ((), TypeError, r"numbax calls kernel\(out_0\)"),
    ((jnp.ones(N), jnp.ones(N)), TypeError,
     r"numbax calls kernel\(in_0, in_1, out_0\)"),
    ((jnp.ones(N, ml_dtypes.int4),), ValueError,
     r"input 0 has dtype int4, a sub-byte type"),
    ((None,), TypeError, r"input 0 is NoneType"),
    (("text",), TypeError, r"input 0 is not an array JAX can hold"),
    ((jax.ShapeDtypeStruct((2**62, 4), jnp.float32),), ValueError,
     r"more than XLA can address"),
], ids=["no-args", "too-many", "int4", "none", "str",
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
    # Arrays and ShapeDtypeStructs; a list is refused, as a call refuses it
    # (and JAX does: jax.vmap maps arrays, a list is a pytree of scalars).
    for arg in (jnp.ones(N, jnp.float32),
                jax.ShapeDtypeStruct((N,), jnp.float32),
                np.ones(N, np.float32)):
        decision = op.vmap_fold(arg)
        assert decision.folds, decision
    with pytest.raises(TypeError, match="input 0 is list.*jnp.asarray"):
        copy_op().vmap_fold([0.0] * N)


@cuda.jit
def scaled_copy(x, scale, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = scale * x[i]


@pytest.mark.gpu
@pytest.mark.parametrize("args", [(1.0,), (np.float32(2.5),), (3, True)],
                         ids=["float", "np.float32", "int-bool"])
def test_vmap_fold_of_scalars_alone_is_refused_naming_the_op(args):
    # The third pass refused vmap_fold(1.5) (a 0-d input);
    # since scalars go by value it answered folds=True on the simulator,
    # where jax.vmap has nothing to batch (its test had been moved to a
    # 0-d JAX array, and the GPU test of the same case is skipped in the
    # simulator).
    op = copy_op() if len(args) == 1 else numbax.numba_cuda_kernel(
        scaled_copy, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    with pytest.raises(TypeError, match=(
            r"^numbax\.numba_cuda_kernel\(test_kernel_vmap_fold\.\w+\): "
            r"vmap_fold: every input is a scalar \(.*\), and jax\.vmap "
            r"batches arrays only .* pass the call's unbatched array inputs")):
        op.vmap_fold(*args)


@pytest.mark.gpu
def test_vmap_fold_with_a_scalar_beside_an_array_still_answers(rng):
    op = numbax.numba_cuda_kernel(
        scaled_copy, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    x = random_array(rng, (N,), np.float32)
    decision = op.vmap_fold(x, 2.0)
    assert decision.folds, decision
    assert op.vmap_fold(jax.ShapeDtypeStruct((N,), jnp.float32), 2.0).folds
    # A list is refused as the call refuses it (vmap_fold answers as a
    # call does; the third pass refused it, a later change let it answer).
    with pytest.raises(TypeError, match="input 0 is list"):
        copy_op().vmap_fold([1.0] * N)
    xs = random_array(rng, (3, N), np.float32)
    np.testing.assert_allclose(
        np.asarray(jax.vmap(lambda v: op(v, 2.0))(xs)), 2 * xs, rtol=1e-6)


# -- the readers: PTX and linked code ---------------------------------------

@pytest.mark.gpu
def test_ptx_reads():
    ptx = "mov.u32 %r1, %ctaid.x;\nmov.u32 %r2, %ntid.x;\nmov.u32 %r3, %tid.z;"
    assert grid_reads.axes_read_by_ptx(ptx) == {0}
    assert grid_reads.axes_read_by_ptx("mov.u32 %r9, %nctaid.z;") == {2}
    assert grid_reads.axes_read_by_ptx("mov.v4.u32 {%r1,%r2,%r3,%r4}, %ctaid;") \
        == {0, 1, 2}
    assert grid_reads.axes_read_by_ptx("mov.u32 %r1, %clusterid.x;") == {0, 1, 2}


_LINK_CHECK = textwrap.dedent("""
    import os
    import numba.cuda
    import numba.cuda._internal.cuda_bf16 as bf16
    import numba.cuda._internal.cuda_fp16 as fp16
    from numba.cuda import CUSource
    from numbax.compilers import grid_reads

    class Library:
        def __init__(self, files):
            self._linking_files = files

        def get_asm_str(self):
            return "mov.u32 %r1, %ctaid.x;"

    class Compiled:
        def __init__(self, files):
            self._codelibrary = Library(files)

    def reads(*files):
        return grid_reads.axes_read_by_library(Compiled(list(files)))

    helpers = os.path.join(os.path.dirname(numba.cuda.__file__),
                           "reshape_funcs.cu")
    # numba-cuda's own libraries: seen through, x is all the PTX reads.
    assert reads(bf16.shim_obj, fp16.shim_obj) == (frozenset({0}), None)
    assert reads(helpers) == (frozenset({0}), None)
    # The user's code (even readable source) is not.
    axes, why = reads(CUSource("__device__ int f() { return 1; }"))
    assert axes is None and "CUSource" in why, why
    axes, why = reads("/tmp/user_helpers.cu")
    assert axes is None and "user_helpers" in why, why
    # numba's own shim, once it names a grid index, is refused too.
    bf16.shim_stream.write("__device__ int g() { return blockIdx.y; }")
    axes, why = reads(bf16.shim_obj)
    assert axes is None, why
    print("ok")
""")


@pytest.mark.gpu
def test_linked_code_numbax_reads_through():
    # numba-cuda's real linkable objects exist outside the simulator only;
    # no GPU is needed to build them, so a child without CUDASIM checks.
    env = {k: v for k, v in os.environ.items()
           if k != "NUMBA_ENABLE_CUDASIM"}
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run([sys.executable, "-c", _LINK_CHECK], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


# -- the simulator's reader of bytecode ------------------------------------

def _helper_reads_y():
    return cuda.blockIdx.y


@pytest.mark.gpu
def test_python_reads():
    def k1(x):
        i = cuda.grid(1)
        return cuda.blockIdx.x + cuda.gridDim.x + i

    def k2(x):
        return cuda.grid(2)

    def k3(x):
        return _helper_reads_y()

    def k4(x, axis):
        return cuda.grid(axis)

    assert grid_reads.axes_read_by_python(k1) == (frozenset({0}), None)
    assert grid_reads.axes_read_by_python(k2) == (frozenset({0, 1}), None)
    assert grid_reads.axes_read_by_python(k3) == (frozenset({1}), None)
    assert grid_reads.axes_read_by_python(k4) == (frozenset({0, 1, 2}), None)


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
    def dunder(out):
        out[0] = cuda.__dict__["blockIdx"].z

    def unknown(out):
        out[0] = not_defined_anywhere.z  # noqa: F821

    for func in (dunder, unknown, through_getattr):
        read, why = grid_reads.axes_read_by_python(func)
        assert read is None and why, (func, read, why)
    # A default argument is followed like a global: its read of z is seen.
    for func in (through_default, through_kwonly_default):
        read, why = grid_reads.axes_read_by_python(func)
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


@cuda.jit(device=True)
def _block_z():
    return cuda.blockIdx.z


_HELPERS = (_block_z,)


@cuda.jit
def _reads_z_through_a_tuple(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 100 * _HELPERS[0]()


@cuda.jit
def _uses_type_globals(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = numba.float32(x[i]) + np.float32(1)


@pytest.mark.gpu
@pytest.mark.usefixtures("simulator_only")
def test_simulator_reader_does_not_trust_what_it_cannot_look_inside():
    # Before: a device function reached through a tuple (or a class) was not
    # followed and counted as safe, so the fold changed the result.
    spec = jax.ShapeDtypeStruct((8,), jnp.float32)
    op = numbax.numba_cuda_kernel(_reads_z_through_a_tuple, spec, launch_dims=8)
    decision = op.vmap_fold(spec)
    assert not decision.folds and "tuple" in decision.reason, decision
    xs = np.zeros((3, 8), np.float32)
    np.testing.assert_array_equal(
        jax.vmap(op)(xs), np.stack([np.asarray(op(x)) for x in xs]))
    # Numba's and numpy's types are values: such kernels still fold.
    typed = numbax.numba_cuda_kernel(_uses_type_globals, spec, launch_dims=8)
    assert typed.vmap_fold(spec).folds
    np.testing.assert_array_equal(jax.vmap(typed)(xs), xs + 1)
