"""Nested jax.vmap (issue 25): every level flattened into one batch.

Each nested result is compared bit for bit with the per-slice loop (the
unbatched op jitted and called once per element of every level), on fresh
random data, for folded kernels, kernels that cannot fold, and
'sequential' ones; with broadcast (in_axes=None) inputs at each level,
in_axes/out_axes other than 0, aliased buffers, and batches above CUDA's
65535 blocks per axis. Runs in the simulator (small sizes) and, marked
`gpu`, on a GPU.
"""

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
from numbax import _fold
from numbax.custom_kernel import XLACustomKernel
from conftest import SIMULATOR, random_array
from test_kernel import reverse, stencil

pytestmark = pytest.mark.gpu

F32 = jnp.float32
N = 12 if SIMULATOR else 1031
TPB = 8 if SIMULATOR else 128


def spec(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


@cuda.jit
def stencil_reads_grid(x, w, out):
    # stencil, plus a read of gridDim.y/z (both 1 in an unbatched launch):
    # the kernel sees every grid axis, so vmap launches it once per slice.
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        left = x[i - 1] if i > 0 else 0
        right = x[i + 1] if i < n - 1 else 0
        out[i] = (w[0] * left + w[1] * x[i] + w[2] * right
                  + cuda.gridDim.y + cuda.gridDim.z - 2)


@cuda.jit
def accumulate(x, acc, acc_out, rev):
    # acc_out is acc's buffer (aliased): x is added into it in place.
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        acc_out[i] = acc[i] + x[i] * 2
        rev[i] = x[n - 1 - i]


def nested_loop(op, args, in_axes_per_level):
    """The reference: `op` jitted, once per index of every level.

    `in_axes_per_level` lists, outermost first, each level's in_axes (one
    entry per argument, an int or None), as the nested jax.vmap applies
    them. Returns the outputs stacked with every level's axis first,
    outermost first.
    """
    one = jax.jit(op)

    def run(args, levels):
        if not levels:
            return one(*args)
        axes, rest = levels[0], levels[1:]
        size = next(a.shape[d] for a, d in zip(args, axes) if d is not None)
        outs = [run([a if d is None else np.take(a, s, axis=d)
                     for a, d in zip(args, axes)], rest)
                for s in range(size)]
        if isinstance(outs[0], (tuple, list)):
            return tuple(np.stack([np.asarray(o[k]) for o in outs])
                         for k in range(len(outs[0])))
        return np.stack([np.asarray(o) for o in outs])
    return run(list(args), list(in_axes_per_level))


def nest(op, in_axes_per_level, out_axes_per_level=None):
    """jax.vmap applied once per level, innermost last in the list."""
    f = op
    levels = list(in_axes_per_level)
    outs = list(out_axes_per_level or [0] * len(levels))
    for axes, out_axis in reversed(list(zip(levels, outs))):
        f = jax.vmap(f, in_axes=tuple(axes), out_axes=out_axis)
    return jax.jit(f)


def custom_calls(fn, *args):
    text = fn.lower(*args).as_text()
    return text.count("stablehlo.custom_call"), text.count("stablehlo.while")


@pytest.mark.parametrize("kernel, folds", [(stencil, True),
                                           (stencil_reads_grid, False)])
@pytest.mark.parametrize("method", [None, "expand_dims", "sequential"])
def test_depth_two_with_broadcast_at_each_level(rng, kernel, folds, method):
    op = numbax.numba_cuda_kernel(kernel, spec(N), launch_dims=N,
                                  threads_per_block=TPB, vmap_method=method)
    outer, inner = 3, 4
    xs = random_array(rng, (outer, inner, N), np.float32)
    ws_outer = random_array(rng, (outer, 3), np.float32)
    ws_inner = random_array(rng, (inner, 3), np.float32)
    w = random_array(rng, (3,), np.float32)
    cases = [
        # weights shared by both levels
        ((xs, w), [(0, None), (0, None)]),
        # weights batched outside, shared inside
        ((xs, ws_outer), [(0, 0), (0, None)]),
        # weights shared outside, batched inside
        ((xs, ws_inner), [(0, None), (0, 0)]),
        # x shared outside (one row per inner index)
        ((xs[0], ws_outer), [(None, 0), (0, None)]),
    ]
    for args, levels in cases:
        got = nest(op, levels)(*args)
        np.testing.assert_array_equal(got, nested_loop(op, args, levels))
        calls, loops = custom_calls(nest(op, levels), *args)
        assert (calls, loops) == (1, 0), "not one flat batched call"
    decision = op.vmap_fold(xs[0, 0], w)
    assert decision.folds is (folds and method != "sequential"), decision


def test_depth_three_other_axes_and_out_axes(rng):
    op = numbax.numba_cuda_kernel(stencil, spec(N), launch_dims=N,
                                  threads_per_block=TPB)
    a, b, c = 2, 3, 4
    # x: the levels' axes at positions 2 (outer), 0 (middle), 1 (inner)
    # of the array as each level sees it.
    x = random_array(rng, (b, c, a, N), np.float32)
    w = random_array(rng, (c, 3), np.float32)
    levels = [(2, None), (0, None), (0, 0)]
    f = nest(op, levels, out_axes_per_level=[1, 0, 1])
    got = np.asarray(f(x, w))
    ref = nested_loop(op, (x, w), levels)  # (a, b, c, N)
    # out_axes 1, 0, 1 (outermost first): c after N inside, b in front,
    # a second: (b, a, N, c).
    np.testing.assert_array_equal(got, ref.transpose(1, 0, 3, 2))
    assert custom_calls(f, x, w) == (1, 0)


def test_depth_three_per_slice_kernel(rng):
    op = numbax.numba_cuda_kernel(stencil_reads_grid, spec(N), launch_dims=N,
                                  threads_per_block=TPB)
    x = random_array(rng, (2, 2, 3, N), np.float32)
    w = random_array(rng, (2, 3), np.float32)
    levels = [(0, None), (0, 0), (0, None)]
    np.testing.assert_array_equal(nest(op, levels)(x, w),
                                  nested_loop(op, (x, w), levels))
    assert not op.vmap_fold(x[0, 0, 0], w[0]).folds


@pytest.mark.parametrize("shared", [(None, None), (0, None), (None, 0),
                                    (0, 0)])
def test_aliased_accumulator_at_each_level(rng, shared):
    # acc is written in place: wherever a level shares it, every slice
    # still needs (and gets) its own copy, and the caller's is untouched.
    op = numbax.numba_cuda_kernel(accumulate, (spec(N), spec(N)),
                                  launch_dims=N, threads_per_block=TPB,
                                  input_output_aliases={1: 0})
    outer, inner = 2, 3
    x = random_array(rng, (outer, inner, N), np.float32)
    acc_shape = {(None, None): (N,), (0, None): (outer, N),
                 (None, 0): (inner, N), (0, 0): (outer, inner, N)}[shared]
    acc = random_array(rng, acc_shape, np.float32)
    before = acc.copy()
    levels = [(0, shared[0]), (0, shared[1])]
    got = nest(op, levels)(x, acc)
    ref = nested_loop(op, (x, acc), levels)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    np.testing.assert_array_equal(acc, before)
    assert op.vmap_fold(x[0, 0], acc.reshape(-1, N)[0]).folds


def test_split_above_the_axis_limit_nested(rng, monkeypatch):
    # 3 x 5 = 15 slices with a limit of 4 per launch: 4 launches over
    # consecutive flat slices, in the simulator too.
    monkeypatch.setattr(_fold, "MAX_SLICES_PER_LAUNCH", 4)
    op = numbax.numba_cuda_kernel(stencil, spec(N), launch_dims=N,
                                  threads_per_block=TPB, name="nested_split")
    x = random_array(rng, (3, 5, N), np.float32)
    w = random_array(rng, (5, 3), np.float32)
    levels = [(0, None), (0, 0)]
    np.testing.assert_array_equal(nest(op, levels)(x, w),
                                  nested_loop(op, (x, w), levels))


def test_over_65535_total_slices(rng):
    # Above CUDA's 65535 blocks on grid axis z: two launches. The simulator
    # runs 2 x 32769 = 65538 slices of 2 (about 20 s there); a GPU 300 x 250
    # of 5, and compares with the per-slice twin (it reads gridDim.y/z, so
    # each slice is a launch of its own, from C++): the per-slice loop.
    outer, inner, n = (2, 32769, 2) if SIMULATOR else (300, 250, 5)
    rev = numbax.numba_cuda_kernel(reverse, spec(n), launch_dims=n)
    x = random_array(rng, (outer, inner, n), np.float32)
    np.testing.assert_array_equal(
        jax.jit(jax.vmap(jax.vmap(rev)))(x), x[..., ::-1])
    decision = rev.vmap_fold(x[0, 0])
    assert decision.folds and decision.launches(outer, inner) == 2
    if SIMULATOR:
        return
    w = np.array([0, 1, 0], np.float32)  # stencil as the identity
    folded = numbax.numba_cuda_kernel(stencil, spec(n), launch_dims=n)
    per_slice = numbax.numba_cuda_kernel(stencil_reads_grid, spec(n),
                                         launch_dims=n)
    levels = [(0, None), (0, None)]
    got = np.asarray(nest(folded, levels)(x, w))
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(got, nest(per_slice, levels)(x, w))
    assert folded.vmap_fold(x[0, 0], w).folds


def test_empty_levels(rng):
    op = numbax.numba_cuda_kernel(reverse, spec(N), launch_dims=N)
    for shape in [(0, 3, N), (3, 0, N)]:
        out = jax.jit(jax.vmap(jax.vmap(op)))(np.zeros(shape, np.float32))
        assert out.shape == shape


def test_fold_decision_explains_nesting(rng):
    op = numbax.numba_cuda_kernel(reverse, spec(N), launch_dims=N)
    x = random_array(rng, (N,), np.float32)
    decision = op.vmap_fold(x)
    assert decision.folds
    assert decision.launches(16, 16) == 1
    assert decision.launches(300, 250) == 2
    assert "nested" in decision.explain(16, 16)
    per = numbax.numba_cuda_kernel(stencil_reads_grid, spec(N),
                                   launch_dims=N).vmap_fold(x, x[:3])
    assert per.launches(4, 5, 6) == 120
    assert "120 launches" in per.explain(4, 5, 6)


# -- XLACustomKernel's default rule and callables ------------------------------

def test_custom_kernel_nested_is_one_call(rng):
    op = XLACustomKernel("nested_vmap_stencil")

    @op.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(
            stencil, outs, launch_dims=outs.shape[0], threads_per_block=TPB)

    def call(v, w):
        return op(v, w, outs=spec(N))

    x = random_array(rng, (2, 3, 2, N), np.float32)
    w = random_array(rng, (3, 3), np.float32)
    levels = [(0, None), (0, 0), (0, None)]
    f = nest(call, levels)
    np.testing.assert_array_equal(f(x, w), nested_loop(call, (x, w), levels))
    assert custom_calls(f, x, w) == (1, 0)


def test_custom_kernel_with_a_rule_keeps_the_loop(rng):
    # A rule of its own (even one that declines) must see every level.
    op = XLACustomKernel("nested_vmap_rule")
    seen = []

    @op.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(reverse, outs,
                                        launch_dims=outs.shape[0])

    @op.def_batching_rule
    def _(args, axes, *, outs):
        seen.append(tuple(axes))
        return NotImplemented

    x = random_array(rng, (2, 3, N), np.float32)
    out = jax.jit(jax.vmap(jax.vmap(lambda v: op(v, outs=spec(N)))))(x)
    np.testing.assert_array_equal(out, x[..., ::-1])
    assert len(seen) >= 2


@pytest.mark.parametrize("method, partitionable",
                         list(itertools.product(["expand_dims", "broadcast_all"],
                                                [False, True])))
def test_callable_nested_gets_every_level(rng, method, partitionable):
    if partitionable and method == "broadcast_all":
        pytest.skip("covered by expand_dims: the same batch rule")
    shapes = []

    def add(x, y, out, stream):
        # As for one level: the batched buffers, every vmap axis in front
        # (a shared input keeps extent 1 there with 'expand_dims').
        shapes.append((x.shape, y.shape, out.shape))
        total = (np.broadcast_to(x.copy_to_host(), out.shape)
                 + np.broadcast_to(y.copy_to_host(), out.shape))
        out.copy_to_device(np.ascontiguousarray(total))

    op = numbax.numba_cuda_callable(add, spec(4), vmap_method=method,
                                    batch_partitionable=partitionable)
    x = random_array(rng, (2, 3, 4), np.float32)
    y = random_array(rng, (3, 4), np.float32)
    got = jax.jit(jax.vmap(jax.vmap(op), in_axes=(0, None)))(x, y)
    np.testing.assert_array_equal(got, x + y[None])
    y_shape = (1, 3, 4) if method == "expand_dims" else (2, 3, 4)
    assert shapes[-1] == ((2, 3, 4), y_shape, (2, 3, 4))


# -- bf16 kernels fold ----------------------------------------------------------

def test_bf16_intrinsics_fold_nested(gpu_only, rng):
    import ml_dtypes
    from numba.cuda.bf16 import hfma

    @cuda.jit
    def fma(x, y, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = hfma(x[i], y[i], x[i])

    bf16 = ml_dtypes.bfloat16
    op = numbax.numba_cuda_kernel(fma, spec(N, dtype=jnp.bfloat16),
                                  launch_dims=N)
    x = rng.standard_normal((3, 4, N)).astype(np.float32).astype(bf16)
    y = rng.standard_normal((4, N)).astype(np.float32).astype(bf16)
    levels = [(0, None), (0, 0)]
    got = nest(op, levels)(x, y)
    np.testing.assert_array_equal(
        np.asarray(got).view(np.uint16),
        np.asarray(nested_loop(op, (x, y), levels)).view(np.uint16))
    decision = op.vmap_fold(x[0, 0], y[0])
    assert decision.folds, decision


_LINK_CHECK = textwrap.dedent("""
    import os
    import numba.cuda
    import numba.cuda._internal.cuda_bf16 as bf16
    import numba.cuda._internal.cuda_fp16 as fp16
    from numba.cuda import CUSource
    from numbax import _fold

    class Library:
        def __init__(self, files):
            self._linking_files = files

        def get_asm_str(self):
            return "mov.u32 %r1, %ctaid.x;"

    class Compiled:
        def __init__(self, files):
            self._codelibrary = Library(files)

    def reads(*files):
        return _fold.axes_read_by_compiled(Compiled(list(files)))

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


def test_linked_code_numbax_reads_through():
    # numba-cuda's real linkable objects exist outside the simulator only;
    # no GPU is needed to build them, so a child without CUDASIM checks.
    env = {k: v for k, v in os.environ.items()
           if k != "NUMBA_ENABLE_CUDASIM"}
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run([sys.executable, "-c", _LINK_CHECK], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


# -- per-slice batches: launched from C++, replayed from a graph --------------

def test_per_slice_batch_replays_a_graph(gpu_only, rng):
    # 64 slices of a kernel that cannot fold: the second call with the same
    # buffers records the launches into a graph, later ones replay it. Each
    # call scales x inside the program, so the kernel's input sits in XLA's
    # temporary buffer (the same address every call) with new contents:
    # replays must read them, not what was there when recording.
    op = numbax.numba_cuda_kernel(stencil_reads_grid, spec(N), launch_dims=N,
                                  threads_per_block=TPB)
    x = random_array(rng, (8, 8, N), np.float32)
    w = random_array(rng, (3,), np.float32)
    f = jax.jit(lambda x, k, w: jax.vmap(jax.vmap(
        op, in_axes=(0, None)), in_axes=(0, None))(x * k, w))
    numbax.reset_bridge_counters()
    for k in [1.0, 2.0, -0.5, 3.0, 0.25]:
        got = np.asarray(f(x, np.float32(k), w))
        want = nested_loop(op, (x * np.float32(k), w),
                           [(0, None), (0, None)])
        np.testing.assert_array_equal(got, want)
        del got
    counters = numbax.bridge_counters()
    assert counters["slice_graph_records"] >= 1, counters
    assert counters["slice_graph_replays"] >= 1, counters


def test_sequential_slices_run_in_order(gpu_only, rng):
    # 'sequential' keeps meaning one slice after another (a kernel that
    # could fold does not): 40 slices from one call, equal to the loop.
    op = numbax.numba_cuda_kernel(stencil, spec(N), launch_dims=N,
                                  vmap_method="sequential")
    x = random_array(rng, (5, 8, N), np.float32)
    w = random_array(rng, (8, 3), np.float32)
    levels = [(0, None), (0, 0)]
    f = nest(op, levels)
    want = nested_loop(op, (x, w), levels)
    for _ in range(3):  # plain, recorded, replayed
        np.testing.assert_array_equal(f(x, w), want)
    assert custom_calls(f, x, w) == (1, 0)
    assert not op.vmap_fold(x[0, 0], w[0]).folds
