"""vmap of a kernel that reads blockIdx.y and .z (no free grid axis to fold
the batch on) launches it slice by slice from C++, and replays a CUDA graph
of those launches for 16 or more slices, keyed by buffer addresses: with
fresh inputs every call (addresses that move or repeat), with ops made anew
150 times (host memory bounded), from 4 threads at once, and while another
thread clears the graph caches, every result is numpy's. GPU only: the
simulator records no graphs.
"""

import gc
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import assert_close, in_own_process, kernel_op

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_only", "x64")]

N = 4096


@cuda.jit
def reads_grid_y(x, out):
    # Reads blockIdx.y and .z (0 in a 1-D launch): no free axis to fold on.
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 2 + cuda.blockIdx.y + cuda.blockIdx.z


def per_slice_program():
    return jax.jit(jax.vmap(kernel_op(reads_grid_y, (N,), jnp.float32)))


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_graphs_replayed_with_moving_buffers(rng):
    numbax.reset_bridge_counters()
    f = per_slice_program()
    for k in range(40):
        xs = rng.standard_normal((32, N)).astype(np.float32)
        assert_close(f(xs), xs * 2, f"call {k}")
    counters = numbax.bridge_counters()
    assert counters["slice_graph_replays"] > 0, counters


def test_ops_made_anew_150_times_keep_host_memory_bounded(rng):
    x = rng.standard_normal(N).astype(np.float32)
    rss = []
    for k in range(150):
        b = 16 + k % 37
        xs = np.broadcast_to(x, (b, N)) + np.arange(b, dtype=np.float32)[:, None]
        assert_close(per_slice_program()(xs), xs * 2, f"round {k}")
        if k % 50 == 49:
            jax.clear_caches()
            numbax.clear_caches()
            gc.collect()
            rss.append(rss_mib())
    grew = rss[-1] - rss[0]
    assert grew < 64, f"RSS grew {grew:.1f} MiB over the last 100 rounds: {rss}"


def test_one_program_from_four_threads():
    f = per_slice_program()
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for k in range(25):
                xs = rng.standard_normal((24, N)).astype(np.float32)
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
@in_own_process()
def test_replays_while_another_thread_clears_the_caches(rng):
    f = per_slice_program()
    xs = [rng.standard_normal((32, N)).astype(np.float32) for _ in range(2)]
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
