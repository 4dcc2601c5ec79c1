"""Kernels compiled for explicit signatures (one, a list, or lazily with
overloads compiled beforehand) give numpy's results, into poisoned outputs,
on every path: numba_cuda_kernel under jit, eagerly and under vmap (beyond
65535 slices, broadcast and nested), a plain callable's fast launch (the same
bits as Numba's own launch, for arrays, views and scalars of every width), a
captured callable, an XLACustomKernel. A signature list picks the version
for the dtype; a tie is refused as ambiguous; an exact layout beats `A`.

Checks that rest on signatures the simulator ignores run on a GPU only;
the refusals that could hurt the CUDA context are in
test_gpu_signature_refusals.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import (KERNEL_VMAP_METHODS, SIMULATOR, assert_close, assert_raises, grid_for,
                      kernel_op, outcome, poison)
from shared_kernels import affine_cols_f32, affine_f32

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("x64")]

# The simulator runs every CUDA thread in Python: tiny sizes there.
N = 64 if SIMULATOR else 4096
M = 16 if SIMULATOR else 64  # the side of 2-D cases
OP = "numba_cuda_kernel("


@cuda.jit("void(float32[::1], float32[::1])")
def k_c1(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] - 5


@cuda.jit(["void(float32[:], float32[:])", "void(float64[:], float64[:])"])
def k_list(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 3 - 1


@cuda.jit(["void(float32[::1], float32[:])", "void(float32[:], float32[::1])"])
def k_tie(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 2


@cuda.jit(["void(float32[:], float32[:])", "void(float32[::1], float32[::1])"])
def k_exact(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * x[i]


@cuda.jit("void(int32[:], float32[:], float64[:])")
def k_mixed(x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * y[i]


@cuda.jit("void(complex64[:], complex64[:])")
def k_c64(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * x[i]


@cuda.jit("void(float16[:], float16[:])")
def k_f16(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + x[i]


@cuda.jit("void(boolean[:], boolean[:])")
def k_bool(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = not x[i]


@cuda.jit("void(float32[:], float32[:], int32, float32)")
def k_scal(x, out, a, b):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * b + a


@cuda.jit(["void(float32[:], float32[:], int32)", "void(float32[:], float32[:], float64)"])
def k_scal_list(x, out, s):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + s


@cuda.jit
def lazy_scale(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 4 - 3


@cuda.jit
def fill_nan_1d(out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = float("nan")


def f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def nonzero(counters):
    return {k: v for k, v in counters.items() if v}


# -- numba_cuda_kernel -------------------------------------------------------

def test_lazy_kernel_precompiled_then_other_types(rng):
    if not SIMULATOR:  # the simulator's kernels have no compile()
        lazy_scale.compile("void(float64[:], float64[:])")
    for dt in (np.float32, np.float64, np.int32, np.int64, np.float16):
        x = (rng.standard_normal(N) * 8).astype(dt)
        want = (x * 4 - 3).astype(dt)
        poison((N,), dt)
        got = jax.jit(kernel_op(lazy_scale, (N,), dt))(x)
        rtol, atol = (1e-2, 1e-2) if dt == np.float16 else (1e-6, 1e-5)
        assert_close(got, want, np.dtype(dt).name, rtol=rtol, atol=atol)


def test_vmap_over_more_than_65535_slices(gpu_only, rng):
    # (70000 slices are too slow in the simulator.)
    b, n = 70001, 4
    op = kernel_op(affine_f32, (n,), jnp.float32)
    xs = f32(rng, (b, n))
    poison((b, n), np.float32)
    assert_close(jax.jit(jax.vmap(op))(xs), xs * 2 + 1, "70001 slices (chunked)")
    op.vmap_fold(xs[0])  # answers for a signature kernel
    seq = kernel_op(affine_f32, (n,), jnp.float32, vmap_method="sequential")
    assert_close(jax.jit(jax.vmap(seq))(xs[:300]), xs[:300] * 2 + 1, "300 sequential slices")


def test_mixed_dtype_signature(gpu_only, rng):
    # It runs in the simulator too, but the signature is the point.
    op = jax.jit(kernel_op(k_mixed, (N,), jnp.float64))
    for _ in range(3):
        x = rng.integers(-1000, 1000, N).astype(np.int32)
        y = f32(rng, N)
        poison((N,), np.float64)
        assert_close(op(x, y), x.astype(np.float64) * y.astype(np.float64), "mixed")
    assert_raises(TypeError, op, x.astype(np.int64), y, contains=(OP, "argument 0"),
                  what="int64 for int32")


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_signature_list_picks_the_dtypes_version(dt, rng):
    op = kernel_op(k_list, (N,), dt)
    x = rng.standard_normal(N).astype(dt)
    tol = dict(rtol=1e-6, atol=64 * np.finfo(dt).eps * 3 * np.abs(x).max())
    poison((N,), dt)
    assert_close(jax.jit(op)(x), x * 3 - 1, "jit", **tol)
    assert_close(op(x), x * 3 - 1, "eager", **tol)
    xs = np.stack([x, -x, 2 * x])
    for method in KERNEL_VMAP_METHODS:
        opm = kernel_op(k_list, (N,), dt, vmap_method=method)
        poison((3, N), dt)
        assert_close(jax.vmap(opm)(xs), xs * 3 - 1, f"vmap {method}", **tol)


def test_signature_tie_is_refused_and_exact_layout_wins(gpu_only, rng):
    op = kernel_op(k_tie, (N,), jnp.float32)
    assert_raises(TypeError, jax.jit(op), f32(rng, N), contains=(OP, "equally well"))
    x = f32(rng, N)
    assert_close(jax.jit(kernel_op(k_exact, (N,), jnp.float32))(x), x * x,
                 "exact layout beats A")


def test_signature_kernel_reused_at_other_sizes(rng):
    for n in (N, 17, 1, N + 1, 0):  # 0: an empty launch
        x = f32(rng, n)
        poison((n,), np.float32)
        assert_close(jax.jit(kernel_op(affine_f32, (n,), jnp.float32))(x), x * 2 + 1, f"n={n}")
    for n in (N, 3, 1):  # a C-only signature
        x = f32(rng, n)
        assert_close(jax.jit(kernel_op(k_c1, (n,), jnp.float32))(x), x - 5, f"c1 n={n}")
    if not SIMULATOR:
        op2d = kernel_op(affine_f32, (8, 8), jnp.float32, launch_dims=64)
        assert_raises(TypeError, jax.jit(op2d), f32(rng, (8, 8)), contains=(OP,),
                      what="2-D after 1-D uses")


def test_complex64_float16_bool_signatures(rng):
    x = (rng.standard_normal(N) + 1j * rng.standard_normal(N)).astype(np.complex64)
    assert_close(jax.jit(kernel_op(k_c64, (N,), jnp.complex64))(x), x * x, "complex64",
                 rtol=1e-5, atol=1e-5)
    h = rng.standard_normal(N).astype(np.float16)
    assert_close(jax.jit(kernel_op(k_f16, (N,), jnp.float16))(h), h + h, "float16",
                 rtol=1e-3, atol=1e-3)
    b = rng.integers(0, 2, N).astype(bool)
    assert_close(jax.jit(kernel_op(k_bool, (N,), jnp.bool_))(b), ~b, "bool")
    if not SIMULATOR:
        assert_raises(TypeError, jax.jit(kernel_op(k_c64, (N,), jnp.complex128)),
                      x.astype(np.complex128), contains=("k_c64",), what="complex128")


VIEWS = {"slice": lambda a: a[::2, 1::3],
         "T": lambda a: a.T,
         "reshape": lambda a: a.reshape(M + M // 2, M),
         "T-slice": lambda a: a.T[5:M - 3, ::7]}


@pytest.mark.parametrize("view", VIEWS)
def test_views_of_jax_arrays_into_a_2d_signature(view, rng):
    x = f32(rng, (M, M + M // 2))
    v, ref = VIEWS[view](jnp.asarray(x)), VIEWS[view](x)
    op = numbax.numba_cuda_kernel(affine_cols_f32, jax.ShapeDtypeStruct(ref.shape, jnp.float32),
                                  launch_dims=ref.shape)
    poison(ref.shape, np.float32)
    want = ref * 2 + np.arange(ref.shape[1])[None, :]
    assert_close(jax.jit(op)(v), want, view)
    assert_close(jax.jit(lambda a: op(a[:, :]))(v), want, view + " in jit")


def test_python_list_input_is_refused_not_misread(gpu_only):
    # A Python list becomes float64 under x64: refused, not misread.
    assert_raises(TypeError, kernel_op(affine_f32, (3,), jnp.float32), [1.0, 2.0, 3.0],
                  contains=(OP,))


def test_signature_kernel_vmap_broadcast_and_nested(rng):
    op = kernel_op(k_mixed, (N,), jnp.float64)
    x = rng.integers(-50, 50, (3, N)).astype(np.int32)
    y = f32(rng, N)
    assert_close(jax.vmap(op, in_axes=(0, None))(x, y), x.astype(np.float64) * y,
                 "vmap in_axes=(0, None)")
    yy = f32(rng, (2, 3, N))
    got = jax.vmap(jax.vmap(op, in_axes=(0, 0)), in_axes=(None, 0))(x, yy)
    assert_close(got, x[None].astype(np.float64) * yy, "nested")
    op.vmap_fold(x[0], y)  # answers for a signature kernel


def test_custom_kernel_over_a_signature_list_value_grad_vmap(rng):
    op = numbax.XLACustomKernel("gpu_signatures.triple_minus_one")

    @op.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(k_list, outs, launch_dims=outs.shape[0])

    # One rule for all inputs: rule(tangents, *primals, outs=...).
    op.def_jvp_rule(lambda ts, x, *, outs: 3 * ts[0])

    def call(v):
        return op(v, outs=jax.ShapeDtypeStruct(v.shape, v.dtype))

    x = jnp.asarray(f32(rng, N))
    assert_close(jax.jit(call)(x), np.asarray(x) * 3 - 1, "value", rtol=1e-5, atol=1e-5)
    assert_close(jax.grad(lambda v: call(v).sum())(x), np.full(N, 3.0, np.float32), "grad")
    xs = jnp.asarray(f32(rng, (3, N)))
    assert_close(jax.vmap(call)(xs), np.asarray(xs) * 3 - 1, "vmap", rtol=1e-5, atol=1e-5)


# -- numba_cuda_callable: fast launches and capture ------------------------------

def test_fast_launch_of_a_lazy_kernel_with_two_argument_types(rng):
    def launch(x, y, ox, oy, stream):
        lazy_scale[grid_for(N), 256, stream](x, ox)
        lazy_scale[grid_for(N), 256, stream](y, oy)

    op = jax.jit(numbax.numba_cuda_callable(
        launch, (jax.ShapeDtypeStruct((N,), jnp.float32),
                 jax.ShapeDtypeStruct((N,), jnp.int32))))
    for _ in range(4):
        x = f32(rng, N)
        y = rng.integers(-1000, 1000, N).astype(np.int32)
        a, b = op(x, y)
        assert_close(a, x * 4 - 3, "float32 out", rtol=1e-6, atol=1e-5)
        assert_close(b, y * 4 - 3, "int32 out")


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_fast_launch_of_a_signature_list_equals_numba_and_numpy(dt, rng):
    def make(fast):
        def launch(x, out, stream):
            fill_nan_1d[grid_for(N), 256, stream](out)
            k_list[grid_for(N), 256, stream](x, out)
        return jax.jit(numbax.numba_cuda_callable(
            launch, jax.ShapeDtypeStruct((N,), dt), fast_launch=fast))

    fast_op, slow_op = make(True), make(False)
    numbax.reset_bridge_counters()
    for _ in range(5):
        x = rng.standard_normal(N).astype(dt)
        a, b = np.asarray(fast_op(x)), np.asarray(slow_op(x))
        assert np.array_equal(a, b, equal_nan=True), "fast != Numba's own launch"
        assert_close(a, x * 3 - 1, "numpy", rtol=1e-5, atol=1e-5)
    counters = numbax.bridge_counters()
    if not SIMULATOR:
        assert counters.get("fast_launches", 0) >= 8, nonzero(counters)
        assert counters.get("fallback_signature_mismatch", 0) == 0, counters


def scalar_run(x, kernel, scalars, fast):
    """A fresh jitted callable's result for x, fast launches on or off: its
    func fills out with NaN, then launches kernel(x, out, *scalars)."""
    def launch(x, out, stream):
        fill_nan_1d[grid_for(N), 256, stream](out)
        kernel[grid_for(N), 256, stream](x, out, *scalars)

    return np.asarray(jax.jit(numbax.numba_cuda_callable(
        launch, jax.ShapeDtypeStruct((N,), jnp.float32), fast_launch=fast))(x))


def same_outcome(a, b):
    return a[0] == b[0] and (a[0] == "err" or np.array_equal(a[1], b[1], equal_nan=True))


@pytest.mark.parametrize("a, b", [
    (3, 0.5), (np.int32(-7), np.float32(1.25)), (True, 2.0), (np.uint8(200), np.float64(0.1)),
    (np.int16(-3), 3), (np.int64(12), np.float32(-0.0)), (0, np.float64(1e-3)),
], ids=lambda v: repr(v))
def test_fast_launch_scalars_in_range_into_typed_params(a, b, rng):
    x = f32(rng, N)
    fast = [scalar_run(x, k_scal, (a, b), True) for _ in range(3)]
    slow = scalar_run(x, k_scal, (a, b), False)
    for got in fast:
        assert np.array_equal(got, slow, equal_nan=True), "fast != Numba's own launch"
    want = (x * np.float32(b)).astype(np.float64) + int(a)
    assert_close(slow, want.astype(np.float32), "numpy")


OVERFLOW = [(2**33 + 5, 1.0), (np.int64(2**31), 1.0), (-2**40 - 1, 2.0), (1, 1e40),
            (np.uint64(2**64 - 1), 1.0)]
REFUSED = [(2.5, 1.0), (1 + 2j, 1.0), (1, 1 + 1j)]  # Numba refuses them


@pytest.mark.parametrize("a, b, refused", [(a, b, False) for a, b in OVERFLOW]
                         + [(a, b, True) for a, b in REFUSED], ids=lambda v: repr(v))
def test_fast_launch_scalars_out_of_range_as_numbas_own(a, b, refused, rng):
    if refused and SIMULATOR:
        pytest.skip("a GPU's Numba refuses these scalars; the simulator's does not")
    x = f32(rng, N)
    fast = [outcome(scalar_run, x, k_scal, (a, b), True) for _ in range(3)]
    slow = outcome(scalar_run, x, k_scal, (a, b), False)
    for got in fast:
        assert same_outcome(got, slow), f"fast {got} != Numba's own {slow}"
    if refused:
        assert fast[0][0] == "err", "Numba refuses these scalars, numbax ran them"
    # After that, a plain good call is still right.
    assert_close(scalar_run(x, k_scal, (2, 3.0), True), x * 3 + 2, "good call after")


@pytest.mark.parametrize("s", [3, 2.5, np.int32(7), np.float64(1.5), np.float32(0.25),
                               np.int64(-4), True, np.uint16(9)], ids=lambda v: repr(v))
def test_fast_launch_scalar_picks_the_lists_signature_as_numba(s, rng):
    x = f32(rng, N)
    fast = [outcome(scalar_run, x, k_scal_list, (s,), True) for _ in range(3)]
    slow = outcome(scalar_run, x, k_scal_list, (s,), False)
    for got in fast:
        assert same_outcome(got, slow), f"fast {got[0]} != Numba's own {slow[0]}"
    if slow[0] == "ok":
        assert_close(slow[1], (x.astype(np.float64) + float(s)).astype(np.float32), "numpy")


def test_fast_launch_of_views_into_signature_kernels(rng):
    n, h = M * M, M // 2

    def launch(x, out, stream):
        fill_nan_1d[grid_for(n), 256, stream](out)
        affine_f32[grid_for(n // 2), 256, stream](x[::2], out[1::2])
        if SIMULATOR:  # the simulator cannot pass non-contiguous 2-D views
            return
        x2, o2 = x.reshape(M, M), out.reshape(M, M)
        # (No .T here: Numba's 2-D .T of a device array is a copy made by
        # a kernel, so writing through it would not reach `out`.)
        affine_cols_f32[(-(-h // 8), -(-h // 8)), (8, 8), stream](x2[:h, :h], o2[h:, h:])

    def make(fast):
        return jax.jit(numbax.numba_cuda_callable(
            launch, jax.ShapeDtypeStruct((n,), jnp.float32), fast_launch=fast))

    fast_op, slow_op = make(True), make(False)
    numbax.reset_bridge_counters()
    for _ in range(4):
        x = f32(rng, n)
        want = np.full(n, np.nan, np.float32)
        want[1::2] = x[::2] * 2 + 1
        if not SIMULATOR:
            want.reshape(M, M)[h:, h:] = x.reshape(M, M)[:h, :h] * 2 + np.arange(h)[None, :]
        a, b = np.asarray(fast_op(x)), np.asarray(slow_op(x))
        assert np.array_equal(a, b, equal_nan=True), "fast != Numba's own launch"
        assert_close(a, want, "views")
    counters = numbax.bridge_counters()
    if not SIMULATOR:
        assert counters.get("fast_launches", 0) > 0, nonzero(counters)


def test_capture_with_signature_kernels_and_scratch(rng):
    def launch(x, out, tmp, stream):
        affine_f32[grid_for(N), 256, stream](x, tmp)
        k_list[grid_for(N), 256, stream](tmp, out)

    op = jax.jit(numbax.numba_cuda_callable(
        launch, jax.ShapeDtypeStruct((N,), jnp.float32),
        scratch=jax.ShapeDtypeStruct((N,), jnp.float32), capture=True))
    for _ in range(6):
        x = f32(rng, N)
        poison((N,), np.float32)
        assert_close(op(x), (x * 2 + 1) * 3 - 1, "captured", rtol=1e-5, atol=1e-5)
    # A chain of 6 (XLA may record it into a command buffer).
    chain = jax.jit(lambda v: op(op(op(op(op(op(v)))))))
    x = f32(rng, N) * 1e-3
    want = x
    for _ in range(6):
        want = (want * 2 + 1) * 3 - 1
    assert_close(chain(x), want, "chain", rtol=1e-4, atol=1e-3)
