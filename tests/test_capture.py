"""Capture mode and scratch buffers (graph behaviour is GPU-only)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR, random_array
from shared_kernels import affine, add_one

pytestmark = pytest.mark.gpu

F32 = jnp.float32


def affine_op(x, out, stream):
    affine[-(-x.shape[0] // 128), 128, stream](x, out)


def make(capture, n=1000):
    return numbax.numba_cuda_callable(
        affine_op, outs=jax.ShapeDtypeStruct((n,), F32), capture=capture)


def test_capture_matches_plain_on_fresh_inputs(rng):
    plain, captured = make(False), make(True)
    jp, jc = jax.jit(plain), jax.jit(captured)
    kept = []
    for _ in range(8):
        # New arrays each time (kept alive), so addresses keep changing.
        x = jnp.asarray(random_array(rng, (1000,), np.float32))
        kept.append(x)
        expected = 2 * np.asarray(x) + 1
        np.testing.assert_allclose(jc(x), expected, rtol=1e-6)
        np.testing.assert_allclose(captured(x), expected, rtol=1e-6)
        np.testing.assert_array_equal(jc(x), jp(x))


def test_capture_chain_in_one_program(rng):
    # The simulator runs each thread in Python: 256 elements (2 blocks)
    # show the same (as test_kernel.py's test_chain_in_one_program).
    n = 256 if SIMULATOR else 4096
    op = make(True, n)

    @jax.jit
    def chain(v):
        for _ in range(12):
            v = op(v)
        return v

    for _ in range(3):
        x = random_array(rng, (n,), np.float32) * 1e-3
        expected = x.astype(np.float64)
        for _ in range(12):
            expected = 2 * expected + 1
        np.testing.assert_allclose(chain(x), expected, rtol=1e-5)


def test_graph_cache_hits_replay_without_python(gpu_only, rng):
    op = jax.jit(make(True))
    x = jnp.asarray(random_array(rng, (1000,), np.float32))
    op(x).block_until_ready()  # warm-up: runs plainly, compiles the kernel
    numbax.reset_bridge_counters()
    for _ in range(20):
        np.testing.assert_allclose(op(x), 2 * np.asarray(x) + 1, rtol=1e-6)
    c = numbax.bridge_counters()
    assert c["graph_misses"] >= 1
    assert c["graph_hits"] >= 1
    # Every replay skipped Python: calls into func happen only on misses.
    assert c["calls"] == c["graph_misses"]


def test_graph_cache_lru_eviction_and_clear(gpu_only, rng):
    # Without fast launches numbax cannot map func's launches, so its graphs
    # are never re-bound: one per set of addresses, in the LRU.
    numbax.set_graph_cache_size(2)
    try:
        op = jax.jit(numbax.numba_cuda_callable(
            affine_op, outs=jax.ShapeDtypeStruct((1000,), F32), capture=True,
            fast_launch=False))
        xs = [jnp.asarray(random_array(rng, (1000,), np.float32))
              for _ in range(6)]
        outs = [op(x) for x in xs]  # all kept: distinct buffer addresses
        numbax.reset_bridge_counters()
        outs += [op(x) for x in xs]
        c = numbax.bridge_counters()
        assert c["graph_evictions"] >= 3
        for x, o in zip(xs + xs, outs):
            np.testing.assert_allclose(o, 2 * np.asarray(x) + 1, rtol=1e-6)
        numbax.clear_caches()
        np.testing.assert_allclose(op(xs[0]), 2 * np.asarray(xs[0]) + 1,
                                   rtol=1e-6)
    finally:
        numbax.set_graph_cache_size(16)


def test_capture_rule_violation_is_a_clear_error(gpu_only, rng):
    def syncs(x, out, stream):
        affine[-(-x.shape[0] // 128), 128, stream](x, out)
        stream.synchronize()  # not allowed while captured

    op = jax.jit(numbax.numba_cuda_callable(
        syncs, outs=jax.ShapeDtypeStruct((100,), F32), capture=True))
    x = jnp.asarray(random_array(rng, (100,), np.float32))
    op(x).block_until_ready()  # the plain warm-up call is allowed to sync
    y = jnp.asarray(random_array(rng, (100,), np.float32))
    with pytest.raises(Exception, match="capture=True.*synchronise"):
        jax.block_until_ready(op(y))
    # The process and the stream are healthy afterwards.
    ok = jax.jit(make(True, 100))
    np.testing.assert_allclose(ok(y), 2 * np.asarray(y) + 1, rtol=1e-6)


def test_capture_allocation_is_a_clear_error(gpu_only, rng):
    def allocates(x, out, stream):
        temp = cuda.device_array(x.shape[0], dtype=np.float32)
        add_one[-(-x.shape[0] // 128), 128, stream](x, temp)
        add_one[-(-x.shape[0] // 128), 128, stream](temp, out)

    op = jax.jit(numbax.numba_cuda_callable(
        allocates, outs=jax.ShapeDtypeStruct((64,), F32), capture=True))
    x = jnp.asarray(random_array(rng, (64,), np.float32))
    np.testing.assert_allclose(op(x), np.asarray(x) + 2, rtol=1e-6)
    y = jnp.asarray(random_array(rng, (64,), np.float32))
    with pytest.raises(Exception, match="capture=True.*allocate"):
        jax.block_until_ready(op(y))


def test_capture_launch_off_the_stream_is_a_clear_error(gpu_only, rng):
    def forgets_stream(x, out, stream):
        affine[-(-x.shape[0] // 128), 128](x, out)  # legacy default stream

    op = jax.jit(numbax.numba_cuda_callable(
        forgets_stream, outs=jax.ShapeDtypeStruct((96,), F32), capture=True))
    x = jnp.asarray(random_array(rng, (96,), np.float32))
    op(x).block_until_ready()  # plain warm-up
    y = jnp.asarray(random_array(rng, (96,), np.float32))
    with pytest.raises(Exception, match="capture=True.*stream it is given"):
        jax.block_until_ready(op(y))


@pytest.mark.parametrize("capture", [False, True])
def test_scratch_buffers(rng, capture):
    seen = []

    def two_steps(x, out, scratch, stream):
        seen.append((tuple(scratch.shape), scratch.dtype))
        threads = 128
        blocks = -(-x.shape[0] // threads)
        add_one[blocks, threads, stream](x, scratch)
        affine[blocks, threads, stream](scratch, out)

    n = 777
    op = jax.jit(numbax.numba_cuda_callable(
        two_steps, outs=jax.ShapeDtypeStruct((n,), F32),
        scratch=jax.ShapeDtypeStruct((n,), F32), capture=capture))
    for _ in range(4):
        x = random_array(rng, (n,), np.float32)
        out = op(x)
        assert not isinstance(out, (tuple, list))  # scratch is not returned
        np.testing.assert_allclose(out, 2 * (x + 1) + 1, rtol=1e-6)
    assert seen[0] == ((n,), np.dtype(np.float32))


def test_graph_cache_size_validation():
    with pytest.raises(ValueError, match=">= 1"):
        numbax.set_graph_cache_size(0)


@pytest.mark.parametrize("stop", [1, 2, 3, 4])
def test_bridge_stops_never_reach_capture_mode(gpu_only, rng, stop):
    # The bridge benchmark's stops end plain calls early; a capture-mode
    # call stopped so would warm up or record nothing, and replay that
    # (wrong outputs) after the stop is lifted. Capture-mode calls run whole.
    from numbax import _core
    jc = jax.jit(make(True))
    x = jnp.asarray(random_array(rng, (1000,), np.float32))
    try:
        _core.set_bridge_stop(stop)
        during = [np.asarray(jc(x)) for _ in range(3)]  # warm-up, record, replay
    finally:
        _core.set_bridge_stop(0)
    expected = 2 * np.asarray(x) + 1
    for got in during + [np.asarray(jc(x))]:
        np.testing.assert_allclose(got, expected, rtol=1e-6)
