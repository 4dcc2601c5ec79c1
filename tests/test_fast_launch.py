"""Fast launches: kernels launched by a plain callable's func, packed in C++.

On a GPU, a launch on numbax's stream with numbax's arrays and plain scalars
goes through numbax's C++ packing and cuLaunchKernel after its first launch
through Numba; every other launch goes through Numba. Each test compares
against numpy and against the same func with the fast path switched off,
with outputs poisoned (aliased to NaN/sentinel-filled inputs) so an element
the kernel does not write shows. In the simulator every launch falls back,
counted as 'simulator'.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import numba
from numba import cuda

import numbax
from numbax.compilers import numba_cuda_launch
from conftest import SIMULATOR, random_array
from shared_kernels import block_sums
from shared_kernels import copy_2d as copy2d

pytestmark = pytest.mark.gpu

F32 = jnp.float32
REASONS = ("disabled", "simulator", "other_thread", "other_stream",
           "foreign_argument", "unsupported_kernel", "new_plan",
           "launch_error", "numba_error", "plan_error")


def fallbacks(c):
    return {r: c[f"fallback_{r}"] for r in REASONS if c[f"fallback_{r}"]}


def counted(fn, *args, repeat=1):
    """Runs fn(*args) `repeat` times; returns (last result, counters)."""
    numbax.reset_bridge_counters()
    out = None
    for _ in range(repeat):
        out = fn(*args)
        jax.block_until_ready(out)
    return out, numbax.bridge_counters()


def poisoned(shape, dtype=np.float32):
    fill = np.nan if np.dtype(dtype).kind == "f" else -12345
    return jnp.full(shape, fill, dtype)


@cuda.jit
def affine(x, out, a, b, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = x[i] * a + b


def affine_op(x, poison, out, stream):
    n = x.shape[0]
    affine[(n + 127) // 128, 128, stream](x, out, 2.5, 1, n)


def make_affine(fast=True, n=1000):
    return numbax.numba_cuda_callable(
        affine_op, outs=jax.ShapeDtypeStruct((n,), F32),
        input_output_aliases={1: 0}, fast_launch=fast)


# -- the fast path itself (GPU) -------------------------------------------

def test_fast_path_taken_and_equal_to_numba(gpu_only, rng):
    fast, slow = jax.jit(make_affine(True)), jax.jit(make_affine(False))
    # Creating an op installs the hook (on a verified numba-cuda).
    assert numba_cuda_launch.hook_installed(), numba_cuda_launch.status()
    for _ in range(3):
        x = random_array(rng, (1000,), np.float32)
        got, c = counted(fast, x, poisoned(1000), repeat=4)
        ref, c_slow = counted(slow, x, poisoned(1000))
        np.testing.assert_allclose(got, x * 2.5 + 1, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got, ref)
        # One plan per (configuration, device, types): later launches fast.
        assert c["fast_launches"] + c["fallback_new_plan"] == 4, c
        assert c["fast_launches"] >= 3, c
        assert set(fallbacks(c)) <= {"new_plan"}, fallbacks(c)
        assert c_slow["fast_launches"] == 0
        assert fallbacks(c_slow) == {"disabled": 1}


@pytest.mark.parametrize("resolve", [True, False],
                         ids=["context_function", "numba_cukernel"])
def test_either_launch_handle_gives_numbas_results(gpu_only, rng, resolve):
    # Plans launch the bound context's CUfunction by default; the CUkernel
    # Numba itself launches is kept for comparison (bridge_cost).
    from numbax import _core
    fast, slow = jax.jit(make_affine(True)), jax.jit(make_affine(False))
    _core.set_fast_launch_resolves_function(resolve)
    _core.clear_launch_plans()
    try:
        x = random_array(rng, (1000,), np.float32)
        got, c = counted(fast, x, poisoned(1000), repeat=3)
        ref, _ = counted(slow, x, poisoned(1000))
        (handle,) = _core.launch_plan_functions()
    finally:
        _core.set_fast_launch_resolves_function(True)
        _core.clear_launch_plans()
    np.testing.assert_allclose(got, x * 2.5 + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got, ref)
    assert c["fast_launches"] == 2 and fallbacks(c) == {"new_plan": 1}, c
    # The handle the plan launches: Numba's CUkernel, or that kernel's
    # CUfunction in device 0's context.
    cukernels = {int(k._codelibrary.get_cufunc().handle)
                 for k in affine.overloads.values()}
    functions = {_core.kernel_function(k, 0) for k in cukernels}
    assert handle in (functions if resolve else cukernels), (
        handle, cukernels, functions)
    assert functions.isdisjoint(cukernels)


def test_chain_in_one_program(gpu_only, rng):
    op = make_affine(True, n=4096)

    @jax.jit
    def chain(x):
        for _ in range(20):
            x = op(x, poisoned(4096))
        return x

    x = random_array(rng, (4096,), np.float32) * 1e-3
    got, c = counted(chain, x, repeat=3)
    ref = x.astype(np.float64)
    for _ in range(20):
        ref = ref * 2.5 + 1
    np.testing.assert_allclose(got, ref, rtol=1e-4)
    assert c["fast_launches"] >= 59, c
    assert set(fallbacks(c)) <= {"new_plan"}, fallbacks(c)


@pytest.mark.parametrize("fast", [True, False])
def test_dynamic_shared_memory(rng, fast):
    threads, blocks = 128, 9

    def op(x, poison, out, stream):
        block_sums[blocks, threads, stream, threads * 4](x, out)

    fn = jax.jit(numbax.numba_cuda_callable(
        op, outs=jax.ShapeDtypeStruct((blocks,), F32),
        input_output_aliases={1: 0}, fast_launch=fast))
    x = random_array(rng, (threads * blocks - 5,), np.float32)
    want = np.pad(x, (0, 5)).reshape(blocks, threads).sum(1)
    got, c = counted(fn, x, poisoned(blocks), repeat=3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if fast and not SIMULATOR:
        assert c["fast_launches"] >= 2, c


def test_scalar_arguments_of_every_kind(gpu_only, rng):
    @cuda.jit
    def mix(x, out, k, s, flag, s32, k16):
        i = cuda.grid(1)
        if i < x.shape[0]:
            v = x[i] * s + k + s32 * k16
            out[i] = v if flag else -v

    # The same kernel compiled for explicit narrower types: the values are
    # converted and packed at the parameter's own width.
    narrow = cuda.jit("void(float32[:], float32[:], int32, float32, boolean,"
                      " float32, int16)")(mix.py_func)
    cases = [(3, 0.5, True, np.float32(1.5), np.int16(-2)),
             (-7, 2.25, False, np.float32(-0.25), np.int16(9)),
             (2**40, 1.0, True, np.float32(0), np.int16(0))]

    for kernel in (mix, narrow):
        for k, s, flag, s32, k16 in cases:
            def op(x, poison, out, stream, kernel=kernel, k=k, s=s,
                   flag=flag, s32=s32, k16=k16):
                kernel[4, 64, stream](x, out, k, s, flag, s32, k16)

            fn = jax.jit(numbax.numba_cuda_callable(
                op, outs=jax.ShapeDtypeStruct((200,), F32),
                input_output_aliases={1: 0}))
            off = jax.jit(numbax.numba_cuda_callable(
                op, outs=jax.ShapeDtypeStruct((200,), F32),
                input_output_aliases={1: 0}, fast_launch=False))
            x = random_array(rng, (200,), np.float32)
            got, c = counted(fn, x, poisoned(200), repeat=3)
            ref = np.asarray(off(x, poisoned(200)))
            np.testing.assert_array_equal(got, ref)
            kk = np.int32(np.int64(k).astype(np.int32)) if kernel is narrow else k
            v = x * np.float32(s) + np.float32(kk) + np.float32(s32) * np.float32(k16)
            np.testing.assert_allclose(got, v if flag else -v, rtol=1e-5, atol=1e-6)
            assert c["fast_launches"] >= 2, (k, s, flag, c)


@cuda.jit
def square_into(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * x[i]


@cuda.jit
def add_into(a, b, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i] + b[i]


def test_several_kernels_per_call_with_scratch(rng):
    def op(x, y, poison, out, tmp, stream):
        n = x.shape[0]
        grid = (n + 63) // 64
        square_into[grid, 64, stream](x, tmp)
        add_into[grid, 64, stream](tmp, y, out)
        square_into[grid, 64, stream](out, tmp)
        add_into[grid, 64, stream](tmp, x, out)

    n = 300
    fn = jax.jit(numbax.numba_cuda_callable(
        op, outs=jax.ShapeDtypeStruct((n,), F32),
        scratch=jax.ShapeDtypeStruct((n,), F32), input_output_aliases={2: 0}))
    x = random_array(rng, (n,), np.float32)
    y = random_array(rng, (n,), np.float32)
    got, c = counted(fn, x, y, poisoned(n), repeat=3)
    want = (x * x + y) ** 2 + x
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if not SIMULATOR:
        # square_into and add_into each have one configuration and types:
        # at most two plans to record (none if an earlier test did), every
        # other launch fast.
        assert c["fallback_new_plan"] <= 2, c
        assert c["fast_launches"] + c["fallback_new_plan"] == 12, c
        assert set(fallbacks(c)) <= {"new_plan"}, fallbacks(c)
    else:
        assert fallbacks(c) == {"simulator": 12}, fallbacks(c)
        assert c["fast_launches"] == 0


def test_lazily_compiled_kernel_per_dtype(gpu_only, rng):
    @cuda.jit
    def negate(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = -x[i]

    assert len(negate.overloads) == 0  # nothing compiled yet

    def op(x, out, stream):
        negate[(x.shape[0] + 31) // 32, 32, stream](x, out)

    jax.config.update("jax_enable_x64", True)
    try:
        for dtype in (np.float32, np.float64, np.int32):
            fn = jax.jit(numbax.numba_cuda_callable(
                op, outs=jax.ShapeDtypeStruct((77,), dtype)))
            x = random_array(rng, (77,), dtype)
            got, c = counted(fn, jnp.asarray(x), repeat=3)
            np.testing.assert_array_equal(got, -x)
            assert c["fast_launches"] >= 2, (dtype, c)
    finally:
        jax.config.update("jax_enable_x64", False)
    assert len(negate.overloads) == 3


def test_cooperative_kernel(gpu_only, rng):
    @cuda.jit
    def reverse_after_sync(x, tmp, out):
        g = cuda.cg.this_grid()
        i = cuda.grid(1)
        n = x.shape[0]
        if i < n:
            tmp[i] = x[i] * 2
        g.sync()  # every block's writes are visible after this
        if i < n:
            out[i] = tmp[n - 1 - i]

    n = 4 * 128

    def op(x, poison, out, tmp, stream):
        reverse_after_sync[4, 128, stream](x, tmp, out)

    fn = jax.jit(numbax.numba_cuda_callable(
        op, outs=jax.ShapeDtypeStruct((n,), F32), input_output_aliases={1: 0},
        scratch=jax.ShapeDtypeStruct((n,), F32)))
    x = random_array(rng, (n,), np.float32)
    got, c = counted(fn, x, poisoned(n), repeat=3)
    np.testing.assert_array_equal(got, (x * 2)[::-1])
    assert any(k.cooperative for k in reverse_after_sync.overloads.values())
    assert c["fast_launches"] >= 2, c


# -- fallbacks -------------------------------------------------------------

def test_foreign_array_falls_back(rng):
    def op(x, poison, out, stream):
        n = x.shape[0]
        temp = cuda.device_array(n, dtype=np.float32, stream=stream)
        square_into[(n + 63) // 64, 64, stream](x, temp)  # temp is foreign
        add_into[(n + 63) // 64, 64, stream](temp, x, out)

    fn = jax.jit(numbax.numba_cuda_callable(
        op, outs=jax.ShapeDtypeStruct((100,), F32), input_output_aliases={1: 0}))
    x = random_array(rng, (100,), np.float32)
    got, c = counted(fn, x, poisoned(100), repeat=3)
    np.testing.assert_allclose(got, x * x + x, rtol=1e-6, atol=1e-6)
    if not SIMULATOR:
        assert c["fallback_foreign_argument"] == 6, fallbacks(c)
        assert c["fast_launches"] == 0


def views_op(x, poison, out, stream):
    # Slices, strided views, a reshape and a transpose of the
    # arrays numbax gave func: C, A and F layouts of Numba's array types.
    square_into[2, 64, stream](x[1:51], out[:50])
    square_into[1, 32, stream](x[3::4], out[50:75])        # stride 4
    square_into[1, 32, stream](x[51::2], out[75:100])      # stride 2
    square_into[1, 32, stream](x[52:100:2], out[100:124])
    square_into[1, 32, stream](x[:1], out[124:125])
    copy2d[(1, 1), (16, 16), stream](
        x[:100].reshape(10, 10).T, out[125:225].reshape(10, 10))


def views_want(x):
    out = np.empty(225, np.float32)
    out[:50] = x[1:51] ** 2
    out[50:75] = x[3::4] ** 2
    out[75:100] = x[51::2] ** 2
    out[100:124] = x[52:100:2] ** 2
    out[124:125] = x[:1] ** 2
    out[125:225] = x[:100].reshape(10, 10).T.reshape(-1)
    return out


def test_views_of_numbax_arrays(rng):
    fast = jax.jit(numbax.numba_cuda_callable(
        views_op, outs=jax.ShapeDtypeStruct((225,), F32),
        input_output_aliases={1: 0}))
    slow = jax.jit(numbax.numba_cuda_callable(
        views_op, outs=jax.ShapeDtypeStruct((225,), F32),
        input_output_aliases={1: 0}, fast_launch=False))
    for _ in range(2):
        x = random_array(rng, (100,), np.float32)
        got, c = counted(fast, x, poisoned(225), repeat=3)
        np.testing.assert_allclose(got, views_want(x), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got, slow(x, poisoned(225)))
        if not SIMULATOR:  # which views launch fast: the test below
            assert c["fast_launches"] >= 1, fallbacks(c)


VIEW_LAUNCHES = {
    "slice": lambda x, out, s: square_into[2, 64, s](x[1:51], out[:50]),
    "stride_4": lambda x, out, s: square_into[1, 32, s](x[3::4], out[50:75]),
    "stride_2": lambda x, out, s: square_into[1, 32, s](x[51::2], out[75:100]),
    "bounded_stride_2": lambda x, out, s: square_into[1, 32, s](
        x[52:100:2], out[100:124]),
    "one_element": lambda x, out, s: square_into[1, 32, s](x[:1], out[124:125]),
    # Numba makes these two as plain DeviceNDArrays, not numbax's subclass.
    "squeeze": lambda x, out, s: square_into[1, 32, s](
        x[:32].reshape(1, 32).squeeze(), out[:32]),
    "view_same_dtype": lambda x, out, s: square_into[1, 32, s](
        x[32:64].view(np.float32), out[32:64]),
    # Numba's 2-D .T is no view: it launches Numba's transpose kernel (on
    # the array's stream, func's) into a new array, so both launches have a
    # foreign argument and fall back.
    "reshape_transpose": lambda x, out, s: copy2d[(1, 1), (16, 16), s](
        x[:100].reshape(10, 10).T, out[125:225].reshape(10, 10)),
}
NOT_VIEWS = {"reshape_transpose": {"foreign_argument"}}


@pytest.mark.parametrize("case", sorted(VIEW_LAUNCHES))
def test_each_view_kind(gpu_only, rng, case):
    """One kind of view per op: the same result as Numba's launch, and every
    launch fast once a plan exists (the first may record it, unless an
    earlier test's launch of the same kernel and layout already did)."""
    launch = VIEW_LAUNCHES[case]

    def op(x, poison, out, stream):
        launch(x, out, stream)

    def make(fast):
        return jax.jit(numbax.numba_cuda_callable(
            op, outs=jax.ShapeDtypeStruct((225,), F32),
            input_output_aliases={1: 0}, fast_launch=fast,
            name=f"test_fast_launch.view.{case}.{fast}"))
    fast, slow = make(True), make(False)
    x = random_array(rng, (100,), np.float32)
    got, c = counted(fast, x, poisoned(225), repeat=3)
    np.testing.assert_array_equal(got, slow(x, poisoned(225)))
    if case in NOT_VIEWS:
        assert c["fast_launches"] == 0, fallbacks(c)
        assert set(fallbacks(c)) == NOT_VIEWS[case], fallbacks(c)
    else:
        assert c["fast_launches"] >= 2, fallbacks(c)
        assert set(fallbacks(c)) <= {"new_plan"}, fallbacks(c)


def test_views_of_foreign_arrays_fall_back(gpu_only, rng):
    def op(x, poison, out, stream):
        own = cuda.device_array(200, np.float32, stream=stream)
        square_into[2, 64, stream](x, own[::2])   # a view of a foreign array
        square_into[2, 64, stream](own[::2], out)

    fn = jax.jit(numbax.numba_cuda_callable(
        op, outs=jax.ShapeDtypeStruct((100,), F32), input_output_aliases={1: 0}))
    x = random_array(rng, (100,), np.float32)
    got, c = counted(fn, x, poisoned(100), repeat=2)
    np.testing.assert_allclose(got, (x * x) ** 2, rtol=1e-5, atol=1e-6)
    assert c["fast_launches"] == 0 and c["fallback_foreign_argument"] == 4, c


def test_other_stream_falls_back(gpu_only, rng):
    def op(x, poison, out, stream):
        stream.synchronize()  # x is ready before the other stream reads it
        other = cuda.stream()
        square_into[2, 64, other](x, out)
        other.synchronize()

    fn = jax.jit(numbax.numba_cuda_callable(
        op, outs=jax.ShapeDtypeStruct((100,), F32), input_output_aliases={1: 0}))
    x = random_array(rng, (100,), np.float32)
    got, c = counted(fn, x, poisoned(100), repeat=3)
    np.testing.assert_allclose(got, x * x, rtol=1e-6, atol=1e-6)
    assert c["fast_launches"] == 0 and c["fallback_other_stream"] == 3, c


def test_other_thread_falls_back(gpu_only, rng):
    def op(x, poison, out, stream):
        errors = []

        def launch():
            try:
                square_into[2, 64, stream](x, out)
            except Exception as exc:  # reported below, in func's thread
                errors.append(exc)

        t = threading.Thread(target=launch)
        t.start()
        t.join()
        if errors:
            raise errors[0]

    fn = jax.jit(numbax.numba_cuda_callable(
        op, outs=jax.ShapeDtypeStruct((100,), F32), input_output_aliases={1: 0}))
    x = random_array(rng, (100,), np.float32)
    got, c = counted(fn, x, poisoned(100), repeat=3)
    np.testing.assert_allclose(got, x * x, rtol=1e-6, atol=1e-6)
    assert c["fast_launches"] == 0 and c["fallback_other_thread"] == 3, c


def test_launches_outside_numbax_are_untouched(gpu_only, rng):
    x = random_array(rng, (100,), np.float32)
    d_x = cuda.to_device(x)
    d_out = cuda.device_array(100, np.float32)
    numbax.reset_bridge_counters()
    square_into[2, 64](d_x, d_out)
    cuda.synchronize()
    np.testing.assert_allclose(d_out.copy_to_host(), x * x, rtol=1e-6, atol=1e-6)
    c = numbax.bridge_counters()
    assert c["fast_launches"] == 0 and c["fast_launch_fallbacks"] == 0, c


def test_switch_argument_and_environment(gpu_only, rng, monkeypatch):
    x = random_array(rng, (1000,), np.float32)
    _, c = counted(jax.jit(make_affine(False)), x, poisoned(1000), repeat=3)
    assert c["fast_launches"] == 0 and fallbacks(c) == {"disabled": 3}

    monkeypatch.setenv("NUMBAX_FAST_LAUNCH", "0")

    def env_op(x, poison, out, stream):  # a new op: resolved with the env set
        affine_op(x, poison, out, stream)

    fn = jax.jit(numbax.numba_cuda_callable(
        env_op, outs=jax.ShapeDtypeStruct((1000,), F32),
        input_output_aliases={1: 0}))
    got, c = counted(fn, x, poisoned(1000), repeat=3)
    np.testing.assert_allclose(got, x * 2.5 + 1, rtol=1e-6, atol=1e-6)
    assert c["fast_launches"] == 0 and fallbacks(c) == {"disabled": 3}
    assert "NUMBAX_FAST_LAUNCH" in numba_cuda_launch.status()


def test_fast_launch_argument_is_checked():
    with pytest.raises(TypeError, match="fast_launch"):
        numbax.numba_cuda_callable(affine_op, jax.ShapeDtypeStruct((4,), F32),
                                   fast_launch="yes")


# -- errors: Numba's own types, raised inside func ---------------------------

def _error_type(op, shape=(64,), aliases=None):
    """The type of the exception func saw, with the fast path on and off."""
    seen = {}
    for fast in (True, False):
        caught = []

        def wrapped(*args, caught=caught):
            try:
                op(*args)
            except Exception as exc:
                caught.append(type(exc))
                raise

        fn = numbax.numba_cuda_callable(
            wrapped, outs=jax.ShapeDtypeStruct(shape, F32), fast_launch=fast,
            name=f"error_probe_{op.__name__}_{fast}")
        with pytest.raises(jax.errors.JaxRuntimeError) as info:
            jax.block_until_ready(jax.jit(fn)(jnp.ones(shape, F32)))
        assert caught, "func did not see the error"
        # The user sees the exception func saw, by name.
        assert caught[0].__name__ in str(info.value), str(info.value)
        seen[fast] = caught[0]
    assert seen[True] is seen[False], seen
    return seen[True]


def test_launch_errors_keep_numbas_types(gpu_only):
    def too_many_threads(x, out, stream):
        square_into[1, 2048, stream](x, out)

    def grid_too_large(x, out, stream):
        square_into[(1, 70000), 32, stream](x, out)

    def shared_memory_too_large(x, out, stream):
        square_into[1, 32, stream, 1 << 30](x, out)

    def wrong_argument_types(x, out, stream):
        square_into[1, 32, stream](x, "not an array")

    def bad_configuration(x, out, stream):
        square_into[1, 32.5, stream](x, out)

    for op in (too_many_threads, grid_too_large, shared_memory_too_large,
               wrong_argument_types, bad_configuration):
        _error_type(op)


def test_compile_error_keeps_numbas_type(gpu_only):
    @cuda.jit
    def broken(x, out):
        i = cuda.grid(1)
        out[i] = x[i] + "text"  # a typing error, found when first launched

    def op(x, out, stream):
        broken[1, 64, stream](x, out)

    kind = _error_type(op)
    assert "Typing" in kind.__name__ or issubclass(kind, TypeError), kind


def test_error_after_a_plan_exists(gpu_only, rng):
    calls = {"n": 0}

    def op(x, out, stream):
        calls["n"] += 1
        if calls["n"] < 3:
            square_into[2, 64, stream](x, out)
        else:  # same configuration, an argument Numba cannot type
            square_into[2, 64, stream](x, object())

    fn = jax.jit(numbax.numba_cuda_callable(
        op, outs=jax.ShapeDtypeStruct((100,), F32)))
    x = random_array(rng, (100,), np.float32)
    _, c = counted(fn, x, repeat=2)
    # The plan may exist already (an earlier test launched square_into with
    # this configuration and these types).
    assert c["fast_launches"] + c["fallback_new_plan"] == 2, c
    assert c["fast_launches"] >= 1, c
    with pytest.raises(jax.errors.JaxRuntimeError, match="(?i)typ"):
        jax.block_until_ready(fn(x))


# -- capture, threads, devices --------------------------------------------

def test_capture_mode_with_fast_launches(gpu_only, rng):
    op = numbax.numba_cuda_callable(
        affine_op, outs=jax.ShapeDtypeStruct((1000,), F32),
        input_output_aliases={1: 0}, capture=True)
    single = jax.jit(op)

    @jax.jit
    def chain(x):  # long enough for XLA to record a command buffer
        for _ in range(6):
            x = op(x, poisoned(1000)) * 1e-3
        return x

    numbax.reset_bridge_counters()
    for _ in range(4):
        x = random_array(rng, (1000,), np.float32)
        np.testing.assert_allclose(single(x, poisoned(1000)), x * 2.5 + 1,
                                   rtol=1e-6, atol=1e-6)
        ref = x.astype(np.float64)
        for _ in range(6):
            ref = (ref * 2.5 + 1) * 1e-3
        np.testing.assert_allclose(chain(x), ref, rtol=1e-4)
    c = numbax.bridge_counters()
    assert c["fallback_numba_error"] == 0 and c["fallback_plan_error"] == 0
    assert c["fast_launches"] >= 1, c


def test_threads_share_plans(gpu_only, rng):
    fn = jax.jit(make_affine(True))
    xs = [random_array(rng, (1000,), np.float32) for _ in range(4)]
    results, errors = [None] * 4, []

    def run(i):
        try:
            for _ in range(10):
                results[i] = np.asarray(fn(xs[i], poisoned(1000)))
        except Exception as exc:
            errors.append(exc)

    numbax.reset_bridge_counters()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for x, got in zip(xs, results):
        np.testing.assert_allclose(got, x * 2.5 + 1, rtol=1e-6, atol=1e-6)
    c = numbax.bridge_counters()
    assert c["fast_launches"] >= 30, c
    assert set(fallbacks(c)) <= {"new_plan"}, fallbacks(c)


def test_second_device(gpu_only, rng):
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs two GPUs")
    fn = jax.jit(make_affine(True))
    for dev in devices[:2]:
        x = jax.device_put(random_array(rng, (1000,), np.float32), dev)
        p = jax.device_put(poisoned(1000), dev)
        got, c = counted(fn, x, p, repeat=3)
        assert got.devices() == {dev}
        np.testing.assert_allclose(got, np.asarray(x) * 2.5 + 1, rtol=1e-6, atol=1e-6)
        assert c["fast_launches"] >= 2, (dev, c)


# -- the simulator (CPU) --------------------------------------------------

def test_simulator_counts_fallbacks(simulator_only, rng):
    fn = jax.jit(make_affine(True, n=100))
    x = random_array(rng, (100,), np.float32)
    got, c = counted(fn, x, poisoned(100), repeat=3)
    np.testing.assert_allclose(got, x * 2.5 + 1, rtol=1e-6, atol=1e-6)
    assert c["fast_launches"] == 0
    assert fallbacks(c) == {"simulator": 3}
    assert "simulator" in numba_cuda_launch.status()
    assert not numba_cuda_launch.hook_installed()


def test_status_line_names_the_version():
    line = numba_cuda_launch.status()
    assert line.startswith(("on", "off")), line
    if not SIMULATOR and line.startswith("off"):
        assert "numba-cuda" in line or "NUMBAX_FAST_LAUNCH" in line


def test_unverified_version_is_off(monkeypatch):
    monkeypatch.setattr(numba_cuda_launch, "numba_cuda_version", lambda: "0.99.0")
    monkeypatch.setattr(numba_cuda_launch.numba_bridge, "simulator_enabled",
                        lambda: False)
    line = numba_cuda_launch.status()
    assert line.startswith("off") and "0.99.0" in line and "0.30" in line


def test_no_plans_leak_from_tests():
    # Plans are bounded; clearing them drops their references.
    from numbax import _core
    _core.clear_launch_plans()
    assert _core.launch_plan_count() == 0


# -- the layout C++ computes for views, against Numba's own ----------------

def _real_dummyarray():
    """numba-cuda's dummyarray module (the simulator replaces the import)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(cuda.__file__), "cudadrv",
                        "dummyarray.py")
    spec = importlib.util.spec_from_file_location("_numbax_dummyarray", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _numba_layout(dummyarray, shape, strides, itemsize):
    # DeviceNDArray._numba_type_'s rule, over dummyarray's flags.
    arr = dummyarray.Array.from_desc(0, shape, strides, itemsize)
    flags = arr.flags
    broadcast = 0 in arr.strides and arr.size != 0
    if flags["C_CONTIGUOUS"] and not broadcast:
        return "C"
    if flags["F_CONTIGUOUS"] and not broadcast:
        return "F"
    return "A"


def test_view_layout_matches_numba(rng):
    from numbax import _core
    dummyarray = _real_dummyarray()
    decided = 0
    cases = [((10,), (4,)), ((10,), (8,)), ((10,), (-4,)), ((10,), (0,)),
             ((3, 5), (20, 4)), ((3, 5), (4, 12)), ((3, 5), (40, 8)),
             ((1, 5), (999, 4)), ((5, 1), (4, 7)), ((1,), (12,)), ((), ()),
             ((2, 3, 4), (48, 16, 4)), ((2, 3, 4), (4, 8, 24)),
             ((4, 3), (0, 4)), ((0, 3), (12, 4))]
    for _ in range(3000):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(d) for d in rng.integers(0, 6, size=rank))
        itemsize = int(rng.choice([1, 2, 4, 8]))
        if rng.random() < 0.5:  # contiguous orders, then perturbed
            strides, sd = [0] * rank, itemsize
            order = range(rank - 1, -1, -1) if rng.random() < 0.5 else range(rank)
            for i in order:
                strides[i], sd = sd, sd * max(shape[i], 1)
            if rng.random() < 0.3:
                strides[int(rng.integers(rank))] *= int(rng.choice([-1, 0, 2]))
        else:
            strides = [int(s) * itemsize for s in rng.integers(-6, 7, size=rank)]
        cases.append((shape, tuple(strides)))
    for shape, strides in cases:
        itemsize = 4 if not shape or strides[-1] % 4 == 0 else 1
        ours = _core.numba_layout(list(shape), list(strides), itemsize)
        if ours:
            decided += 1
            assert ours == _numba_layout(dummyarray, shape, strides, itemsize), \
                (shape, strides, itemsize, ours)
    # It decides the usual views (C, F, strided, reversed, broadcast); only
    # empty arrays and unit extents outside C order go to Numba.
    usual = {((10,), (4,)): "C", ((10,), (8,)): "A", ((10,), (-4,)): "A",
             ((10,), (0,)): "A", ((3, 5), (20, 4)): "C",
             ((3, 5), (4, 12)): "F", ((3, 5), (40, 8)): "A",
             ((1, 5), (20, 4)): "C", ((), ()): "C"}
    for (shape, strides), layout in usual.items():
        assert _core.numba_layout(list(shape), list(strides), 4) == layout
    assert decided > len(cases) // 3, decided


# -- scalar packing, against the conversions Numba's launch makes ----------

def _numba_bytes(ty, value):
    """What Numba's _Kernel._prepare_args hands the driver for one scalar."""
    import ctypes
    from numba.cuda import types
    if ty == types.boolean:
        # Passed to cuda.core as it is: a bool as one byte, an int at its
        # own width (the kernel reads the first byte).
        if isinstance(value, (bool, np.bool_)):
            return bytes([int(bool(value))])
        return np.asarray(value).tobytes() if isinstance(value, np.generic) \
            else int(value).to_bytes(8, "little", signed=True)
    if isinstance(ty, types.Integer):
        return bytes(getattr(ctypes, f"c_{ty}")(value))
    if ty == types.float32:
        return bytes(ctypes.c_float(value))
    if ty == types.float64:
        return bytes(ctypes.c_double(value))
    if ty == types.complex64:  # two parameters: real, imag
        return [bytes(ctypes.c_float(value.real)),
                bytes(ctypes.c_float(value.imag))]
    if ty == types.complex128:
        return [bytes(ctypes.c_double(value.real)),
                bytes(ctypes.c_double(value.imag))]
    raise AssertionError(ty)


def test_scalar_packing_matches_numbas_conversions():
    from numba.cuda import types
    from numbax import _core
    values = [0, 1, -1, 7, -300, 2**31 + 5, -(2**40), 2**63 - 1, True, False,
              0.5, -2.75, 1e30, 3 + 4j, np.int8(-5), np.int16(300),
              np.int32(-7), np.int64(2**40), np.uint8(200), np.uint16(65535),
              np.uint32(2**32 - 1), np.uint64(2**64 - 1), np.float32(1.25),
              np.float64(-0.1), np.bool_(True), np.complex64(1 - 2j)]
    kinds = [types.int8, types.int16, types.int32, types.int64, types.uint8,
             types.uint16, types.uint32, types.uint64, types.boolean,
             types.float32, types.float64, types.complex64, types.complex128]
    checked = 0
    for ty in kinds:
        for value in values:
            how = numba_cuda_launch._scalar_packing(ty, value)
            if how is None:
                continue  # left to Numba's launch
            try:
                want = _numba_bytes(ty, value)
            except (TypeError, OverflowError):
                continue  # Numba's launch raises: the plan is never recorded
            if not isinstance(want, list):
                want = [want]
            got = _core.pack_scalar(how, value)
            # One 8-byte word per parameter; the driver reads each
            # parameter's own size from the start of its word.
            words = [got[i:i + 8] for i in range(0, len(got), 8)]
            assert len(words) == len(want), (ty, value, how, got, want)
            for word, param in zip(words, want):
                assert word[:len(param)] == param, (ty, value, how, got, want)
            checked += 1
    assert checked > 150, checked


# -- the C++ launch path without a GPU -------------------------------------
# A launcher class with numbax's hook, fake device arrays and test plan
# builders: the hook keys, matches arrays and views, records plans, falls
# back and packs exactly as on a GPU, and in a dry run records what it
# would send to cuLaunchKernel instead of calling it.

class _Pointer:
    def __init__(self, value):
        self.value = value


class FakeArray:
    """The attributes numbax reads from a Numba device array."""

    def __init__(self, ptr, shape, strides, dtype=np.dtype(np.float32)):
        self.ptr, self.shape, self.strides, self.dtype = ptr, shape, strides, dtype

    @property
    def device_ctypes_pointer(self):
        return _Pointer(self.ptr)

    def view(self, offset_items, shape, strides_items):
        return FakeArray(self.ptr + offset_items * self.dtype.itemsize, shape,
                         tuple(s * self.dtype.itemsize for s in strides_items),
                         self.dtype)


class _Harness:
    STREAM = 0x5000

    def __init__(self):
        from numbax import _core
        self.core = _core
        self.numba_calls = []
        self.overloads = {"sig": object()}
        self.callbacks = []
        self.plan_packing = None

        harness = self

        class Launcher:
            def __init__(self, stream=STREAM_DEFAULT):
                self.stream = stream

            def __call__(self, *args):  # "Numba's launch"
                harness.numba_calls.append(args)

        def check(cfg, args, ours, device):
            for value, slot in zip(args, ours):
                if slot == -1 and type(value) not in numba_cuda_launch.SCALAR_TYPES:
                    return "foreign_argument", True, cfg.stream
            return None, True, cfg.stream

        def plan(cfg, args, ours, device):
            return (0xABC, (2, 1, 1), (32, 1, 1), 64, False,
                    harness.plan_packing, object(), harness.overloads,
                    harness.callbacks)

        original = Launcher.__dict__["__call__"]
        Launcher.__call__ = _core.make_launch_hook(original, check, plan)
        self.Launcher = Launcher
        self.check, self.plan = check, plan
        self.a = FakeArray(0x10000, (8,), (4,))
        self.b = FakeArray(0x20000, (4, 3), (12, 4))
        self.buffers = [(0x10000, "float32", (8,)), (0x20000, "float32", (4, 3))]

    def run(self, func, enabled=True, stream=None, cached_plans=True):
        return self.core.call_as_numbax(
            func, (self.a, self.b), self.buffers,
            self.STREAM if stream is None else stream, 0, enabled,
            cached_plans)


STREAM_DEFAULT = _Harness.STREAM


@pytest.fixture
def harness():
    from numbax import _core
    _core.clear_launch_plans()
    _core.set_fast_launch_dry_run(True)
    numbax.reset_bridge_counters()
    yield _Harness()
    _core.set_fast_launch_dry_run(False)
    _core.clear_launch_plans()


def _f64(x):
    return int(np.array([x], np.float64).view(np.int64)[0])


def _f32(x):
    return int(np.array([x], np.float32).view(np.int32)[0]) & 0xFFFFFFFF


def test_hook_records_then_launches_fast(harness):
    cfg = harness.Launcher()
    harness.plan_packing = "AAidbf"
    b_t = harness.b.view(0, (3, 4), (1, 3))  # a transposed view: F layout
    launch = lambda: cfg(harness.a, b_t, -3, 2.5, True, np.float32(0.75))  # noqa: E731
    harness.run(launch)
    assert len(harness.numba_calls) == 1  # the first launch is Numba's
    c = numbax.bridge_counters()
    assert c["fallback_new_plan"] == 1 and c["fast_launches"] == 0
    harness.run(launch)
    assert len(harness.numba_calls) == 1
    assert numbax.bridge_counters()["fast_launches"] == 1
    last = harness.core.last_fast_launch()
    assert last["function"] == 0xABC and last["stream"] == _Harness.STREAM
    assert last["grid"] == (2, 1, 1) and last["block"] == (32, 1, 1)
    assert last["shared_mem"] == 64 and last["cooperative"] is False
    assert last["words"] == [
        0, 0, 8, 4, 0x10000, 8, 4,                 # a: C, its own array
        0, 0, 12, 4, 0x20000, 3, 4, 4, 12,         # b.T: F view, own strides
        -3,                                        # int
        _f64(2.5),                                 # float -> float64 word
        1,                                         # bool
        _f32(0.75)]                                # float32 (low bytes)


def test_hook_fallbacks_and_counts(harness):
    cfg = harness.Launcher()
    harness.plan_packing = "AA"
    own = lambda: cfg(harness.a, harness.b)  # noqa: E731
    harness.run(own)
    harness.run(own)
    assert len(harness.numba_calls) == 1

    # Switched off for the call: Numba's launch, counted as disabled.
    harness.run(own, enabled=False)
    # Another stream than numbax's.
    harness.run(own, stream=0x6000)
    # An array that is not a view of a buffer; a Python int beyond int64.
    outside = FakeArray(0x90000, (8,), (4,))
    harness.plan_packing = "AAi"
    harness.run(lambda: cfg(outside, harness.b))
    harness.run(lambda: cfg(harness.a, harness.b, 2**70))
    # Launches outside any numbax call are not counted.
    cfg(harness.a, harness.b)
    c = numbax.bridge_counters()
    assert c["fast_launches"] == 1, c
    assert c["fallback_disabled"] == 1 and c["fallback_other_stream"] == 1, c
    assert c["fallback_foreign_argument"] == 2, c
    assert c["fast_launch_fallbacks"] == 1 + 1 + 1 + 2, c
    assert len(harness.numba_calls) == 1 + 4 + 1


def test_hook_other_thread_callbacks_and_new_overloads(harness):
    cfg = harness.Launcher()
    harness.plan_packing = "AA"
    own = lambda: cfg(harness.a, harness.b)  # noqa: E731
    harness.run(own)

    def from_a_thread():
        t = threading.Thread(target=own)
        t.start()
        t.join()

    harness.run(from_a_thread)
    assert numbax.bridge_counters()["fallback_other_thread"] == 1
    harness.callbacks.append(lambda *a: None)  # Numba must run callbacks
    harness.run(own)
    assert numbax.bridge_counters()["fallback_unsupported_kernel"] == 1
    harness.callbacks.clear()
    harness.run(own)
    assert numbax.bridge_counters()["fast_launches"] == 1
    harness.overloads["another"] = object()  # a new overload: record again
    harness.run(own)
    c = numbax.bridge_counters()
    assert c["fallback_new_plan"] == 2 and c["fast_launches"] == 1, c
    harness.run(own)
    assert numbax.bridge_counters()["fast_launches"] == 2


def test_hook_launches_a_cached_plan_without_numba(harness):
    """A plan from numbax's cache entry (numba_cuda_launch._cached_plan): the
    first launch of a key goes straight to the driver, Numba never runs;
    a cached plan that does not fit the arguments, or a builder that
    raises or has nothing, leaves the launch to Numba as before."""
    cached = {"packing": "AAi", "raise": False, "none": False}
    asked = []

    def cached_plan(cfg, args, ours, device):
        asked.append((tuple(ours), device))
        if cached["raise"]:
            raise RuntimeError("a broken cache")
        if cached["none"]:
            return None
        return (0xCAC, (4, 1, 1), (64, 1, 1), 0, False, cached["packing"],
                object(), harness.overloads, harness.callbacks)

    core = harness.core
    harness.Launcher.__call__ = core.make_launch_hook(
        harness.Launcher.__dict__["__call__"].__wrapped__, harness.check,
        harness.plan, cached_plan)
    cfg = harness.Launcher()
    harness.plan_packing = "AAi"
    launch = lambda: cfg(harness.a, harness.b, 7)  # noqa: E731
    harness.run(launch)
    assert harness.numba_calls == [] and asked == [((0, 1, -1), 0)]
    c = numbax.bridge_counters()
    assert c["fast_launches"] == 1 and c["cached_launch_plans"] == 1, c
    assert c["fallback_new_plan"] == 0, c
    last = core.last_fast_launch()
    assert last["function"] == 0xCAC and last["grid"] == (4, 1, 1)
    assert last["words"][-1] == 7
    harness.run(launch)  # the stored plan: no second question
    assert len(asked) == 1 and harness.numba_calls == []
    assert numbax.bridge_counters()["fast_launches"] == 2

    # A capture-mode call (its warm-up must have Numba load the kernel)
    # meeting that plan: Numba launches, and its plan replaces the entry's;
    # a capture-mode call never asks for a cached plan either.
    harness.run(launch, cached_plans=False)
    assert len(harness.numba_calls) == 1 and len(asked) == 1
    harness.run(launch)
    assert len(harness.numba_calls) == 1
    assert core.last_fast_launch()["function"] == 0xABC  # Numba's plan

    # A new overload compiled since: Numba's dispatch decides again.
    harness.overloads["another"] = object()
    cached["none"] = True
    harness.run(launch)
    assert len(harness.numba_calls) == 2 and len(asked) == 2
    assert core.last_fast_launch()["function"] == 0xABC  # not relaunched

    for fault in ("raise", "packing"):
        core.clear_launch_plans()
        cached.update({"none": False, "raise": fault == "raise",
                       "packing": "AA"})  # too short for three arguments
        before = len(harness.numba_calls)
        harness.run(launch)
        assert len(harness.numba_calls) == before + 1, fault
        assert numbax.bridge_counters()["cached_launch_plans"] == 1, fault
    core.clear_launch_plans()
    cached.update({"raise": False, "packing": "AAi"})
    harness.run(launch, cached_plans=False)  # capture mode: never asked
    assert len(asked) == 4 and numbax.bridge_counters()["cached_launch_plans"] == 1
    with pytest.raises(TypeError, match="cached callable or None"):
        core.make_launch_hook(print, print, print, 3)


def test_hook_nested_launch_goes_to_numba(harness):
    harness.plan_packing = "AA"
    inner = harness.Launcher()

    class Outer:
        stream = _Harness.STREAM

        def __call__(self, *args):
            # Numba's launch launching again (as its runtime initialisation
            # may): the nested launch is Numba's, untouched and uncounted.
            harness.numba_calls.append("outer")
            inner(harness.a, harness.b)

    Outer.__call__ = harness.core.make_launch_hook(
        Outer.__dict__["__call__"], harness.check, harness.plan)
    outer = Outer()
    harness.run(lambda: outer(harness.a, harness.b))
    assert harness.numba_calls[0] == "outer" and len(harness.numba_calls) == 2
    assert harness.core.launch_plan_count() == 1
    assert numbax.bridge_counters()["fallback_new_plan"] == 1
    harness.run(lambda: outer(harness.a, harness.b))
    assert len(harness.numba_calls) == 2
    assert numbax.bridge_counters()["fast_launches"] == 1
    harness.run(lambda: inner(harness.a, harness.b))  # now its own plan
    assert numbax.bridge_counters()["fallback_new_plan"] == 2


def test_hook_views_of_buffers(harness):
    cfg = harness.Launcher()
    harness.plan_packing = "AA"
    a, b = harness.a, harness.b
    strided = a.view(1, (3,), (2,))       # a[1::2][:3]: A layout
    row = b.view(3, (3,), (1,))           # b[1]: C layout
    harness.run(lambda: cfg(strided, row))
    harness.run(lambda: cfg(strided, row))
    last = harness.core.last_fast_launch()
    assert last["words"] == [0, 0, 3, 4, 0x10004, 3, 8,
                             0, 0, 3, 4, 0x2000C, 3, 4]
    # The same view one element too far reaches past the buffer: Numba's.
    past = a.view(6, (3,), (1,))
    harness.run(lambda: cfg(past, row))
    c = numbax.bridge_counters()
    assert c["fast_launches"] == 1 and c["fallback_foreign_argument"] == 1, c
    # A view of another dtype than the buffer's is not numbax's either.
    other = FakeArray(0x10000, (8,), (4,), np.dtype(np.int32))
    harness.run(lambda: cfg(other, row))
    assert numbax.bridge_counters()["fallback_foreign_argument"] == 2


def test_plans_hold_their_configuration_until_cleared(harness):
    import gc
    import weakref
    def launch(cfg):
        harness.run(lambda: cfg(harness.a, harness.b))

    cfg = harness.Launcher()
    harness.plan_packing = "AA"
    launch(cfg)
    assert harness.core.launch_plan_count() == 1
    ref = weakref.ref(cfg)
    del cfg
    gc.collect()
    assert ref() is not None  # the plan keeps it (its address is the key)
    numbax.clear_caches()
    gc.collect()
    assert harness.core.launch_plan_count() == 0
    assert ref() is None, "a cleared plan still holds its configuration"


# -- kernel[grid, block, stream] without Numba's Python frame (no GPU) ------

def _dispatcher_class():
    """A class with Numba's CUDADispatcher.__getitem__ and lru_cache'd
    configure, as in numba-cuda 0.30, and numbax's hook installed."""
    import functools

    from numbax import _core

    class D:
        def __getitem__(self, args):
            if len(args) not in [2, 3, 4]:
                raise ValueError(
                    "must specify at least the griddim and blockdim")
            return self.configure(*args)

        # Numba's own pattern (B019: it keeps dispatchers alive, as there).
        @functools.lru_cache(maxsize=128)  # noqa: B019
        def configure(self, griddim, blockdim, stream=0, sharedmem=0):
            return ("cfg", griddim, blockdim, stream, sharedmem, object())

    D.__getitem__ = _core.make_configure_hook(
        D.__dict__["__getitem__"], D.__dict__["configure"], D)
    return D


def test_configure_hook_is_numbas_configure():
    D = _dispatcher_class()
    d, stream = D(), object()
    calls = []
    original = D.__dict__["__getitem__"].original
    assert type(D.__dict__["__getitem__"]).__name__ == "ConfigureHook"
    # The same lru_cache: the very object Numba's own path returns.
    cfg = d[4, 32, stream]
    assert cfg is d.configure(4, 32, stream) is d[4, 32, stream]
    assert cfg is original(d, (4, 32, stream))
    assert d[(4,), 32, stream] is not cfg  # another key, as in Numba
    assert d[4, 32, stream, 64][4] == 64
    # Numba's own errors, from Numba's own __getitem__.
    for bad in ((4,), (1, 2, 3, 4, 5), 7):
        with pytest.raises((ValueError, TypeError)) as got:
            d[bad]
        with pytest.raises(type(got.value)) as want:
            original(d, bad)
        assert str(got.value) == str(want.value)
    # A subclass or an instance with a configure of its own: Numba's path.
    class Sub(D):
        def configure(self, *a):
            calls.append(a)
            return "sub"
    assert Sub()[1, 2, stream] == "sub" and calls == [(1, 2, stream)]
    mine = D()
    mine.configure = lambda *a: ("own", a)
    assert mine[1, 2] == ("own", (1, 2))


def test_configure_hook_follows_a_patched_configure():
    """A configure replaced on the class after the hook was installed
    (mock.patch, a bigger cache) is the one called, as in Numba."""
    from unittest import mock
    D = _dispatcher_class()
    d, stream = D(), object()
    with mock.patch.object(D, "configure", lambda self, *a: ("patched", a)):
        assert d[1, 2, stream] == ("patched", (1, 2, stream))
    assert d[1, 2, stream][0] == "cfg"


def test_method_hooks_are_collected_with_their_class():
    """The hook sits in its class's __dict__ and holds the class: a cycle
    the garbage collector breaks (as it would Numba's own method's)."""
    import gc
    import weakref
    D = _dispatcher_class()
    D()[1, 2]
    gone = weakref.ref(D)
    del D
    gc.collect()
    assert gone() is None


def test_method_hooks_look_like_the_method_they_replace():
    import inspect
    D = _dispatcher_class()
    hook = D.__dict__["__getitem__"]
    original = hook.original
    assert hook.__wrapped__ is original
    assert hook.__name__ == "__getitem__"
    assert hook.__qualname__ == original.__qualname__
    assert list(inspect.signature(hook).parameters) == ["self", "args"]
    with pytest.raises(TypeError):
        type(hook)()  # only numbax's C++ makes hooks
    with pytest.raises(TypeError):
        type(hook).extra = 1  # and their type is fixed


def test_configure_hook_matches_installed_numba_cuda():
    """numba-cuda's CUDADispatcher has the shape the hook relies on (read
    without a GPU, outside the simulator)."""
    import subprocess
    import sys
    code = ("from numbax.compilers import numba_cuda_launch as f; "
            "print(f._configure_path_matches())")
    env = dict(__import__("os").environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stderr[-2000:]


def test_configure_hook_installed_with_the_launch_hook(gpu_only):
    from numbax.compilers import numba_cuda_launch
    make_affine()  # creating an op installs both hooks
    assert numba_cuda_launch.configure_hook_installed()
    stream = cuda.stream()
    assert affine[3, 128, stream] is affine.configure(3, 128, stream)
