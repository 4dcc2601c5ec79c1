"""Kernels compiled for explicit signatures: the version Numba's launch runs.

numba_cuda_kernel runs the version Numba's own launch would pick for the
arrays, and refuses at trace time, naming the op, the argument and both
types, arrays that no version takes (before: one signature's code ran on
buffers of another type; a list of 'A' signatures was refused although Numba
accepts the call). Inside a numba_cuda_callable the fast launch path equals
Numba's own launch, or falls back to it counted as 'signature_mismatch'.

Numba's simulator keeps no signatures (its kernels are Python), so the
choice itself is tested there through numbax.compilers.signatures with Numba's real
typing context and a stand-in dispatcher; the kernels run on the GPU.

A kernel compiled for explicit signatures, given buffers none of them
takes (another dtype, rank or layout, or any type after disable_compile()),
is refused with a TypeError that names the op, on every path (jit, eager,
vmap, vmap_fold), and never launched on them; a plain callable's fast launch
of such a kernel is never replayed and gives the bits of Numba's own launch.
After each refusal a good op still runs: the CUDA context is healthy.

Each refusal test runs in a process of its own (conftest.in_own_process): were a
refusal broken, the launch on the wrong buffers could corrupt the context.
GPU only: the simulator ignores explicit signatures.

Kernels compiled for explicit signatures (one, a list, or lazily with
overloads compiled beforehand) give numpy's results, into poisoned outputs,
on every path: numba_cuda_kernel under jit, eagerly and under vmap (beyond
65535 slices, broadcast and nested), a plain callable's fast launch (the same
bits as Numba's own launch, for arrays, views and scalars of every width), a
captured callable, an XLACustomKernel. A signature list picks the version
for the dtype; a tie is refused as ambiguous; an exact layout beats `A`.

Checks that rest on signatures the simulator ignores run on a GPU only.
"""

import types as pytypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda
from numba import types as nt

import numbax
from numbax.compilers import signatures
from conftest import SIMULATOR
from conftest import assert_close, grid_for, in_own_process, kernel_op, poison
from shared_kernels import add_one, affine_cols_f32, affine_f32
from conftest import KERNEL_VMAP_METHODS, outcome

pytestmark = pytest.mark.gpu

F32 = nt.Array(nt.float32, 1, "C")
F64 = nt.Array(nt.float64, 1, "C")
F32A = nt.Array(nt.float32, 1, "A")
F64A = nt.Array(nt.float64, 1, "A")


def typing_context():
    from numba.cuda.typing.context import Context
    return Context()


def stand_in(signatures, *, specialized):
    """What signatures reads of a CUDADispatcher whose compilation is
    disabled: its versions by argument types, and its typing context."""
    def kernel_body(x, out):
        pass
    return pytypes.SimpleNamespace(
        overloads={tuple(s): f"version{i}" for i, s in enumerate(signatures)},
        specialized=specialized, _can_compile=False,
        typingctx=typing_context(), py_func=kernel_body)


# -- the choice, on Numba's typing rules (both modes) ---------------------------

def test_one_signature_of_another_dtype_is_a_type_error_naming_everything():
    kernel = stand_in([(F64A, F64A)], specialized=True)
    with pytest.raises(TypeError) as info:
        signatures.select(kernel, (F32, F32), "numbax.numba_cuda_kernel(m.k)",
                           n_in=1)
    message = str(info.value)
    assert message.startswith("numbax.numba_cuda_kernel(m.k): ")
    assert "argument 0 (input 0, 'x')" in message
    assert "array(float64, 1d, A)" in message  # the signature's type
    assert "array(float32, 1d, C)" in message  # the array's type
    assert "astype" in message and "add a signature" in message


def test_one_matching_signature_is_its_version():
    kernel = stand_in([(F32A, F32A)], specialized=True)
    assert signatures.select(kernel, (F32, F32), "op") == "version0"


def test_list_of_a_layout_signatures_picks_the_one_numba_would():
    kernel = stand_in([(F32A, F32A), (F64A, F64A)], specialized=False)
    assert signatures.select(kernel, (F32, F32), "op") == "version0"
    assert signatures.select(kernel, (F64, F64), "op") == "version1"
    with pytest.raises(TypeError, match=r"any of its signatures.*"
                       r"\(array\(float32, 1d, A\), .*argument 0"):
        signatures.select(kernel, (nt.Array(nt.int32, 1, "C"),) * 2, "op")


def test_exact_layout_beats_a_conversion_and_ties_are_refused():
    c_first = stand_in([(F32A, F32A), (F32, F32)], specialized=False)
    assert signatures.select(c_first, (F32, F32), "op") == "version1"
    tie = stand_in([(F32A, F32), (F32, F32A)], specialized=False)
    with pytest.raises(TypeError, match="equally well"):
        signatures.select(tie, (F32, F32), "op")


def test_rank_and_arity_mismatches_are_refused():
    two_d = nt.Array(nt.float32, 2, "A")
    kernel = stand_in([(two_d, two_d)], specialized=True)
    with pytest.raises(TypeError, match=r"array\(float32, 2d, A\) as "
                       r"argument 1 \(output 0, 'out'\)|argument 0"):
        signatures.select(kernel, (F32, F32), "op", n_in=1)
    kernel = stand_in([(F32A,)], specialized=True)
    with pytest.raises(TypeError, match="takes 1 arguments, numbax passes 2"):
        signatures.select(kernel, (F32, F32), "op")


def test_kernels_that_may_compile_are_left_to_numba():
    kernel = stand_in([(F64A, F64A)], specialized=False)
    kernel._can_compile = True
    assert signatures.select(kernel, (F32, F32), "op") is None


# -- numba_cuda_kernel on real kernels --------------------------------------------

N = 64


@cuda.jit("void(float64[:], float64[:])")
def one_f64_signature(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 2.0 + 1.0


@cuda.jit(["void(float32[:], float32[:])", "void(float64[:], float64[:])"])
def two_a_signatures(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 3 - 1


def test_one_signature_refuses_arrays_of_another_dtype_at_trace_time(
        gpu_only):
    op = numbax.numba_cuda_kernel(
        one_f64_signature, jax.ShapeDtypeStruct((N,), jnp.float32),
        launch_dims=N)
    x = jnp.ones(N, jnp.float32)
    xs = jnp.ones((3, N), jnp.float32)
    for f, arg in ((jax.jit(op), x), (op, x), (jax.vmap(op), xs),
                   (op.vmap_fold, x)):
        with pytest.raises(TypeError) as info:
            f(arg)
        message = str(info.value)
        assert "numbax.numba_cuda_kernel(" in message
        assert "one_f64_signature" in message
        assert "argument 0 (input 0, 'x')" in message
        assert "float64" in message and "float32" in message
    # The same kernel on the arrays its signature takes: right, and the
    # process's CUDA context is intact (nothing ran on wrong buffers).
    good = numbax.numba_cuda_kernel(
        one_f64_signature, jax.ShapeDtypeStruct((N,), jnp.float64),
        launch_dims=N)
    with jax.enable_x64(True):
        xs = np.linspace(-1, 1, N)
        np.testing.assert_allclose(np.asarray(jax.jit(good)(xs)), xs * 2 + 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_list_of_a_signatures_runs_the_version_numba_picks(dtype, rng):
    op = numbax.numba_cuda_kernel(
        two_a_signatures, jax.ShapeDtypeStruct((N,), dtype), launch_dims=N)
    x = rng.standard_normal(N).astype(dtype)
    # A few units in the last place of |3x| (the GPU fuses x * 3 - 1 into one
    # rounding, numpy rounds twice; near x = 1/3 that is a large relative
    # error). The other version's code on these buffers is off by far more.
    tol = dict(rtol=1e-6, atol=16 * np.finfo(dtype).eps * 3 * np.abs(x).max())
    with jax.enable_x64(dtype == np.float64):
        got = np.asarray(jax.jit(op)(x))
        np.testing.assert_allclose(got, x * 3 - 1, **tol)
        np.testing.assert_allclose(np.asarray(op(x)), x * 3 - 1, **tol)
        # Under vmap, folded into one launch or not, the same numbers.
        xs = np.stack([x, -x, 2 * x])
        tol["atol"] *= 2
        np.testing.assert_allclose(np.asarray(jax.vmap(op)(xs)), xs * 3 - 1,
                                   **tol)
    if SIMULATOR:
        return
    # The version numbax launches is the one Numba's own dispatch resolves
    # for the same arrays.
    from numba.cuda import dispatcher as nd
    from numba.cuda.cext import _dispatcher
    d_x, d_out = cuda.to_device(x), cuda.device_array(N, dtype)
    cfg = two_a_signatures[1, N]
    numbas = _dispatcher.Dispatcher._cuda_call(
        two_a_signatures, d_x, d_out, **{nd._LAUNCH_CONFIG_KW: cfg})
    argtypes = op.kernel_argtypes([((N,), np.dtype(dtype))] * 2, 0)
    assert op.compile_kernel(argtypes, 1) is numbas


# -- inside a numba_cuda_callable: the fast launch path (GPU) --------------------

# Same width as float32 on purpose: int32 code on float32 buffers reads and
# writes every element at the right address (wrong numbers, by Numba's own
# launch too), where float64 code would fault and leave the process's CUDA
# context unusable.
@cuda.jit("void(int32[:], int32[:])")
def one_i32_signature(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 1


def _counters_for(fn, x, repeat):
    numbax.reset_bridge_counters()
    out = None
    for _ in range(repeat):
        out = jax.block_until_ready(fn(x))
    return np.asarray(out), numbax.bridge_counters()


def _callable(kernel, dtype, fast):
    def launch(x, out, stream):
        kernel[1, N, stream](x, out)
    return jax.jit(numbax.numba_cuda_callable(
        launch, jax.ShapeDtypeStruct((N,), dtype), fast_launch=fast))


def test_fast_launch_never_replays_a_signature_that_does_not_fit(gpu_only):
    x = np.arange(N, dtype=np.float32)
    fast, c = _counters_for(_callable(one_i32_signature, jnp.float32, True),
                            x, 4)
    slow, _ = _counters_for(_callable(one_i32_signature, jnp.float32, False),
                            x, 1)
    # What Numba's own launch gives (the int32 code on the float32 bits)...
    bits = x.view(np.int32) + 1
    np.testing.assert_array_equal(slow.view(np.int32), bits)
    # ... and the fast path gives the same, by handing every launch to Numba.
    np.testing.assert_array_equal(fast.view(np.int32), bits)
    assert c["fast_launches"] == 0, c
    assert c["fallback_signature_mismatch"] == 4, c


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_launch_of_a_signatures_equals_numbas_own(gpu_only, dtype, rng):
    x = rng.standard_normal(N).astype(dtype)
    with jax.enable_x64(dtype == np.float64):
        fast, c = _counters_for(_callable(two_a_signatures, dtype, True), x, 4)
        slow, _ = _counters_for(_callable(two_a_signatures, dtype, False),
                                x, 1)
    # 3x - 1 near 0 cancels: the GPU's fused multiply-add rounds once where
    # numpy rounds twice (an ulp of 3x apart). The exact check is the next
    # line: the fast launch equals Numba's own, bit for bit.
    np.testing.assert_allclose(fast, x * 3 - 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(fast, slow)
    # After the first launch (Numba's, which numbax records) the plan runs.
    assert c["fallback_new_plan"] <= 1, c
    assert c["fast_launches"] + c["fallback_new_plan"] == 4, c
    assert c["fallback_signature_mismatch"] == 0, c


def test_choice_equals_numbas_overload_resolution_over_many_cases():
    """Every pair of signatures from a pool, every argument pair: the same
    version (or the same refusal) as Numba's resolve_overload with the
    options its launch uses when compilation is disabled."""
    import itertools

    from numba.core.typing import signature

    ctx = typing_context()
    pool = [nt.Array(d, 1, lay, readonly=ro)
            for d in (nt.float32, nt.float64) for lay in ("C", "A", "F")
            for ro in (False, True)]
    actuals = [nt.Array(d, 1, "C") for d in (nt.float32, nt.float64)] + [
        nt.Array(nt.float32, 1, "A"), nt.Array(nt.float32, 2, "C")]
    sigs = list(itertools.product(pool, pool))
    pick = np.random.default_rng(24)
    checked = 0
    for _ in range(300):
        i, j = pick.choice(len(sigs), 2, replace=False)
        first, second = sigs[i], sigs[j]
        for args in itertools.product(actuals, repeat=2):
            cases = [signature(nt.none, *first), signature(nt.none, *second)]
            try:
                numba = ctx.resolve_overload("k", cases, args, {},
                                             allow_ambiguous=False)
                numba = None if numba is None else tuple(numba.args)
                ambiguous = False
            except TypeError:
                numba, ambiguous = None, True
            ours, _, tied = signatures.choose(ctx, [first, second], args,
                                               specialized=False)
            assert ours == numba, (first, second, args)
            assert bool(tied) == ambiguous, (first, second, args)
            checked += ours is not None or ambiguous
    assert checked > 100  # the pool reaches picks and ties, not only misses


N_GPU = 64 if SIMULATOR else 4096
OP = "numba_cuda_kernel("


@cuda.jit("void(float64[:], float64[:])")
def k_f64(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 2 + 1


@cuda.jit("void(int32[:], int32[:])")
def k_i32(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 1


@cuda.jit("void(int64[:], int64[:])")
def k_i64(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 3


@cuda.jit("void(uint32[:], uint32[:])")
def k_u32(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 1


@cuda.jit("void(float32[::1,:], float32[::1,:])")
def k_fortran(x, out):
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        out[i, j] = x[i, j] + 1


@cuda.jit(["void(float64[:], float64[:])", "void(int64[:], int64[:])"])
def k_list_none(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 2


@cuda.jit
def lazy_disabled(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 5


def f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def healthy(rng):
    """A good op after a refusal: the process's CUDA context still works."""
    x = f32(rng, N_GPU)
    poison((N_GPU,), np.float32)
    got = jax.jit(kernel_op(add_one, (N_GPU,), jnp.float32))(x)
    assert_close(got, x + 1, "context check after refusal")


@pytest.mark.usefixtures("gpu_only", "x64")
@pytest.mark.parametrize("kernel, dtype", [
    (k_f64, np.float32), (k_i64, np.int32), (k_i32, np.float32), (k_i32, np.int64),
    (k_u32, np.int32),
], ids=["f64_kernel_on_f32", "i64_kernel_on_i32", "i32_kernel_on_f32", "i32_kernel_on_i64",
        "u32_kernel_on_i32"])
@in_own_process()
def test_another_dtype_is_refused_on_every_path(kernel, dtype, rng):
    x = f32(rng, N_GPU) if dtype == np.float32 else np.arange(N_GPU, dtype=dtype)
    op = kernel_op(kernel, x.shape, dtype)
    for label, f in (("jit", jax.jit(op)), ("eager", op), ("vmap_fold", op.vmap_fold)):
        with pytest.raises(TypeError) as info:
            jax.block_until_ready(f(x))
        for part in (OP, kernel.__name__, np.dtype(dtype).name):
            assert part in str(info.value), f"{label}: {info.value}"
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(jax.vmap(op)(np.stack([x, x])))
    assert OP in str(info.value), f"vmap: {info.value}"
    healthy(rng)


@pytest.mark.usefixtures("gpu_only", "x64")
@in_own_process()
def test_rank_mismatch_is_refused_both_ways(rng):
    op = numbax.numba_cuda_kernel(affine_cols_f32, jax.ShapeDtypeStruct((N_GPU,), jnp.float32),
                                  launch_dims=(N_GPU, 1))
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(jax.jit(op)(f32(rng, N_GPU)))
    for part in (OP, affine_cols_f32.__name__):
        assert part in str(info.value), f"2-D signature on 1-D: {info.value}"
    op1 = numbax.numba_cuda_kernel(
        affine_f32, jax.ShapeDtypeStruct((64, 64), jnp.float32), launch_dims=64)
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(jax.jit(op1)(f32(rng, (64, 64))))
    for part in (OP, affine_f32.__name__):
        assert part in str(info.value), f"1-D signature on 2-D: {info.value}"
    healthy(rng)


@pytest.mark.usefixtures("gpu_only", "x64")
@in_own_process()
def test_no_signature_of_a_list_matches(rng):
    op = kernel_op(k_list_none, (N_GPU,), jnp.float32)
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(jax.jit(op)(f32(rng, N_GPU)))
    for part in (OP, "k_list_none", "any of its signatures"):
        assert part in str(info.value), str(info.value)
    healthy(rng)


@pytest.mark.usefixtures("gpu_only", "x64")
@in_own_process()
def test_fortran_signature_refuses_c_arrays(rng):
    op = kernel_op(k_fortran, (32, 48), jnp.float32)
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(jax.jit(op)(f32(rng, (32, 48))))
    for part in (OP, "k_fortran"):
        assert part in str(info.value), str(info.value)
    healthy(rng)


@pytest.mark.usefixtures("gpu_only", "x64")
@in_own_process()
def test_fast_launch_of_an_int32_kernel_on_float32_is_numbas_own(rng):
    """A callable's func launches an int32[:] kernel on float32 arrays:
    Numba's own launch reinterprets the bits; the fast path never replays
    that launch (fallback_signature_mismatch) and gives the same bits."""
    x = np.arange(N_GPU, dtype=np.float32) * 1.5

    def make(fast):
        def launch(x, out, stream):
            k_i32[grid_for(N_GPU), 256, stream](x, out)
        return jax.jit(numbax.numba_cuda_callable(
            launch, jax.ShapeDtypeStruct((N_GPU,), jnp.float32), fast_launch=fast))

    numbax.reset_bridge_counters()
    first = np.asarray(make(True)(x))
    f = make(True)
    numbax.reset_bridge_counters()
    for _ in range(4):
        got = np.asarray(f(x))
    counters = numbax.bridge_counters()
    slow = np.asarray(make(False)(x))
    want = x.view(np.int32) + 1
    assert np.array_equal(slow.view(np.int32), want), "Numba's own launch"
    assert np.array_equal(got.view(np.int32), want), "fast path != Numba"
    assert np.array_equal(first.view(np.int32), want)
    assert counters.get("fast_launches", 0) == 0, counters
    assert counters.get("fallback_signature_mismatch", 0) >= 3, {
        k: v for k, v in counters.items() if v}
    healthy(rng)


@pytest.mark.usefixtures("gpu_only", "x64")
@in_own_process()
def test_disable_compile_after_float32_refuses_float64(rng):
    lazy_disabled.compile("void(float32[:], float32[:])")
    lazy_disabled.disable_compile()
    x = f32(rng, N_GPU)
    assert_close(jax.jit(kernel_op(lazy_disabled, (N_GPU,), jnp.float32))(x), x * 5, "f32")
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(
            jax.jit(kernel_op(lazy_disabled, (N_GPU,), jnp.float64))(x.astype(np.float64)))
    for part in (OP, "lazy_disabled"):
        assert part in str(info.value), f"f64 after disable_compile: {info.value}"
    healthy(rng)


N_GPU = 64 if SIMULATOR else 4096
M = 16 if SIMULATOR else 64  # the side of 2-D cases
OP_GPU = "numba_cuda_kernel("


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


def f32_gpu(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def nonzero(counters):
    return {k: v for k, v in counters.items() if v}


# -- numba_cuda_kernel -------------------------------------------------------

@pytest.mark.usefixtures("x64")
def test_lazy_kernel_precompiled_then_other_types(rng):
    if not SIMULATOR:  # the simulator's kernels have no compile()
        lazy_scale.compile("void(float64[:], float64[:])")
    for dt in (np.float32, np.float64, np.int32, np.int64, np.float16):
        x = (rng.standard_normal(N_GPU) * 8).astype(dt)
        want = (x * 4 - 3).astype(dt)
        poison((N_GPU,), dt)
        got = jax.jit(kernel_op(lazy_scale, (N_GPU,), dt))(x)
        rtol, atol = (1e-2, 1e-2) if dt == np.float16 else (1e-6, 1e-5)
        assert_close(got, want, np.dtype(dt).name, rtol=rtol, atol=atol)


@pytest.mark.usefixtures("x64")
def test_vmap_over_more_than_65535_slices(gpu_only, rng):
    # (70000 slices are too slow in the simulator.)
    b, n = 70001, 4
    op = kernel_op(affine_f32, (n,), jnp.float32)
    xs = f32_gpu(rng, (b, n))
    poison((b, n), np.float32)
    assert_close(jax.jit(jax.vmap(op))(xs), xs * 2 + 1, "70001 slices (chunked)")
    op.vmap_fold(xs[0])  # answers for a signature kernel
    seq = kernel_op(affine_f32, (n,), jnp.float32, vmap_method="sequential")
    assert_close(jax.jit(jax.vmap(seq))(xs[:300]), xs[:300] * 2 + 1, "300 sequential slices")


@pytest.mark.usefixtures("x64")
def test_mixed_dtype_signature(gpu_only, rng):
    # It runs in the simulator too, but the signature is the point.
    op = jax.jit(kernel_op(k_mixed, (N_GPU,), jnp.float64))
    for _ in range(3):
        x = rng.integers(-1000, 1000, N_GPU).astype(np.int32)
        y = f32_gpu(rng, N_GPU)
        poison((N_GPU,), np.float64)
        assert_close(op(x, y), x.astype(np.float64) * y.astype(np.float64), "mixed")
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(op(x.astype(np.int64), y))
    for part in (OP_GPU, "argument 0"):
        assert part in str(info.value), f"int64 for int32: {info.value}"


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_signature_list_picks_the_dtypes_version(dt, rng):
    op = kernel_op(k_list, (N_GPU,), dt)
    x = rng.standard_normal(N_GPU).astype(dt)
    tol = dict(rtol=1e-6, atol=64 * np.finfo(dt).eps * 3 * np.abs(x).max())
    poison((N_GPU,), dt)
    assert_close(jax.jit(op)(x), x * 3 - 1, "jit", **tol)
    assert_close(op(x), x * 3 - 1, "eager", **tol)
    xs = np.stack([x, -x, 2 * x])
    for method in KERNEL_VMAP_METHODS:
        opm = kernel_op(k_list, (N_GPU,), dt, vmap_method=method)
        poison((3, N_GPU), dt)
        assert_close(jax.vmap(opm)(xs), xs * 3 - 1, f"vmap {method}", **tol)


@pytest.mark.usefixtures("x64")
def test_signature_tie_is_refused_and_exact_layout_wins(gpu_only, rng):
    op = kernel_op(k_tie, (N_GPU,), jnp.float32)
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(jax.jit(op)(f32_gpu(rng, N_GPU)))
    for part in (OP_GPU, "equally well"):
        assert part in str(info.value), str(info.value)
    x = f32_gpu(rng, N_GPU)
    assert_close(jax.jit(kernel_op(k_exact, (N_GPU,), jnp.float32))(x), x * x,
                 "exact layout beats A")


@pytest.mark.usefixtures("x64")
def test_signature_kernel_reused_at_other_sizes(rng):
    for n in (N_GPU, 17, 1, N_GPU + 1, 0):  # 0: an empty launch
        x = f32_gpu(rng, n)
        poison((n,), np.float32)
        assert_close(jax.jit(kernel_op(affine_f32, (n,), jnp.float32))(x), x * 2 + 1, f"n={n}")
    for n in (N_GPU, 3, 1):  # a C-only signature
        x = f32_gpu(rng, n)
        assert_close(jax.jit(kernel_op(k_c1, (n,), jnp.float32))(x), x - 5, f"c1 n={n}")
    if not SIMULATOR:
        op2d = kernel_op(affine_f32, (8, 8), jnp.float32, launch_dims=64)
        with pytest.raises(TypeError) as info:
            jax.block_until_ready(jax.jit(op2d)(f32_gpu(rng, (8, 8))))
        assert OP_GPU in str(info.value), f"2-D after 1-D uses: {info.value}"


@pytest.mark.usefixtures("x64")
def test_complex64_float16_bool_signatures(rng):
    x = (rng.standard_normal(N_GPU) + 1j * rng.standard_normal(N_GPU)).astype(np.complex64)
    assert_close(jax.jit(kernel_op(k_c64, (N_GPU,), jnp.complex64))(x), x * x, "complex64",
                 rtol=1e-5, atol=1e-5)
    h = rng.standard_normal(N_GPU).astype(np.float16)
    assert_close(jax.jit(kernel_op(k_f16, (N_GPU,), jnp.float16))(h), h + h, "float16",
                 rtol=1e-3, atol=1e-3)
    b = rng.integers(0, 2, N_GPU).astype(bool)
    assert_close(jax.jit(kernel_op(k_bool, (N_GPU,), jnp.bool_))(b), ~b, "bool")
    if not SIMULATOR:
        with pytest.raises(TypeError) as info:
            jax.block_until_ready(
                jax.jit(kernel_op(k_c64, (N_GPU,), jnp.complex128))(x.astype(np.complex128)))
        assert "k_c64" in str(info.value), f"complex128: {info.value}"


VIEWS = {"slice": lambda a: a[::2, 1::3],
         "T": lambda a: a.T,
         "reshape": lambda a: a.reshape(M + M // 2, M),
         "T-slice": lambda a: a.T[5:M - 3, ::7]}


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("view", VIEWS)
def test_views_of_jax_arrays_into_a_2d_signature(view, rng):
    x = f32_gpu(rng, (M, M + M // 2))
    v, ref = VIEWS[view](jnp.asarray(x)), VIEWS[view](x)
    op = numbax.numba_cuda_kernel(affine_cols_f32, jax.ShapeDtypeStruct(ref.shape, jnp.float32),
                                  launch_dims=ref.shape)
    poison(ref.shape, np.float32)
    want = ref * 2 + np.arange(ref.shape[1])[None, :]
    assert_close(jax.jit(op)(v), want, view)
    assert_close(jax.jit(lambda a: op(a[:, :]))(v), want, view + " in jit")


@pytest.mark.usefixtures("x64")
def test_python_list_input_is_refused_not_misread(gpu_only):
    # A Python list becomes float64 under x64: refused, not misread.
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(kernel_op(affine_f32, (3,), jnp.float32)([1.0, 2.0, 3.0]))
    assert OP_GPU in str(info.value), str(info.value)


@pytest.mark.usefixtures("x64")
def test_signature_kernel_vmap_broadcast_and_nested(rng):
    op = kernel_op(k_mixed, (N_GPU,), jnp.float64)
    x = rng.integers(-50, 50, (3, N_GPU)).astype(np.int32)
    y = f32_gpu(rng, N_GPU)
    assert_close(jax.vmap(op, in_axes=(0, None))(x, y), x.astype(np.float64) * y,
                 "vmap in_axes=(0, None)")
    yy = f32_gpu(rng, (2, 3, N_GPU))
    got = jax.vmap(jax.vmap(op, in_axes=(0, 0)), in_axes=(None, 0))(x, yy)
    assert_close(got, x[None].astype(np.float64) * yy, "nested")
    op.vmap_fold(x[0], y)  # answers for a signature kernel


@pytest.mark.usefixtures("x64")
def test_custom_kernel_over_a_signature_list_value_grad_vmap(rng):
    op = numbax.XLACustomKernel("gpu_signatures.triple_minus_one")

    @op.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(k_list, outs, launch_dims=outs.shape[0])

    # One rule for all inputs: rule(tangents, *primals, outs=...).
    op.def_jvp_rule(lambda ts, x, *, outs: 3 * ts[0])

    def call(v):
        return op(v, outs=jax.ShapeDtypeStruct(v.shape, v.dtype))

    x = jnp.asarray(f32_gpu(rng, N_GPU))
    assert_close(jax.jit(call)(x), np.asarray(x) * 3 - 1, "value", rtol=1e-5, atol=1e-5)
    assert_close(jax.grad(lambda v: call(v).sum())(x), np.full(N_GPU, 3.0, np.float32), "grad")
    xs = jnp.asarray(f32_gpu(rng, (3, N_GPU)))
    assert_close(jax.vmap(call)(xs), np.asarray(xs) * 3 - 1, "vmap", rtol=1e-5, atol=1e-5)


# -- numba_cuda_callable: fast launches and capture ------------------------------

@pytest.mark.usefixtures("x64")
def test_fast_launch_of_a_lazy_kernel_with_two_argument_types(rng):
    def launch(x, y, ox, oy, stream):
        lazy_scale[grid_for(N_GPU), 256, stream](x, ox)
        lazy_scale[grid_for(N_GPU), 256, stream](y, oy)

    op = jax.jit(numbax.numba_cuda_callable(
        launch, (jax.ShapeDtypeStruct((N_GPU,), jnp.float32),
                 jax.ShapeDtypeStruct((N_GPU,), jnp.int32))))
    for _ in range(4):
        x = f32_gpu(rng, N_GPU)
        y = rng.integers(-1000, 1000, N_GPU).astype(np.int32)
        a, b = op(x, y)
        assert_close(a, x * 4 - 3, "float32 out", rtol=1e-6, atol=1e-5)
        assert_close(b, y * 4 - 3, "int32 out")


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_fast_launch_of_a_signature_list_equals_numba_and_numpy(dt, rng):
    def make(fast):
        def launch(x, out, stream):
            fill_nan_1d[grid_for(N_GPU), 256, stream](out)
            k_list[grid_for(N_GPU), 256, stream](x, out)
        return jax.jit(numbax.numba_cuda_callable(
            launch, jax.ShapeDtypeStruct((N_GPU,), dt), fast_launch=fast))

    fast_op, slow_op = make(True), make(False)
    numbax.reset_bridge_counters()
    for _ in range(5):
        x = rng.standard_normal(N_GPU).astype(dt)
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
        fill_nan_1d[grid_for(N_GPU), 256, stream](out)
        kernel[grid_for(N_GPU), 256, stream](x, out, *scalars)

    return np.asarray(jax.jit(numbax.numba_cuda_callable(
        launch, jax.ShapeDtypeStruct((N_GPU,), jnp.float32), fast_launch=fast))(x))


def same_outcome(a, b):
    return a[0] == b[0] and (a[0] == "err" or np.array_equal(a[1], b[1], equal_nan=True))


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("a, b", [
    (3, 0.5), (np.int32(-7), np.float32(1.25)), (True, 2.0), (np.uint8(200), np.float64(0.1)),
    (np.int16(-3), 3), (np.int64(12), np.float32(-0.0)), (0, np.float64(1e-3)),
], ids=lambda v: repr(v))
def test_fast_launch_scalars_in_range_into_typed_params(a, b, rng):
    x = f32_gpu(rng, N_GPU)
    fast = [scalar_run(x, k_scal, (a, b), True) for _ in range(3)]
    slow = scalar_run(x, k_scal, (a, b), False)
    for got in fast:
        assert np.array_equal(got, slow, equal_nan=True), "fast != Numba's own launch"
    want = (x * np.float32(b)).astype(np.float64) + int(a)
    assert_close(slow, want.astype(np.float32), "numpy")


OVERFLOW = [(2**33 + 5, 1.0), (np.int64(2**31), 1.0), (-2**40 - 1, 2.0), (1, 1e40),
            (np.uint64(2**64 - 1), 1.0)]
REFUSED = [(2.5, 1.0), (1 + 2j, 1.0), (1, 1 + 1j)]  # Numba refuses them


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("a, b, refused", [(a, b, False) for a, b in OVERFLOW]
                         + [(a, b, True) for a, b in REFUSED], ids=lambda v: repr(v))
def test_fast_launch_scalars_out_of_range_as_numbas_own(a, b, refused, rng):
    if refused and SIMULATOR:
        pytest.skip("a GPU's Numba refuses these scalars; the simulator's does not")
    x = f32_gpu(rng, N_GPU)
    fast = [outcome(scalar_run, x, k_scal, (a, b), True) for _ in range(3)]
    slow = outcome(scalar_run, x, k_scal, (a, b), False)
    for got in fast:
        assert same_outcome(got, slow), f"fast {got} != Numba's own {slow}"
    if refused:
        assert fast[0][0] == "err", "Numba refuses these scalars, numbax ran them"
    # After that, a plain good call is still right.
    assert_close(scalar_run(x, k_scal, (2, 3.0), True), x * 3 + 2, "good call after")


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("s", [3, 2.5, np.int32(7), np.float64(1.5), np.float32(0.25),
                               np.int64(-4), True, np.uint16(9)], ids=lambda v: repr(v))
def test_fast_launch_scalar_picks_the_lists_signature_as_numba(s, rng):
    x = f32_gpu(rng, N_GPU)
    fast = [outcome(scalar_run, x, k_scal_list, (s,), True) for _ in range(3)]
    slow = outcome(scalar_run, x, k_scal_list, (s,), False)
    for got in fast:
        assert same_outcome(got, slow), f"fast {got[0]} != Numba's own {slow[0]}"
    if slow[0] == "ok":
        assert_close(slow[1], (x.astype(np.float64) + float(s)).astype(np.float32), "numpy")


@pytest.mark.usefixtures("x64")
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
        x = f32_gpu(rng, n)
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


@pytest.mark.usefixtures("x64")
def test_capture_with_signature_kernels_and_scratch(rng):
    def launch(x, out, tmp, stream):
        affine_f32[grid_for(N_GPU), 256, stream](x, tmp)
        k_list[grid_for(N_GPU), 256, stream](tmp, out)

    op = jax.jit(numbax.numba_cuda_callable(
        launch, jax.ShapeDtypeStruct((N_GPU,), jnp.float32),
        scratch=jax.ShapeDtypeStruct((N_GPU,), jnp.float32), capture=True))
    for _ in range(6):
        x = f32_gpu(rng, N_GPU)
        poison((N_GPU,), np.float32)
        assert_close(op(x), (x * 2 + 1) * 3 - 1, "captured", rtol=1e-5, atol=1e-5)
    # A chain of 6 (XLA may record it into a command buffer).
    chain = jax.jit(lambda v: op(op(op(op(op(op(v)))))))
    x = f32_gpu(rng, N_GPU) * 1e-3
    want = x
    for _ in range(6):
        want = (want * 2 + 1) * 3 - 1
    assert_close(chain(x), want, "chain", rtol=1e-4, atol=1e-3)
