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
    argtypes = op._argtypes([((N,), np.dtype(dtype))] * 2, 0)
    assert op._compile(argtypes, 1) is numbas


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
