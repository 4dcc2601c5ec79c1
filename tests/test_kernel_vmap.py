"""jax.vmap of a numba_cuda_kernel gives what the per-slice loop gives.

Every batched result, of one vmap level or of nested ones (whose levels
flatten into one batch), is compared bit for bit with the unbatched op
applied to each slice, on fresh random data: kernels that fold (the whole
batch in one launch), kernels that cannot (one launch per slice, from one
handler call), 'sequential' ones, broadcast (``in_axes=None``) inputs,
other in_axes/out_axes, aliased buffers, several outputs, empty batches and
batches above CUDA's 65535 blocks per axis; also XLACustomKernel's default
batching, export of a folded vmap, and graph replays of per-slice batches.
Runs in the simulator (small sizes; the generated batched kernel runs there
too) and, marked `gpu`, on a GPU (larger sizes). How the fold is decided:
test_kernel_vmap_fold.py.

vmap of a kernel that reads blockIdx.y and .z (no free grid axis to fold
the batch on) launches it slice by slice from C++, and replays a CUDA graph
of those launches for 16 or more slices, keyed by buffer addresses: with
fresh inputs every call (addresses that move or repeat), with ops made anew
150 times (host memory bounded), from 4 threads at once, and while another
thread clears the graph caches, every result is numpy's. GPU only: the
simulator records no graphs.
"""

import itertools

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest
from numba import cuda

import numbax
from numbax.custom_kernel import XLACustomKernel
from numbax.kernel import vmap
from conftest import SIMULATOR, random_array
from shared_kernels import (block_sums, matrix_add, mirror_sum, reverse,
                            stencil, stencil_reads_grid)
import gc
import threading
import time
from conftest import assert_close, in_own_process, kernel_op

pytestmark = pytest.mark.gpu

F32 = jnp.float32
N = 16 if SIMULATOR else 4099  # not a multiple of the block
B = 3 if SIMULATOR else 37
TPB = 8 if SIMULATOR else 128
# Nested levels multiply the batch: a shorter row.
NESTED_N = 12 if SIMULATOR else 1031


# -- one level --------------------------------------------------------------

def spec(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def per_slice(op, *xs, in_axes=0):
    """The reference: the unbatched op on each slice, one call each."""
    if not isinstance(in_axes, (tuple, list)):
        in_axes = (in_axes,) * len(xs)
    size = next(x.shape[a] for x, a in zip(xs, in_axes) if a is not None)
    outs = []
    for s in range(size):
        args = [x if a is None else np.take(x, s, axis=a)
                for x, a in zip(xs, in_axes)]
        outs.append(jax.jit(op)(*args))
    if isinstance(outs[0], (tuple, list)):
        return tuple(np.stack([np.asarray(o[i]) for o in outs])
                     for i in range(len(outs[0])))
    return np.stack([np.asarray(o) for o in outs])


def assert_folded(op, *unbatched):
    decision = op.vmap_fold(*unbatched)
    assert decision.folds, decision
    assert op.fold_cache.batched_kernels, "no batched kernel was built"
    assert f"blockIdx.{decision.axis}" in repr(op)


@cuda.jit
def histogram(x, zeros, hist):
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.add(hist, x[i], 1)


@cuda.jit
def two_out(a, b, total, prod):
    i = cuda.grid(1)
    if i < a.shape[0]:
        total[i] = a[i] + b[i]
        prod[i] = a[i] * b[i]


@pytest.mark.parametrize("method", [None, "expand_dims", "broadcast_all",
                                    "legacy_vectorized"])
def test_reversal_folds_for_every_method(rng, method):
    op = numbax.numba_cuda_kernel(reverse, spec(N), launch_dims=N,
                                  threads_per_block=TPB, vmap_method=method)
    x = random_array(rng, (B, N), np.float32)
    out = np.asarray(jax.jit(jax.vmap(op))(x))
    np.testing.assert_array_equal(out, x[:, ::-1])
    np.testing.assert_array_equal(out, per_slice(op, x))
    assert_folded(op, x[0])
    # Unbatched calls of the same op are unchanged.
    np.testing.assert_array_equal(jax.jit(op)(x[1]), x[1, ::-1])


def test_batch_one_and_other_in_axes(rng):
    op = numbax.numba_cuda_kernel(reverse, spec(N), launch_dims=N,
                                  threads_per_block=TPB)
    x = random_array(rng, (1, N), np.float32)
    np.testing.assert_array_equal(jax.vmap(op)(x), x[:, ::-1])
    xt = random_array(rng, (N, B), np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(op, in_axes=1))(xt),
                                  xt.T[:, ::-1])
    assert_folded(op, x[0])


def test_stencil_with_broadcast_weights(rng):
    op = numbax.numba_cuda_kernel(stencil, spec(N), launch_dims=N,
                                  threads_per_block=TPB,
                                  vmap_method="expand_dims")
    xs = random_array(rng, (B, N), np.float32)
    w = random_array(rng, (3,), np.float32)
    ref = per_slice(op, xs, w, in_axes=(0, None))
    np.testing.assert_array_equal(
        jax.jit(jax.vmap(op, in_axes=(0, None)))(xs, w), ref)
    # A batched weight of leading size 1 is broadcast (slice 0 for all).
    w1 = jnp.asarray(w)[None]
    np.testing.assert_array_equal(
        jax.jit(jax.vmap(op))(xs, jnp.broadcast_to(w1, (B, 3))), ref)
    assert_folded(op, xs[0], w)


def test_shared_memory_block_reduction(rng):
    blocks = -(-N // TPB)
    op = numbax.numba_cuda_kernel(block_sums, spec(blocks), launch_dims=N,
                                  threads_per_block=TPB,
                                  shared_mem=TPB * 4)
    x = random_array(rng, (B, N), np.float32)
    out = np.asarray(jax.jit(jax.vmap(op))(x))
    np.testing.assert_array_equal(out, per_slice(op, x))
    padded = np.zeros((B, blocks * TPB), np.float32)
    padded[:, :N] = x
    np.testing.assert_allclose(out, padded.reshape(B, blocks, TPB).sum(-1),
                               rtol=1e-4, atol=1e-4)
    assert_folded(op, x[0])


def test_atomic_histogram_per_slice_and_aliasing(rng):
    bins = 8
    op = numbax.numba_cuda_kernel(histogram, spec(bins, dtype=jnp.int32),
                                  launch_dims=N, threads_per_block=TPB,
                                  input_output_aliases={1: 0})
    x = rng.integers(0, bins, size=(B, N)).astype(np.int32)
    zeros = np.zeros(bins, np.int32)
    expected = np.stack([np.bincount(r, minlength=bins) for r in x])
    # The aliased zero buffer is shared (in_axes=None): every slice needs
    # its own copy, since the kernel adds into it.
    out = jax.jit(jax.vmap(op, in_axes=(0, None)))(x, zeros)
    np.testing.assert_array_equal(out, expected)
    out = jax.jit(jax.vmap(op))(x, np.zeros((B, bins), np.int32))
    np.testing.assert_array_equal(out, expected)
    assert_folded(op, x[0], zeros)


def test_several_outputs(rng):
    op = numbax.numba_cuda_kernel(two_out, (spec(N), spec(N)),
                                  launch_dims=N, threads_per_block=TPB)
    a, b = (random_array(rng, (B, N), np.float32) for _ in range(2))
    total, prod = jax.jit(jax.vmap(op))(a, b)
    ref_total, ref_prod = per_slice(op, a, b)
    np.testing.assert_array_equal(total, ref_total)
    np.testing.assert_array_equal(prod, ref_prod)
    np.testing.assert_array_equal(total, a + b)
    assert_folded(op, a[0], b[0])


def test_zero_extent_slices_and_empty_batch(rng):
    @cuda.jit
    def poison(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = 123.0

    op = numbax.numba_cuda_kernel(poison, spec(N), launch_dims=(N, 0))
    out = jax.jit(jax.vmap(op))(random_array(rng, (B, N), np.float32))
    np.testing.assert_array_equal(out, np.zeros((B, N), np.float32))
    rev = numbax.numba_cuda_kernel(reverse, spec(N), launch_dims=N)
    empty = jax.jit(jax.vmap(rev))(np.zeros((0, N), np.float32))
    assert empty.shape == (0, N)


def test_batches_above_the_axis_limit_split(rng, monkeypatch):
    # CUDA allows 65535 blocks on y and z; a smaller limit here exercises
    # the same split (several launches over consecutive slices).
    monkeypatch.setattr(vmap, "MAX_SLICES_PER_LAUNCH", 3)
    op = numbax.numba_cuda_kernel(stencil, spec(N), launch_dims=N,
                                  threads_per_block=TPB)
    batch = 3 * 2 + 2
    xs = random_array(rng, (batch, N), np.float32)
    w = random_array(rng, (3,), np.float32)
    out = jax.jit(jax.vmap(op, in_axes=(0, None)))(xs, w)  # w: broadcast
    np.testing.assert_array_equal(
        out, per_slice(op, xs, w, in_axes=(0, None)))
    assert_folded(op, xs[0], w)


def test_large_batch_over_65535_slices(gpu_only, rng):
    # The real limit: 70000 slices of 4 take two launches on axis z.
    n, batch = 4, 70_000
    op = numbax.numba_cuda_kernel(reverse, spec(n), launch_dims=n)
    x = random_array(rng, (batch, n), np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(op))(x), x[:, ::-1])
    assert_folded(op, x[0])


def test_two_d_launch_and_explicit_grid_fold_on_z(rng):
    shape = (9, 13) if SIMULATOR else (37, 53)
    op = numbax.numba_cuda_kernel(matrix_add, spec(*shape),
                                  launch_dims=shape)
    a, b = (random_array(rng, (B,) + shape, np.float32) for _ in range(2))
    np.testing.assert_array_equal(jax.jit(jax.vmap(op))(a, b), a + b)
    assert op.vmap_fold(a[0], b[0]).axis == "z"
    explicit = numbax.numba_cuda_kernel(
        matrix_add, spec(*shape), grid=(-(-shape[0] // 8), -(-shape[1] // 8)),
        block=(8, 8))
    np.testing.assert_array_equal(jax.jit(jax.vmap(explicit))(a, b), a + b)
    assert_folded(explicit, a[0], b[0])


# -- fallbacks: still per slice, still correct -----------------------------

@cuda.jit
def plus_block_z(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + cuda.blockIdx.z + cuda.gridDim.z


@cuda.jit
def grid3_reader(x, out):
    i, j, k = cuda.grid(3)
    if i < x.shape[0]:
        out[i] = x[i] + j + k + cuda.gridDim.y


def test_kernel_reading_z_folds_on_y(rng):
    op = numbax.numba_cuda_kernel(plus_block_z, spec(N), launch_dims=N,
                                  threads_per_block=TPB)
    x = random_array(rng, (B, N), np.float32)
    out = jax.jit(jax.vmap(op))(x)
    np.testing.assert_array_equal(out, x + 1)  # blockIdx.z 0, gridDim.z 1
    decision = op.vmap_fold(x[0])
    assert decision.folds and decision.axis == "y"


def test_kernel_reading_both_free_axes_falls_back(rng):
    op = numbax.numba_cuda_kernel(grid3_reader, spec(N), launch_dims=N,
                                  threads_per_block=TPB)
    x = random_array(rng, (B, N), np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(op))(x), x + 1)
    decision = op.vmap_fold(x[0])
    assert not decision.folds
    assert "reads grid axis z/y" in decision.reason
    assert "one launch per slice" in repr(op)
    assert not op.fold_cache.batched_kernels


@cuda.jit(device=True)
def _block_yz():
    return cuda.blockIdx.y + cuda.blockIdx.z


@cuda.jit
def plus_block_yz_via_device_function(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + _block_yz()


def test_reads_inside_device_functions_count(rng):
    # The read is in a device function the kernel calls: the compiled code
    # (GPU) or the followed bytecode (simulator) still shows it.
    op = numbax.numba_cuda_kernel(plus_block_yz_via_device_function, spec(N),
                                  launch_dims=N, threads_per_block=TPB)
    x = random_array(rng, (B, N), np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(op))(x), x)
    decision = op.vmap_fold(x[0])
    assert not decision.folds and "reads grid axis" in decision.reason


def test_fastmath_kernel_folds_bit_identically(rng):
    @cuda.jit(fastmath=True)
    def poly(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            v = x[i]
            out[i] = (v * v + numba.float32(0.5)) / (v + numba.float32(3.0))

    op = numbax.numba_cuda_kernel(poly, spec(N), launch_dims=N,
                                  threads_per_block=TPB)
    x = random_array(rng, (B, N), np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(op))(x), per_slice(op, x))
    assert_folded(op, x[0])


def test_three_axis_launch_falls_back(rng):
    @cuda.jit
    def scale3(x, out):
        i, j, k = cuda.grid(3)
        if i < x.shape[0] and j < x.shape[1] and k < x.shape[2]:
            out[i, j, k] = x[i, j, k] * (i + 1)

    shape = (9, 10, 5)
    op = numbax.numba_cuda_kernel(scale3, spec(*shape), launch_dims=shape)
    x = random_array(rng, (2,) + shape, np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(op))(x), per_slice(op, x))
    assert "all three grid axes" in op.vmap_fold(x[0]).reason
    assert "all three grid axes" in repr(op)  # known without compiling


def test_sequential_loops_and_says_so(rng):
    op = numbax.numba_cuda_kernel(reverse, spec(N), launch_dims=N,
                                  vmap_method="sequential")
    x = random_array(rng, (B, N), np.float32)
    np.testing.assert_array_equal(jax.jit(jax.vmap(op))(x), x[:, ::-1])
    assert "sequential" in op.vmap_fold(x[0]).reason
    assert "sequential" in repr(op)


def test_cooperative_kernel_falls_back(gpu_only, rng):
    n = 4096
    op = numbax.numba_cuda_kernel(mirror_sum, (spec(n), spec(n)),
                                  launch_dims=n)
    x = random_array(rng, (4, n), np.float32)
    doubled, out = jax.jit(jax.vmap(op))(x)
    np.testing.assert_array_equal(doubled, 2 * x)
    np.testing.assert_array_equal(out, 2 * x + 2 * x[:, ::-1])
    decision = op.vmap_fold(x[0])
    assert not decision.folds and "cooperative" in decision.reason


# -- nested vmaps: every level flattened into one batch --------------------

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


def test_nested_vmap_runs(rng):
    # Once refused; now every level flattens into one batch (more below).
    op = numbax.numba_cuda_kernel(reverse, spec(8), launch_dims=8,
                                  vmap_method="expand_dims")
    x = random_array(rng, (2, 3, 8), np.float32)
    np.testing.assert_array_equal(jax.vmap(jax.vmap(op))(x), x[..., ::-1])


@pytest.mark.parametrize("kernel, folds", [(stencil, True),
                                           (stencil_reads_grid, False)])
@pytest.mark.parametrize("method", [None, "expand_dims", "sequential"])
def test_depth_two_with_broadcast_at_each_level(rng, kernel, folds, method):
    op = numbax.numba_cuda_kernel(kernel, spec(NESTED_N), launch_dims=NESTED_N,
                                  threads_per_block=TPB, vmap_method=method)
    outer, inner = 3, 4
    xs = random_array(rng, (outer, inner, NESTED_N), np.float32)
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
    op = numbax.numba_cuda_kernel(stencil, spec(NESTED_N), launch_dims=NESTED_N,
                                  threads_per_block=TPB)
    a, b, c = 2, 3, 4
    # x: the levels' axes at positions 2 (outer), 0 (middle), 1 (inner)
    # of the array as each level sees it.
    x = random_array(rng, (b, c, a, NESTED_N), np.float32)
    w = random_array(rng, (c, 3), np.float32)
    levels = [(2, None), (0, None), (0, 0)]
    f = nest(op, levels, out_axes_per_level=[1, 0, 1])
    got = np.asarray(f(x, w))
    ref = nested_loop(op, (x, w), levels)  # (a, b, c, NESTED_N)
    # out_axes 1, 0, 1 (outermost first): c after NESTED_N inside, b in front,
    # a second: (b, a, NESTED_N, c).
    np.testing.assert_array_equal(got, ref.transpose(1, 0, 3, 2))
    assert custom_calls(f, x, w) == (1, 0)


def test_depth_three_per_slice_kernel(rng):
    op = numbax.numba_cuda_kernel(stencil_reads_grid, spec(NESTED_N), launch_dims=NESTED_N,
                                  threads_per_block=TPB)
    x = random_array(rng, (2, 2, 3, NESTED_N), np.float32)
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
    op = numbax.numba_cuda_kernel(accumulate, (spec(NESTED_N), spec(NESTED_N)),
                                  launch_dims=NESTED_N, threads_per_block=TPB,
                                  input_output_aliases={1: 0})
    outer, inner = 2, 3
    x = random_array(rng, (outer, inner, NESTED_N), np.float32)
    acc_shape = {(None, None): (NESTED_N,), (0, None): (outer, NESTED_N),
                 (None, 0): (inner, NESTED_N), (0, 0): (outer, inner, NESTED_N)}[shared]
    acc = random_array(rng, acc_shape, np.float32)
    before = acc.copy()
    levels = [(0, shared[0]), (0, shared[1])]
    got = nest(op, levels)(x, acc)
    ref = nested_loop(op, (x, acc), levels)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    np.testing.assert_array_equal(acc, before)
    assert op.vmap_fold(x[0, 0], acc.reshape(-1, NESTED_N)[0]).folds


def test_split_above_the_axis_limit_nested(rng, monkeypatch):
    # 3 x 5 = 15 slices with a limit of 4 per launch: 4 launches over
    # consecutive flat slices, in the simulator too.
    monkeypatch.setattr(vmap, "MAX_SLICES_PER_LAUNCH", 4)
    op = numbax.numba_cuda_kernel(stencil, spec(NESTED_N), launch_dims=NESTED_N,
                                  threads_per_block=TPB, name="nested_split")
    x = random_array(rng, (3, 5, NESTED_N), np.float32)
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
    op = numbax.numba_cuda_kernel(reverse, spec(NESTED_N), launch_dims=NESTED_N)
    for shape in [(0, 3, NESTED_N), (3, 0, NESTED_N)]:
        out = jax.jit(jax.vmap(jax.vmap(op)))(np.zeros(shape, np.float32))
        assert out.shape == shape


def test_bf16_intrinsics_fold_nested(gpu_only, rng):
    import ml_dtypes
    from numba.cuda.bf16 import hfma

    @cuda.jit
    def fma(x, y, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = hfma(x[i], y[i], x[i])

    bf16 = ml_dtypes.bfloat16
    op = numbax.numba_cuda_kernel(fma, spec(NESTED_N, dtype=jnp.bfloat16),
                                  launch_dims=NESTED_N)
    x = rng.standard_normal((3, 4, NESTED_N)).astype(np.float32).astype(bf16)
    y = rng.standard_normal((4, NESTED_N)).astype(np.float32).astype(bf16)
    levels = [(0, None), (0, 0)]
    got = nest(op, levels)(x, y)
    np.testing.assert_array_equal(
        np.asarray(got).view(np.uint16),
        np.asarray(nested_loop(op, (x, y), levels)).view(np.uint16))
    decision = op.vmap_fold(x[0, 0], y[0])
    assert decision.folds, decision


# -- XLACustomKernel's default batching, and callables ---------------------

def test_custom_kernel_default_batching_folds(rng):
    made = []
    op = XLACustomKernel("vmap_fold_reverse")

    @op.def_numba_cuda_kernel
    def _(*, outs):
        made.append(numbax.numba_cuda_kernel(
            reverse, outs, launch_dims=outs.shape[0], threads_per_block=TPB))
        return made[-1]

    x = random_array(rng, (B, N), np.float32)
    out = jax.jit(jax.vmap(lambda v: op(v, outs=spec(N))))(x)
    np.testing.assert_array_equal(out, x[:, ::-1])
    assert len(made) == 1
    assert_folded(made[0], x[0])
    # Nested vmap: the kernel's batching, every level in one batch.
    x3 = random_array(rng, (2, B, N), np.float32)
    nested = jax.jit(jax.vmap(jax.vmap(lambda v: op(v, outs=spec(N)))))
    np.testing.assert_array_equal(nested(x3), x3[..., ::-1])
    assert "stablehlo.while" not in nested.lower(x3).as_text()


def test_custom_kernel_nested_is_one_call(rng):
    op = XLACustomKernel("nested_vmap_stencil")

    @op.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(
            stencil, outs, launch_dims=outs.shape[0], threads_per_block=TPB)

    def call(v, w):
        return op(v, w, outs=spec(NESTED_N))

    x = random_array(rng, (2, 3, 2, NESTED_N), np.float32)
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

    x = random_array(rng, (2, 3, NESTED_N), np.float32)
    out = jax.jit(jax.vmap(jax.vmap(lambda v: op(v, outs=spec(NESTED_N)))))(x)
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


# -- export ----------------------------------------------------------------

_EXPORT_FOLDED = """
import sys, jax, jax.numpy as jnp, numpy as np, numbax
from numba import cuda

@cuda.jit
def add_one(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 1

op = numbax.numba_cuda_kernel(add_one, jax.ShapeDtypeStruct((8,), jnp.float32),
                              launch_dims=8, name="test_kernel_vmap.add_one")
x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8)
if sys.argv[1] == "export":
    assert op.vmap_fold(jax.ShapeDtypeStruct((8,), jnp.float32)).folds
    exp = jax.export.export(jax.jit(jax.vmap(op)),
                            disabled_checks=numbax.export_disabled_checks())(x)
    open(sys.argv[2], "wb").write(exp.serialize())
else:  # a fresh process that only created the op
    exp = jax.export.deserialize(bytearray(open(sys.argv[2], "rb").read()))
    np.testing.assert_array_equal(exp.call(x), np.asarray(x) + 1)
    print("LOADED")
"""


@pytest.mark.usefixtures("simulator_only")
def test_exported_folded_vmap_runs_in_a_fresh_process(tmp_path):
    # Before: the folded call's key held "fold=z/65535", whose "/" split the
    # key in the wrong place, so only the exporting process could run it.
    import os
    import subprocess
    import sys
    blob = tmp_path / "folded.bin"
    for stage in ("export", "load"):
        result = subprocess.run(
            [sys.executable, "-c", _EXPORT_FOLDED, stage, str(blob)],
            capture_output=True, text=True, timeout=300, env=dict(os.environ))
        assert result.returncode == 0, result.stderr[-3000:]
    assert "LOADED" in result.stdout


# -- per-slice batches: launched from C++, replayed from a graph -----------

def test_per_slice_batch_replays_a_graph(gpu_only, rng):
    # 64 slices of a kernel that cannot fold: the second call with the same
    # buffers records the launches into a graph, later ones replay it. Each
    # call scales x inside the program, so the kernel's input sits in XLA's
    # temporary buffer (the same address every call) with new contents:
    # replays must read them, not what was there when recording.
    op = numbax.numba_cuda_kernel(stencil_reads_grid, spec(NESTED_N), launch_dims=NESTED_N,
                                  threads_per_block=TPB)
    x = random_array(rng, (8, 8, NESTED_N), np.float32)
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
    op = numbax.numba_cuda_kernel(stencil, spec(NESTED_N), launch_dims=NESTED_N,
                                  vmap_method="sequential")
    x = random_array(rng, (5, 8, NESTED_N), np.float32)
    w = random_array(rng, (8, 3), np.float32)
    levels = [(0, None), (0, 0)]
    f = nest(op, levels)
    want = nested_loop(op, (x, w), levels)
    for _ in range(3):  # plain, recorded, replayed
        np.testing.assert_array_equal(f(x, w), want)
    assert custom_calls(f, x, w) == (1, 0)
    assert not op.vmap_fold(x[0, 0], w[0]).folds


N_GPU = 4096


@cuda.jit
def reads_grid_y(x, out):
    # Reads blockIdx.y and .z (0 in a 1-D launch): no free axis to fold on.
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 2 + cuda.blockIdx.y + cuda.blockIdx.z


def per_slice_program():
    return jax.jit(jax.vmap(kernel_op(reads_grid_y, (N_GPU,), jnp.float32)))


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.usefixtures("gpu_only", "x64")
def test_graphs_replayed_with_moving_buffers(rng):
    numbax.reset_bridge_counters()
    f = per_slice_program()
    for k in range(40):
        xs = rng.standard_normal((32, N_GPU)).astype(np.float32)
        assert_close(f(xs), xs * 2, f"call {k}")
    counters = numbax.bridge_counters()
    assert counters["slice_graph_replays"] > 0, counters


@pytest.mark.usefixtures("gpu_only", "x64")
def test_ops_made_anew_150_times_keep_host_memory_bounded(rng):
    x = rng.standard_normal(N_GPU).astype(np.float32)
    rss = []
    for k in range(150):
        b = 16 + k % 37
        xs = np.broadcast_to(x, (b, N_GPU)) + np.arange(b, dtype=np.float32)[:, None]
        assert_close(per_slice_program()(xs), xs * 2, f"round {k}")
        if k % 50 == 49:
            jax.clear_caches()
            numbax.clear_caches()
            gc.collect()
            rss.append(rss_mib())
    grew = rss[-1] - rss[0]
    assert grew < 64, f"RSS grew {grew:.1f} MiB over the last 100 rounds: {rss}"


@pytest.mark.usefixtures("gpu_only", "x64")
def test_one_program_from_four_threads():
    f = per_slice_program()
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for k in range(25):
                xs = rng.standard_normal((24, N_GPU)).astype(np.float32)
                assert_close(f(xs), xs * 2, f"thread {seed} call {k}")
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(f"thread {seed}: {exc}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[:2]


# A replay must not launch a graph that another thread's clear_caches() (or
# an eviction) destroyed between finding it and launching it: the cache
# finds and launches under one lock. Its own process: a launch of a
# destroyed graph could leave the context broken.
@pytest.mark.usefixtures("gpu_only", "x64")
@in_own_process()
def test_replays_while_another_thread_clears_the_caches(rng):
    f = per_slice_program()
    xs = [rng.standard_normal((32, N_GPU)).astype(np.float32) for _ in range(2)]
    inputs = [jax.device_put(x) for x in xs]
    numbax.set_graph_cache_size(1)
    stop = threading.Event()
    clears = [0]

    def clear():
        while not stop.is_set():
            numbax.clear_caches()
            clears[0] += 1
            time.sleep(0.0005)  # leaves calls time to record and replay

    clearer = threading.Thread(target=clear)
    clearer.start()
    numbax.reset_bridge_counters()
    try:
        for k in range(400):
            # Runs of one input, each output freed before the next call: the
            # same addresses come back, so graphs are recorded and replayed.
            which = (k // 10) % 2
            out = f(inputs[which])
            if k % 25 == 24:
                assert_close(out, xs[which] * 2, f"call {k}")
            del out
    finally:
        stop.set()
        clearer.join(60)
        numbax.set_graph_cache_size(16)
    counters = numbax.bridge_counters()
    assert clears[0] > 0 and counters["slice_graph_replays"] > 0, (clears, counters)
