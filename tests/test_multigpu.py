"""numbax on every local GPU of one host: shard_map, sharded jit, threads.

Marked `multigpu`: skipped below 2 local devices (tests/conftest.py).
scripts/gpu_check.sh runs them on a machine with 2 or more GPUs. With
NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu
XLA_FLAGS=--xla_force_host_platform_device_count=2 they run on 2 fake CPU
devices through Numba's CUDA simulator, where device ids are not real (the checks
of them are GPU only) and funcs run one at a time.

Every check compares with numpy on fresh random data, shard by shard. Each
op (tests/tagged_ops.py) also writes TAG + the id of the CUDA device it runs on
(cuda.get_current_device().id) into an output, which must be the device XLA
put the shard on; the offset keeps an unwritten, zeroed tag from passing as
device 0.
"""

import faulthandler
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from numba import cuda

import numbax
from conftest import SIMULATOR
from tagged_ops import (TAG, affine_kernel, affine_tagged, blocks,
                        current_device_id, fill_kernel, hardware_id,
                        tagged_ops)
from shared_kernels import row_scale as rows_kernel

pytestmark = [
    pytest.mark.multigpu,
    # One-block fills of a device tag: low occupancy on purpose.
    pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaPerformanceWarning"),
]

F32, I32 = jnp.float32, jnp.int32
N = 256 if SIMULATOR else 1 << 16          # elements per shard
SHARD_MAP_REPEATS = 10 if SIMULATOR else 200
JIT_REPEATS = 5 if SIMULATOR else 50
THREADS = 8
THREAD_ITERATIONS = 5 if SIMULATOR else 50
JOIN_TIMEOUT = 300
WATCHDOG = 1200  # seconds for the whole module
OPS = ("plain", "capture", "kernel")
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce",
               "reduce-scatter")


calls_lock = threading.Lock()
calls = []  # (device id, shape of the first input) per rows_tagged call


def rows_tagged(m, s, out, dev, stream):
    """out = m * s[:, None] + column; dev[i] = TAG + device id, every row."""
    with calls_lock:
        calls.append((current_device_id(), tuple(m.shape)))
    rows_kernel[blocks(m.shape[0]), 256, stream](m, s, out)
    fill_kernel[blocks(dev.shape[0]), 256, stream](dev, TAG + current_device_id())


class Failures(list):
    """The first few failures of a check, for its assertion message."""

    def add(self, message):
        if len(self) < 5:
            self.append(message)
        else:
            self[-1] = f"... and more (last: {message})"

    def close(self, what, got, want, rtol=1e-5, atol=1e-5):
        got = np.asarray(got)
        if got.shape != np.shape(want) or not np.allclose(got, want, rtol, atol):
            err = (float(np.max(np.abs(got - want)))
                   if got.shape == np.shape(want) else f"shape {got.shape}")
            self.add(f"{what}: wrong values (max err {err})")


def shard_values(array):
    """[(device, index, numpy value)] of every addressable shard."""
    return [(s.device, s.index, np.asarray(s.data))
            for s in array.addressable_shards]


def chain_reference(x):
    w1 = 2 * x + 1
    w2 = 2 * w1 + 1
    return w1, w2, w2 * w2 - 3


@pytest.fixture(scope="module", autouse=True)
def watchdog():
    """A hang (a deadlock in a handler) ends the run with every thread's
    stack printed, instead of blocking the GPU check until its timeout."""
    faulthandler.dump_traceback_later(WATCHDOG, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def devices():
    return jax.local_devices()


# ---------------------------------------------------------------------------
# jax.shard_map

@pytest.fixture(scope="module")
def shard_map_report(devices):
    """Runs plain -> capture -> kernel under shard_map over every local
    device, SHARD_MAP_REPEATS times; per op, its failures and the device
    tags it wrote."""
    mesh = Mesh(np.array(devices), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    fn = jax.jit(jax.shard_map(tagged_ops(N), mesh=mesh,
                               in_specs=(P("x"), P("x")), out_specs=P("x")))
    # The kernel copies this input: each shard holds its own device's tag.
    devtag = jax.device_put(
        np.array([TAG + hardware_id(d) for d in devices], np.int32), sharding)
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    report = {k: {"failures": Failures(), "seen": set()} for k in OPS}
    for it in range(SHARD_MAP_REPEATS):
        x = rng.standard_normal(len(devices) * N).astype(np.float32)
        outs, tags = fn(jax.device_put(x, sharding), devtag)
        for k, out, want, tag in zip(OPS, outs, chain_reference(x), tags):
            r = report[k]
            for (dev, idx, val), (tdev, _, tval) in zip(shard_values(out),
                                                        shard_values(tag)):
                r["failures"].close(f"seed {seed} iteration {it} shard on {dev}",
                                    val, want[idx])
                if dev != tdev:
                    r["failures"].add(f"tag shard on {tdev}, data on {dev}")
                got = int(tval[0]) - TAG
                if got != hardware_id(dev):
                    r["failures"].add(
                        f"iteration {it}: shard on {dev} (CUDA device "
                        f"{hardware_id(dev)}) ran on device {got}")
                r["seen"].add(got)
    return report


@pytest.mark.parametrize("op", OPS)
def test_shard_map_runs_each_shard_on_its_device(shard_map_report, devices, op):
    r = shard_map_report[op]
    assert not r["failures"], r["failures"]
    if not SIMULATOR:
        ids = [hardware_id(d) for d in devices]
        assert len(set(ids)) == len(devices), f"device ordinals {ids}"
        assert r["seen"] == set(ids), (
            f"devices seen {sorted(r['seen'])}, expected {sorted(ids)}, "
            "one per shard")


# ---------------------------------------------------------------------------
# jax.jit with sharded inputs, no shard_map

@pytest.mark.parametrize("variant", ["gathered", "partitioned",
                                     "partitioned_capture"])
def test_sharded_jit(devices, variant):
    """Without the declaration XLA gathers (the result is still right); with
    batch_partitionable=True there is no collective, each device's func sees
    its own rows and tags them with its own device."""
    ndev = len(devices)
    rows, cols = 256 * ndev, 8
    specs = (jax.ShapeDtypeStruct((rows, cols), F32),
             jax.ShapeDtypeStruct((rows,), I32))
    partitioned = variant != "gathered"
    op = numbax.numba_cuda_callable(
        rows_tagged, specs, batch_partitionable=partitioned,
        capture=variant == "partitioned_capture")
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    fn = jax.jit(op)
    m0 = jax.device_put(np.zeros((rows, cols), np.float32), sharding)
    s0 = jax.device_put(np.zeros(rows, np.float32), sharding)
    text = fn.lower(m0, s0).compile().as_text()
    found = sorted({k for k in COLLECTIVES if k in text})
    if partitioned:
        assert not found, f"collectives in the compiled program: {found}"
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    failures = Failures()
    for it in range(JIT_REPEATS):
        m = rng.standard_normal((rows, cols)).astype(np.float32)
        s = rng.standard_normal(rows).astype(np.float32)
        with calls_lock:
            calls.clear()
        out, dev = fn(jax.device_put(m, sharding), jax.device_put(s, sharding))
        want = m * s[:, None] + np.arange(cols, dtype=np.float32)
        failures.close(f"seed {seed} iteration {it}", np.asarray(out), want)
        if partitioned:
            for d, idx, val in shard_values(dev):
                if not np.all(val == TAG + hardware_id(d)):
                    failures.add(f"iteration {it}: rows {idx[0]} on {d} ran on "
                                 f"devices {sorted(set((val - TAG).tolist()))}")
            if str(out.sharding.spec) not in ("P('x',)", "P('x')"):
                failures.add(f"result sharded as {out.sharding.spec}")
        with calls_lock:
            shapes = sorted({shape for _, shape in calls})
        # A capture=True func runs only while a graph is recorded.
        if partitioned and variant != "partitioned_capture":
            if shapes != [(rows // ndev, cols)]:
                failures.add(f"func saw shapes {shapes}, expected its own "
                             f"{rows // ndev} rows")
    assert not failures, failures


@pytest.mark.parametrize("capture", [False, True])
def test_sequential_vmap_keeps_each_slice_on_its_shard(devices, capture):
    """jax.vmap of a vmap_method='sequential' callable over a batch sharded
    across the devices: no collective, the result sharded like the input,
    and every slice run (func once per slice) by the device that holds it
    (was: an XLA loop, gathered onto every device)."""
    ndev = len(devices)
    batch, rows, cols = 2 * ndev, 256, 8
    specs = (jax.ShapeDtypeStruct((rows, cols), F32),
             jax.ShapeDtypeStruct((rows,), I32))
    op = numbax.numba_cuda_callable(rows_tagged, specs,
                                    vmap_method="sequential", capture=capture)
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    fn = jax.jit(jax.vmap(op))
    m0 = jax.device_put(np.zeros((batch, rows, cols), np.float32), sharding)
    s0 = jax.device_put(np.zeros((batch, rows), np.float32), sharding)
    text = fn.lower(m0, s0).compile().as_text()
    found = sorted({k for k in COLLECTIVES if k in text})
    assert not found, f"collectives in the compiled program: {found}"
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    failures = Failures()
    for it in range(JIT_REPEATS):
        m = rng.standard_normal((batch, rows, cols)).astype(np.float32)
        s = rng.standard_normal((batch, rows)).astype(np.float32)
        with calls_lock:
            calls.clear()
        out, dev = fn(jax.device_put(m, sharding), jax.device_put(s, sharding))
        want = m * s[:, :, None] + np.arange(cols, dtype=np.float32)
        failures.close(f"seed {seed} iteration {it}", np.asarray(out), want)
        for d, idx, val in shard_values(dev):
            if not np.all(val == TAG + hardware_id(d)):
                failures.add(f"iteration {it}: slices {idx[0]} on {d} ran on "
                             f"devices {sorted(set((val - TAG).tolist()))}")
        if str(out.sharding.spec) not in ("P('x',)", "P('x')"):
            failures.add(f"result sharded as {out.sharding.spec}")
        with calls_lock:
            seen = list(calls)
        # A capture=True func runs only while a graph is recorded.
        if not capture and (len(seen) != batch or
                            {shape for _, shape in seen} != {(rows, cols)}):
            failures.add(f"iteration {it}: func calls {seen}, expected one "
                         f"per slice ({batch}) of shape {(rows, cols)}")
    assert not failures, failures


# ---------------------------------------------------------------------------
# Threads

def test_threads_on_several_devices(devices):
    """THREADS Python threads at once, each bound to one local device in
    turn, call one jitted program of plain, capture and kernel ops."""
    program = jax.jit(tagged_ops(N))
    errors, done = [], {}
    barrier = threading.Barrier(THREADS)

    def worker(t):
        device = devices[t % len(devices)]
        seed = int.from_bytes(os.urandom(4), "little")
        rng = np.random.default_rng(seed)
        devtag = jax.device_put(
            np.array([TAG + hardware_id(device)], np.int32), device)
        try:
            barrier.wait(60)
            for it in range(THREAD_ITERATIONS):
                x = rng.standard_normal(N).astype(np.float32)
                outs, tags = program(jax.device_put(x, device), devtag)
                for what, got, want in zip(OPS, outs, chain_reference(x)):
                    if not np.allclose(np.asarray(got), want, 1e-5, 1e-5):
                        errors.append(f"thread {t} seed {seed} it {it}: "
                                      f"{what} wrong")
                for what, d in zip(OPS, tags):
                    ran_on = int(np.asarray(d)[0]) - TAG
                    if ran_on != hardware_id(device):
                        errors.append(f"thread {t} it {it}: {what} ran on "
                                      f"device {ran_on}, not "
                                      f"{hardware_id(device)}")
                if outs[0].devices() != {device}:
                    errors.append(f"thread {t}: result on {outs[0].devices()}")
            done[t] = THREAD_ITERATIONS
        except Exception as exc:
            errors.append(f"thread {t}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]}")

    threads = [threading.Thread(target=worker, args=(t,), daemon=True)
               for t in range(THREADS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"deadlock? threads still running: {hung}"
    assert errors == [], errors[:5]
    assert done == {t: THREAD_ITERATIONS for t in range(THREADS)}, done


def test_funcs_on_two_devices_overlap(devices):
    """Two funcs that sleep on two devices run at the same time: numbax holds
    no lock across calls, and the GIL is free while a func sleeps."""
    if SIMULATOR:
        pytest.skip("the simulator runs one func at a time")
    spans = {}

    def sleepy(x, y, stream):
        t0 = time.monotonic()
        time.sleep(0.3)  # releases the GIL
        affine_kernel[blocks(x.shape[0]), 256, stream](x, y)
        spans.setdefault(current_device_id(), []).append((t0, time.monotonic()))
    op = jax.jit(numbax.numba_cuda_callable(
        sleepy, jax.ShapeDtypeStruct((1024,), F32)))
    pair = devices[:2]
    xs = [jax.device_put(np.ones(1024, np.float32), d) for d in pair]
    for x in xs:  # compile and warm up on each device
        op(x).block_until_ready()
    spans.clear()
    barrier = threading.Barrier(2)
    outs = [None, None]

    def go(i):
        barrier.wait(30)
        outs[i] = np.asarray(op(xs[i]))
    ts = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert all(o is not None and np.allclose(o, 3.0) for o in outs), outs
    assert sorted(spans) == sorted(hardware_id(d) for d in pair), spans
    allspans = sorted(s for v in spans.values() for s in v)
    assert len(allspans) == 2, f"expected 2 func calls, saw {allspans}"
    (a0, a1), (b0, b1) = allspans
    assert b0 < a1, (f"the funcs ran one after the other ({a1 - a0:.2f}s "
                     f"then {b1 - b0:.2f}s): serialised")
