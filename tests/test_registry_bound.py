"""The registry stays bounded however many shapes an op meets.

Every distinct input shape or vmap batch size gives a new program key and
registry entry; a long-running service with varying shapes made them grow
without bound (200 batch sizes: 200 entries, which no clear_caches freed).
numbax keeps the most recently used MAX_ENTRIES and rebuilds an evicted
one from its key when a program needs it again; numbax.clear_caches()
drops them all. An XLACustomKernel keeps what its generator returned (one
op per static value or shape) the same way: the most recently used
MAX_GENERATED, an evicted one released once no compiled program holds it.

A kernel op vmapped over 60 batch sizes (24 in the simulator) with the
bound lowered to 8 entries and 4 launchers keeps right results for evicted
sizes, for a program lowered before the eviction and after clear_caches();
callables over 150 shapes stay within the default bound.
"""

import gc
import sys
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from numbax.custom_kernel import kernels as custom_kernels
from numbax.kernel import simulator
from numbax.runtime import registry
from conftest import SIMULATOR, assert_close, grid_for, kernel_op, random_array
from shared_kernels import add_one

pytestmark = pytest.mark.gpu

N = 16


@cuda.jit
def plus_one(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + 1


def plus_one_launch(x, out, stream):
    plus_one[1, 64, stream](x, out)


def total_entries():
    return sum(registry.registry_size())


@pytest.fixture
def small_bounds(monkeypatch):
    monkeypatch.setattr(registry, "MAX_ENTRIES", 6, raising=False)
    monkeypatch.setattr(simulator, "MAX_LAUNCHERS", 4)


def test_callable_over_many_shapes_stays_bounded(small_bounds):
    op = numbax.numba_cuda_callable(
        plus_one_launch, jax.ShapeDtypeStruct((N,), jnp.float32),
        name="registry_bound.plus_one")
    compiled = []
    for n in range(N, N + 12):
        g = jax.jit(op)
        x = jnp.arange(n, dtype=jnp.float32)
        np.testing.assert_array_equal(np.asarray(g(x)), np.arange(N) + 1)
        compiled.append((g, x))
        assert total_entries() <= 6
    # A program compiled while its entry lived still runs after eviction.
    g, x = compiled[0]
    np.testing.assert_array_equal(np.asarray(g(x)), np.arange(N) + 1)


def test_clear_caches_drops_every_entry_and_ops_still_run():
    op = numbax.numba_cuda_kernel(
        plus_one, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    f = jax.vmap(op)
    for b in (2, 3):
        f(jnp.ones((b, N), jnp.float32))
    assert total_entries() > 0
    numbax.clear_caches()
    assert total_entries() == 0
    assert not op.launchers
    jax.clear_caches()
    np.testing.assert_array_equal(
        np.asarray(f(jnp.ones((2, N), jnp.float32))), 2.0)
    np.testing.assert_array_equal(
        np.asarray(op(jnp.ones(N, jnp.float32))), 2.0)


def _scaling_op(name, made):
    """An XLACustomKernel whose generator makes a kernel per factor (a
    closure, as generators' kernels usually are), noting each op it returns
    in `made` as (factor, weak reference)."""
    op = numbax.XLACustomKernel(name)

    @op.def_numba_cuda_kernel
    def _(*, factor, outs):
        @cuda.jit
        def scale(x, out):
            i = cuda.grid(1)
            if i < out.shape[0]:
                out[i] = x[i] * factor

        fn = numbax.numba_cuda_kernel(scale, outs, launch_dims=N)
        made.append((factor, weakref.ref(fn)))
        return fn

    return op


def test_custom_kernel_keeps_at_most_max_generated_ops(monkeypatch, rng):
    monkeypatch.setattr(custom_kernels, "MAX_GENERATED", 3, raising=False)
    made: list = []
    op = _scaling_op("registry_bound.scale", made)
    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    x = rng.standard_normal(N).astype(np.float32)
    for factor in range(1, 9):
        np.testing.assert_allclose(
            np.asarray(op(x, outs=spec, factor=float(factor))), x * factor,
            rtol=1e-6)
    assert [f for f, _ in made] == [float(f) for f in range(1, 9)]
    # The evicted ones live only in JAX's compiled programs (an eager call
    # is one too): once those go, they are released; the kept ones stay.
    jax.clear_caches()
    gc.collect()
    assert [f for f, ref in made if ref() is not None] == [6.0, 7.0, 8.0]
    assert [fn() for _, fn in made[5:]] == op.kernels.kept()
    # An evicted factor is generated again, and right; a kept one is not.
    y = rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(np.asarray(op(y, outs=spec, factor=1.0)), y,
                               rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(jax.jit(lambda v: op(v, outs=spec, factor=8.0))(y)),
        y * 8, rtol=1e-6)
    assert [f for f, _ in made][8:] == [1.0]
    assert len(op.kernels.kept()) == 3


def test_custom_kernel_program_runs_after_its_op_was_evicted(
        monkeypatch, rng):
    # A program compiled before its generated op was evicted keeps running
    # what it was compiled with; a new trace finds the op again while it
    # lives, else its generator makes it again: right either way.
    monkeypatch.setattr(custom_kernels, "MAX_GENERATED", 2, raising=False)
    made: list = []
    op = _scaling_op("registry_bound.scale_held", made)
    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    x = rng.standard_normal(N).astype(np.float32)
    held = jax.jit(lambda v: op(v, outs=spec, factor=3.0))
    np.testing.assert_allclose(np.asarray(held(x)), x * 3, rtol=1e-6)
    for factor in (4.0, 5.0, 6.0):
        jax.jit(lambda v, f=factor: op(v, outs=spec, factor=f))(x)
    kept = op.kernels.kept()
    assert len(kept) == 2 and all(made[0][1]() is not fn for fn in kept)
    gc.collect()
    np.testing.assert_allclose(np.asarray(held(x + 1)), (x + 1) * 3,
                               rtol=1e-6)
    again = jax.jit(lambda v: op(v, outs=spec, factor=3.0))
    np.testing.assert_allclose(np.asarray(again(x - 1)), (x - 1) * 3,
                               rtol=1e-6)


@cuda.jit
def times_ten(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 10


@pytest.mark.parametrize("drop", ["evicted", "cleared"])
def test_a_program_compiled_alone_runs_its_op_after_a_twin_and_a_drop(
        small_bounds, drop, rng):
    # Op `a` is lowered while it alone has its name (a plain key), a second
    # op takes the same name, then a's entry is dropped (by the bound, or by
    # clear_caches). The plain key now fits two functions; the program
    # compiled here still means a's and must run it (it was refused as
    # ambiguous), never b's.
    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    a = numbax.numba_cuda_kernel(plus_one, spec, launch_dims=N, name="late_twin")
    x = rng.standard_normal(N).astype(np.float32)
    lowered = jax.jit(a).lower(x)
    b = numbax.numba_cuda_kernel(times_ten, spec, launch_dims=N, name="late_twin")
    np.testing.assert_allclose(jax.jit(b)(x), x * 10, rtol=1e-6)
    if drop == "evicted":
        for n in range(1, 9):  # more keys than the bound: a's goes
            other = numbax.numba_cuda_kernel(
                plus_one, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n)
            jax.jit(other)(x[:n])
    else:
        numbax.clear_caches()
    np.testing.assert_allclose(lowered.compile()(x), x + 1, rtol=1e-6)
    # And b's own programs still run b.
    np.testing.assert_allclose(jax.jit(b)(x + 1), (x + 1) * 10, rtol=1e-6)


def test_a_foreign_plain_key_of_a_shared_name_is_still_refused():
    # The remembered keys are this process's own: a plain key traced
    # nowhere here, whose name two live functions share, stays ambiguous.
    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    a = numbax.numba_cuda_kernel(plus_one, spec, launch_dims=N, name="foreign_twin")
    b = numbax.numba_cuda_kernel(times_ten, spec, launch_dims=N, name="foreign_twin")
    group = next(g for g in registry._groups if g.startswith("foreign_twin/"))
    key = f"{group}/in=float32[{N}];batch=0"
    with pytest.raises(KeyError, match="is ambiguous in this process"):
        registry._lookup(key, "cuda", "kernel")
    del a, b


def test_clear_caches_while_first_calls_of_new_kernel_ops_run(simulator_only):
    # numbax.clear_caches() from another thread while new
    # kernel ops make their first calls. A kernel op's simulator launcher is
    # what its registry entry refers to (weakly); clear_caches dropped it
    # between the trace and XLA's instantiate stage, and about a third of
    # the calls failed with a false "function was garbage-collected" that
    # named numba_cuda_callable. A call racing with clear_caches must
    # rebuild what it needs from the op, and succeed.
    stop = threading.Event()
    clears = [0]
    errors = []

    def clear_loop():
        while not stop.is_set() and clears[0] < 100_000:
            numbax.clear_caches()
            clears[0] += 1

    def first_calls(t):
        try:
            for i in range(12):
                n = 3 + 16 * t + i  # a new op (and a new compile) per call
                op = numbax.numba_cuda_kernel(
                    plus_one, jax.ShapeDtypeStruct((n,), jnp.float32),
                    launch_dims=n)
                x = np.arange(n, dtype=np.float32) * (t + 1)
                np.testing.assert_array_equal(
                    np.asarray(jax.jit(op)(x)), x + 1)
        except Exception as exc:  # reported, with its message, below
            errors.append(exc)

    # Switch threads often, so that the clears land inside the calls.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    clearer = threading.Thread(target=clear_loop, daemon=True)
    workers = [threading.Thread(target=first_calls, args=(t,), daemon=True)
               for t in range(3)]
    try:
        clearer.start()
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=240)
    finally:
        stop.set()
        clearer.join(timeout=60)
        sys.setswitchinterval(interval)
    assert not any(w.is_alive() for w in workers), "a worker did not finish"
    assert clears[0] > 0
    assert not errors, [str(e)[:600] for e in errors]


M = 16 if SIMULATOR else 64
# The bound numbax.clear_caches() documents.
DEFAULT_BOUND = 4096


@pytest.mark.usefixtures("x64")
def test_kernel_vmap_over_many_batch_sizes_stays_bounded(small_registry, rng):
    small_registry(8, launchers=4)
    op = kernel_op(add_one, (M,), jnp.float32)
    f = jax.vmap(op)
    early = random_array(rng, (37, M), np.float32)
    lowered = jax.jit(f).lower(early)
    peak = 0
    for b in range(1, 25 if SIMULATOR else 61):
        xs = random_array(rng, (b, M), np.float32)
        assert_close(f(xs), xs + 1, f"batch {b}")
        peak = max(peak, total_entries())
        assert len(op.launchers) <= 4, len(op.launchers)
    assert peak <= 8, f"the registry grew to {peak} entries (bound 8)"
    for b in (1, 2, 3, 5):  # evicted long ago
        xs = random_array(rng, (b, M), np.float32)
        assert_close(jax.jit(f)(xs), xs + 1, f"evicted batch {b}")
    assert_close(lowered.compile()(early), early + 1, "lowered before the eviction")
    jax.clear_caches()
    numbax.clear_caches()
    assert total_entries() == 0, numbax.registry_size()
    xs = random_array(rng, (7, M), np.float32)
    assert_close(f(xs), xs + 1, "after clear_caches")


@pytest.mark.usefixtures("x64")
def test_callables_over_many_shapes_stay_within_the_default_bound(rng):
    def launch(x, out, stream):
        add_one[grid_for(out.size), 256, stream](x.reshape(x.size), out.reshape(out.size))

    for n in range(1, 40 if SIMULATOR else 150):
        op = numbax.numba_cuda_callable(launch, jax.ShapeDtypeStruct((n,), jnp.float32))
        x = random_array(rng, n, np.float32)
        assert_close(op(x), x + 1, f"n={n}")
    assert total_entries() <= DEFAULT_BOUND, numbax.registry_size()
