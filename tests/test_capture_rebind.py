"""Captured callables re-bound to new buffer addresses (csrc/graph_rebind.h).

A capture=True op called with buffers at new addresses replays its recorded
graph with the kernel parameters patched to them, without running func in
Python, once a second recording has confirmed that func launches the same
work there. Checked here with fresh inputs on every call, views at odd
offsets, inputs that swap places, outputs aliased to inputs (over poisoned
buffers), scratch buffers, threads, XLA's own command buffers, and funcs
whose launches numbax cannot map (recorded again each time, and counted).
Results are compared with numpy on fresh random data. The counters need a
real GPU; on the simulator capture mode runs plainly and only the results
are checked.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR, random_array
from numbax.diagnostics import rebind_refusals
from shared_kernels import add_one, affine

pytestmark = pytest.mark.gpu

F32 = jnp.float32
# The simulator runs a Python thread per CUDA thread: there only the
# results are checked, on small arrays and few calls.
CALLS = 3 if SIMULATOR else 24


def size(n):
    return min(n, 67) if SIMULATOR else n


@cuda.jit
def subtract(a, b, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i] - b[i]


@cuda.jit
def affine_tagged(x, out, tag):
    # `tag` is not used: it carries whatever the func passes (an address).
    i = cuda.grid(1)
    if i < x.shape[0] and tag != 1:
        out[i] = 2 * x[i] + 1


def blocks(n, threads=128):
    return -(-n // threads)


def fresh(rng, n):
    return jnp.asarray(random_array(rng, (n,), np.float32))


def counters():
    return numbax.bridge_counters()


def delta(before, after, name):
    return after.get(name, 0) - before.get(name, 0)


# After the plain warm-up call, func runs in Python three times: the first
# recording on the thread's recording stream twice (its launch plans are new
# there, so the first attempt is not mapped), then once more to confirm the
# launches at other addresses.
PYTHON_CALLS = 3


def check_rebound(before, after, calls, *, max_python_calls=PYTHON_CALLS + 2):
    # (+2: a buffer that first moves later, an output XLA handed back at
    # the same address until then, is confirmed by one more recording.)
    """On a GPU: func ran in Python only to record and confirm the graph,
    every other call was a replay, and nothing was refused."""
    if SIMULATOR:
        return
    assert delta(before, after, "graph_rebind_refusals") == 0, rebind_refusals()
    assert delta(before, after, "calls") <= max_python_calls
    # Every other call replayed: at its recorded addresses (a hit, where XLA
    # handed the same buffers back) or re-bound; the inputs kept alive make
    # most of them move.
    replays = (delta(before, after, "graph_hits")
               + delta(before, after, "graph_rebinds"))
    assert replays >= calls - max_python_calls
    assert delta(before, after, "graph_rebinds") >= calls // 2


def affine_op(x, out, stream):
    affine[blocks(x.shape[0]), 128, stream](x, out)


def test_fresh_input_every_call_replays_without_python(rng):
    n = size(1000)
    op = jax.jit(numbax.numba_cuda_callable(
        affine_op, outs=jax.ShapeDtypeStruct((n,), F32), capture=True))
    warm = fresh(rng, n)
    np.testing.assert_allclose(op(warm), 2 * np.asarray(warm) + 1, rtol=1e-6)
    before = counters()
    kept = []  # every input and output stays alive: no address repeats
    for _ in range(CALLS):
        x = fresh(rng, n)
        y = op(x)
        kept.append((x, y))
        np.testing.assert_allclose(y, 2 * np.asarray(x) + 1, rtol=1e-6)
    after = counters()
    # The warm-up ran plainly; then one recording and one confirmation.
    check_rebound(before, after, CALLS)
    for x, y in kept:  # replays never wrote into an earlier call's output
        np.testing.assert_allclose(y, 2 * np.asarray(x) + 1, rtol=1e-6)


def test_views_at_odd_offsets(rng):
    n = size(1003)

    def views(x, out, stream):
        # x[3:] starts 12 bytes into x's buffer, out[1:] 4 into out's.
        affine[blocks(n - 3), 128, stream](x[3:], out)
        add_one[1, 32, stream](x[:1], out[:1])
        add_one[blocks(n - 4), 128, stream](out[1:n - 3], out[1:n - 3])

    op = jax.jit(numbax.numba_cuda_callable(
        views, outs=jax.ShapeDtypeStruct((n - 3,), F32), capture=True))
    op(fresh(rng, n)).block_until_ready()
    before = counters()
    kept = []  # alive: each call's buffers sit at new addresses
    for _ in range(CALLS):
        x = fresh(rng, n)
        kept.append(x)
        x = np.asarray(x)
        want = 2 * x[3:] + 2
        want[0] = x[0] + 1
        np.testing.assert_allclose(op(kept[-1]), want, rtol=1e-6)
    check_rebound(before, counters(), CALLS)


def test_inputs_that_swap_places(rng):
    n = size(777)

    def sub(a, b, out, stream):
        subtract[blocks(n), 128, stream](a, b, out)

    op = jax.jit(numbax.numba_cuda_callable(
        sub, outs=jax.ShapeDtypeStruct((n,), F32), capture=True))
    p, q = fresh(rng, n), fresh(rng, n)
    op(p, q).block_until_ready()
    before = counters()
    kept = []
    for i in range(CALLS):
        if i % 4 == 0:
            p, q = fresh(rng, n), fresh(rng, n)
            kept += [p, q]
        a, b = (p, q) if i % 2 == 0 else (q, p)
        np.testing.assert_array_equal(op(a, b), np.asarray(a) - np.asarray(b))
    check_rebound(before, counters(), CALLS)


def test_output_aliased_to_a_poisoned_input(rng):
    n = size(640)

    def into(x, poisoned, out, stream):
        # `out` is `poisoned`'s buffer: an element left unwritten stays NaN.
        affine[blocks(n), 128, stream](x, out)

    op = jax.jit(numbax.numba_cuda_callable(
        into, outs=jax.ShapeDtypeStruct((n,), F32), capture=True,
        input_output_aliases={1: 0}))
    op(fresh(rng, n), jnp.full((n,), jnp.nan, F32)).block_until_ready()
    before = counters()
    kept = []
    for _ in range(CALLS):
        x = fresh(rng, n)
        kept.append(x)
        got = np.asarray(op(x, jnp.full((n,), jnp.nan, F32)))
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, 2 * np.asarray(x) + 1, rtol=1e-6)
    check_rebound(before, counters(), CALLS)


def test_in_place_update_of_donated_state(rng):
    n = size(512)

    def bump(state, out, stream):
        add_one[blocks(n), 128, stream](state, out)

    op = numbax.numba_cuda_callable(
        bump, outs=jax.ShapeDtypeStruct((n,), F32), capture=True,
        input_output_aliases={0: 0})
    step = jax.jit(op, donate_argnums=0)
    start = np.asarray(fresh(rng, n))
    y = step(jnp.asarray(start))
    before = counters()
    for _ in range(CALLS):
        y = step(y)
    np.testing.assert_allclose(y, start + CALLS + 1, rtol=1e-5)
    if not SIMULATOR:
        assert delta(before, counters(), "graph_rebind_refusals") == 0
        assert delta(before, counters(), "calls") <= PYTHON_CALLS


def test_scratch_buffers(rng):
    n = size(901)

    def two_steps(x, out, scratch, stream):
        add_one[blocks(n), 128, stream](x, scratch)
        affine[blocks(n), 128, stream](scratch, out)

    op = jax.jit(numbax.numba_cuda_callable(
        two_steps, outs=jax.ShapeDtypeStruct((n,), F32),
        scratch=jax.ShapeDtypeStruct((n,), F32), capture=True))
    op(fresh(rng, n)).block_until_ready()
    before = counters()
    kept = []
    for _ in range(CALLS):
        x = fresh(rng, n)
        kept.append(x)
        np.testing.assert_allclose(op(x), 2 * (np.asarray(x) + 1) + 1,
                                   rtol=1e-6)
    check_rebound(before, counters(), CALLS)


def test_threads_calling_one_op_with_their_own_inputs(rng):
    n = size(2048)
    op = jax.jit(numbax.numba_cuda_callable(
        affine_op, outs=jax.ShapeDtypeStruct((n,), F32), capture=True))
    op(fresh(rng, n)).block_until_ready()
    inputs = [[fresh(rng, n) for _ in range(CALLS)] for _ in range(4)]
    failures = []

    def work(xs):
        try:
            for x in xs:
                np.testing.assert_allclose(op(x), 2 * np.asarray(x) + 1,
                                           rtol=1e-6)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    before = counters()
    threads = [threading.Thread(target=work, args=(xs,)) for xs in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
    if not SIMULATOR:
        after = counters()
        assert delta(before, after, "graph_rebind_refusals") == 0
        assert delta(before, after, "graph_rebinds") >= 4 * CALLS - 8


def test_chain_in_one_program_with_a_fresh_input_each_call(rng):
    n = size(4096)
    op = numbax.numba_cuda_callable(
        affine_op, outs=jax.ShapeDtypeStruct((n,), F32), capture=True)

    @jax.jit
    def chain(v):
        for _ in range(12):
            v = op(v)
        return v

    def run():
        x = random_array(rng, (n,), np.float32) * 1e-3
        want = x.astype(np.float64)
        for _ in range(12):
            want = 2 * want + 1
        np.testing.assert_allclose(chain(jnp.asarray(x)), want, rtol=1e-5)

    for _ in range(2 if SIMULATOR else 5):  # warm-up, record, confirm
        run()
    before = counters()
    for _ in range(CALLS):
        run()
    after = counters()
    if not SIMULATOR:
        assert delta(before, after, "graph_rebind_refusals") == 0, \
            rebind_refusals()
        # Without re-binding, each call would run func for every op whose
        # buffers moved (XLA's command buffer or numbax's own graphs): 12
        # per call. With it, func runs only to confirm a buffer that first
        # moves late (how many runs are in flight decides which addresses
        # XLA hands out): at most once per op and buffer, 2 buffers each.
        assert delta(before, after, "calls") <= 2 * 12, (before, after)


def unmappable_ops(n):
    """Funcs whose recordings numbax must not re-bind, by reason."""
    first = []

    def address_as_scalar(x, out, stream):
        tag = x.device_ctypes_pointer.value  # an address numbax did not pack
        affine_tagged[blocks(n), 128, stream](x, out, tag)

    def launches_follow_the_address(x, out, stream):
        first.append(x.device_ctypes_pointer.value)
        affine[blocks(n), 128, stream](x, out)
        if x.device_ctypes_pointer.value != first[0]:
            affine[blocks(n), 128, stream](x, out)  # same result, more work

    def copies(x, out, stream):
        out.copy_to_device(x, stream=stream)  # a memcpy node
        affine[blocks(n), 128, stream](x, out)

    return {"address": address_as_scalar, "launches": launches_follow_the_address,
            "copy": copies}


@pytest.mark.parametrize("case", ["address", "launches", "copy"])
def test_unmappable_funcs_are_recorded_again(gpu_only, rng, case):
    n = size(300)
    func = unmappable_ops(n)[case]
    op = jax.jit(numbax.numba_cuda_callable(
        func, outs=jax.ShapeDtypeStruct((n,), F32), capture=True))
    op(fresh(rng, n)).block_until_ready()
    before = counters()
    kept = []
    for _ in range(8):
        x = fresh(rng, n)
        kept.append(x)
        np.testing.assert_allclose(op(x), 2 * np.asarray(x) + 1, rtol=1e-6)
    after = counters()
    assert delta(before, after, "graph_rebind_refusals") == 1
    assert delta(before, after, "graph_rebinds") == 0
    # Refused: func runs (is recorded) for every new set of addresses (the
    # first recording twice: its launch plans were new).
    assert delta(before, after, "calls") >= 8
    key, why = rebind_refusals()[-1]
    assert func.__name__ in key
    assert why


def test_refused_op_runs_func_once_per_recording(gpu_only, rng):
    """A func whose launch configuration is new on every call (a computed
    grid) never gives a log that maps, so its call site is refused. From
    then on each new set of addresses runs func once to record it: no log,
    no second attempt."""
    n = size(300)
    runs = [0]

    def grid_grows_each_call(x, out, stream):
        runs[0] += 1
        affine[blocks(n) + runs[0], 128, stream](x, out)  # extra blocks idle

    op = jax.jit(numbax.numba_cuda_callable(
        grid_grows_each_call, outs=jax.ShapeDtypeStruct((n,), F32),
        capture=True))
    kept = []
    for _ in range(3):  # warm-up, then recordings until refused
        kept.append(fresh(rng, n))
        op(kept[-1]).block_until_ready()
    assert "grid_grows_each_call" in rebind_refusals()[-1][0]
    before, runs_before = counters(), runs[0]
    for _ in range(8):
        x = fresh(rng, n)
        kept.append(x)
        np.testing.assert_allclose(op(x), 2 * np.asarray(x) + 1, rtol=1e-6)
    after = counters()
    recordings = delta(before, after, "graph_misses")
    assert recordings >= 6, (before, after)
    assert runs[0] - runs_before == recordings


def test_clear_caches_forgets_the_recording(gpu_only, rng):
    n = size(256)
    op = jax.jit(numbax.numba_cuda_callable(
        affine_op, outs=jax.ShapeDtypeStruct((n,), F32), capture=True))
    for _ in range(4):
        x = fresh(rng, n)
        np.testing.assert_allclose(op(x), 2 * np.asarray(x) + 1, rtol=1e-6)
    numbax.clear_caches()
    before = counters()
    for _ in range(6):
        x = fresh(rng, n)
        np.testing.assert_allclose(op(x), 2 * np.asarray(x) + 1, rtol=1e-6)
    after = counters()
    assert delta(before, after, "graph_misses") >= 2  # recorded anew
    assert delta(before, after, "graph_rebinds") >= 3


@cuda.jit
def scale_by(x, out, factor):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * factor


def host_reading_funcs(n):
    """Funcs that read a device value on the host and launch with it: a
    recording would freeze the value (and the launch chosen with it)."""

    def copies_to_host(x, s, out, stream):
        factor = s.copy_to_host()[0]  # no stream: the array's own
        scale_by[blocks(n), 128, stream](x, out, factor)

    def reads_an_element(x, s, out, stream):
        factor = float(s[0])  # a device array's element, read on the host
        scale_by[blocks(n), 128, stream](x, out, factor)

    def grid_from_the_device(x, s, out, stream):
        # The value chooses the launch itself: how many elements to cover.
        count = int(s.copy_to_host()[0])
        scale_by[blocks(count), 128, stream](x[:count], out[:count], 1.0)

    return {"copy_to_host": copies_to_host, "element": reads_an_element,
            "grid": grid_from_the_device}


@pytest.mark.parametrize("keep", [False, True], ids=["reused", "kept"])
@pytest.mark.parametrize("case", ["copy_to_host", "element", "grid"])
def test_a_func_reading_device_memory_on_the_host_is_not_captured(
        gpu_only, rng, case, keep):
    """Before: such a func was recorded once and re-bound (or replayed),
    and 8 of 9 calls with new contents gave the first call's answer (seen
    on the H200). Now the recording that copies is dropped, the call site
    is refused with the reason, and func runs plainly from then on."""
    n = size(512)
    func = host_reading_funcs(n)[case]
    op = jax.jit(numbax.numba_cuda_callable(
        func, outs=jax.ShapeDtypeStruct((n,), F32), capture=True))

    def inputs():
        x = fresh(rng, n)
        if case == "grid":
            count = int(rng.integers(1, n + 1))
            return x, jnp.asarray([count], F32), count
        return x, jnp.asarray(rng.uniform(0.5, 4.0, 1).astype(np.float32)), 0

    def expected(x, s, count):
        x = np.asarray(x)
        if case == "grid":
            return x[:count]  # the rest of out is unset: not compared
        return x * np.asarray(s)[0]

    def check(x, s, count, y):
        y = np.asarray(y)
        got = y[:count] if case == "grid" else y
        np.testing.assert_allclose(got, expected(x, s, count), rtol=1e-6)

    x, s, count = inputs()
    check(x, s, count, op(x, s))  # the warm-up runs plainly
    before = counters()
    kept = []
    for _ in range(9):
        x, s, count = inputs()
        y = op(x, s)
        check(x, s, count, y)
        if keep:  # every buffer stays alive: no address repeats
            kept.append((x, s, count, y))
    after = counters()
    assert delta(before, after, "graph_hits") == 0, (before, after)
    assert delta(before, after, "graph_rebinds") == 0, (before, after)
    assert delta(before, after, "calls") >= 9
    refusals = [why for key, why in rebind_refusals() if func.__name__ in key]
    assert refusals and "copied device memory to the host" in refusals[-1], \
        rebind_refusals()
    assert "runs func plainly" in refusals[-1]
    for x, s, count, y in kept:  # later calls never wrote earlier outputs
        check(x, s, count, y)


def test_watch_wraps_numbas_device_to_host_once():
    """The part of the detection a CPU can check: Numba's device_to_host is
    wrapped to tell numbax first, then copy as before; wrapping twice keeps
    one wrapper; and outside a capture-mode recording the note is a no-op
    (the C++ side is tests/cpp/launch_log_test.cc, HostReadWatch)."""
    from types import SimpleNamespace

    from numbax import _core
    from numbax.runtime import numba_bridge

    copies, notes = [], []

    def device_to_host(dst, src, size, stream=0):
        copies.append((dst, src, size, stream))

    fake = SimpleNamespace(device_to_host=device_to_host)
    assert numba_bridge.watch_host_copies(fake, note=lambda: notes.append(1))
    wrapped = fake.device_to_host
    assert wrapped is not device_to_host
    wrapped("dst", "src", 8, stream=3)
    assert copies == [("dst", "src", 8, 3)] and notes == [1]
    assert numba_bridge.watch_host_copies(fake, note=lambda: notes.append(2))
    assert fake.device_to_host is wrapped  # not wrapped again
    assert _core.note_device_to_host() is False  # no recording here
    if not SIMULATOR:
        # On a GPU numbax has wrapped Numba's own driver.
        from numba.cuda.cudadrv import driver
        assert getattr(driver.device_to_host, "_numbax_watched", False)
