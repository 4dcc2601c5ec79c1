"""jax.vmap of numba_cuda_kernel: one launch per batch where provably the same.

Every folded result is compared bit for bit with the per-slice path (the
unbatched op applied to each slice), on fresh random data. The same tests
run in the simulator (small sizes; the generated batched kernel runs there
too) and, marked `gpu`, on a real GPU (larger sizes).
"""

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest
from numba import cuda

import numbax
from numbax import _fold
from numbax.custom_kernel import XLACustomKernel
from conftest import SIMULATOR, random_array
# Kernels that couple the elements of a slice, shared with test_kernel.py.
from test_kernel import reverse, stencil

pytestmark = pytest.mark.gpu

F32 = jnp.float32
N = 16 if SIMULATOR else 4099  # not a multiple of the block
B = 3 if SIMULATOR else 37
TPB = 8 if SIMULATOR else 128


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
    assert op._batched_kernels, "no batched kernel was built"
    assert f"blockIdx.{decision.axis}" in repr(op)


@cuda.jit
def block_sums(x, out):
    buf = cuda.shared.array(0, dtype=numba.float32)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    buf[tid] = x[i] if i < x.shape[0] else 0
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            buf[tid] += buf[tid + stride]
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        out[cuda.blockIdx.x] = buf[0]


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
    monkeypatch.setattr(_fold, "MAX_SLICES_PER_LAUNCH", 3)
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


@cuda.jit
def matrix_add(a, b, out):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = a[i, j] + b[i, j]


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
    assert not op._batched_kernels


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


@cuda.jit
def mirror_sum(x, doubled, out):
    grid = cuda.cg.this_grid()
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        doubled[i] = 2 * x[i]
    grid.sync()
    if i < n:
        out[i] = doubled[i] + doubled[n - 1 - i]


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


def test_nested_vmap_runs(rng):
    # Once refused; now every level flattens into one batch (more in
    # test_nested_vmap.py).
    op = numbax.numba_cuda_kernel(reverse, spec(8), launch_dims=8,
                                  vmap_method="expand_dims")
    x = random_array(rng, (2, 3, 8), np.float32)
    np.testing.assert_array_equal(jax.vmap(jax.vmap(op))(x), x[..., ::-1])


# -- XLACustomKernel's default batching rule ---------------------------------

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


# -- the rule itself -----------------------------------------------------------

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
    decision = _fold.decide(**kwargs)
    assert decision.folds is folds
    assert text in decision.reason


def test_ptx_reads():
    ptx = "mov.u32 %r1, %ctaid.x;\nmov.u32 %r2, %ntid.x;\nmov.u32 %r3, %tid.z;"
    assert _fold.axes_read_by_ptx(ptx) == {0}
    assert _fold.axes_read_by_ptx("mov.u32 %r9, %nctaid.z;") == {2}
    assert _fold.axes_read_by_ptx("mov.v4.u32 {%r1,%r2,%r3,%r4}, %ctaid;") \
        == {0, 1, 2}
    assert _fold.axes_read_by_ptx("mov.u32 %r1, %clusterid.x;") == {0, 1, 2}


def _helper_reads_y():
    return cuda.blockIdx.y


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

    assert _fold.axes_read_by_python(k1) == (frozenset({0}), None)
    assert _fold.axes_read_by_python(k2) == (frozenset({0, 1}), None)
    assert _fold.axes_read_by_python(k3) == (frozenset({1}), None)
    assert _fold.axes_read_by_python(k4) == (frozenset({0, 1, 2}), None)


# -- issue 11 part 2: the launch configuration is checked first ----------------

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
        numbax.numba_cuda_kernel(_plain_python, spec(4), **kwargs)

    def no_numba():
        raise ImportError("numbax needs Numba with CUDA support (test)")

    monkeypatch.setattr(numbax._numba, "require_cuda", no_numba)
    with pytest.raises(ValueError, match=match):
        numbax.numba_cuda_kernel(reverse, spec(4), **kwargs)


def test_valid_configuration_then_type_error_or_import_error(monkeypatch):
    with pytest.raises(TypeError, match="@cuda.jit"):
        numbax.numba_cuda_kernel(_plain_python, spec(4), launch_dims=4,
                                 vmap_method="broadcast_all")

    def no_numba():
        raise ImportError("numbax needs Numba with CUDA support (test)")

    monkeypatch.setattr(numbax._numba, "require_cuda", no_numba)
    with pytest.raises(ImportError, match="Numba with CUDA support"):
        numbax.numba_cuda_kernel(_plain_python, spec(4), launch_dims=4)


# -- the workload benchmarks run (tiny in the simulator) -----------------------

def test_workload_benchmarks_run_and_check(rng):
    from numbax.bench import timing, workloads
    cfg = (workloads.WorkloadConfig.cpu_smoke() if SIMULATOR else
           workloads.WorkloadConfig(vmap_shapes=((16, 1024),), vmap_rounds=2,
                                    nested_shape=(4, 4, 1024),
                                    bf16_shape=(16, 1024),
                                    per_slice_shape=(64, 256),
                                    vmap_runs=1, neurons=2000, fan_out=10,
                                    steps=20, snn_rounds=2))
    logged = []
    vmap_rows = workloads.run_vmap(cfg, rng, timing, logged.append)
    bf16 = [r for r in vmap_rows if "bf16" in r["name"]]
    rest = [r for r in vmap_rows if r not in bf16]
    assert {r["status"] for r in rest} == {"ok"}, vmap_rows
    if SIMULATOR:  # no bf16 intrinsics there: one row says so
        assert [r["status"][:8] for r in bf16] == ["skipped:"], bf16
    else:
        assert {r["status"] for r in bf16} == {"ok"}, bf16
        rest += bf16
    by_name = {}
    for r in rest:
        by_name.setdefault(r["name"], []).append(r)
    for name in ("numbax vmap, folded", "numbax nested vmap, folded",
                 "numbax bf16 vmap, folded"):
        assert all(r["vmap"].startswith("one launch per batch")
                   for r in by_name.get(name, [])), name
    for name in ("numbax vmap, per slice", "numbax vmap, per slice from C++",
                 "numbax vmap, sequential (C++)",
                 "numbax bf16 vmap, per slice"):
        assert all(r["vmap"].startswith("one launch per slice")
                   for r in by_name.get(name, [])), name
    assert by_name["numbax nested vmap, folded"][0]["B"] == "x".join(
        map(str, cfg.nested_shape[:-1]))
    assert "numbax per slice, XLA loop (lax.map)" in by_name
    assert all(r["us_per_call"] > 0 and r["us_per_slice"] > 0 for r in rest)
    snn_rows = workloads.run_snn(cfg, 7, timing, logged.append)
    assert len(snn_rows) == 4
    for r in snn_rows:
        assert r["status"] == "ok" and r["spikes_match_jax"], r
        assert r["us_per_step"] > 0 and r["first_call_s"] > 0
    assert snn_rows[0]["spikes_per_step"] > 0  # the network does spike
    table = workloads.format_tables(vmap_rows, snn_rows)
    assert "(d) numba_cuda_kernel, aliased zeros" in table


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
