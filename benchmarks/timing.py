"""The measurements (method in /work/shared/ANCHORS.md), and the output checks.

chain:     one jax.jit program applying op `length` times in sequence; per-call
           time = program time / length. Median over `repeats` repeats, each
           timing `runs` runs, every run ended by block_until_ready().
single:    jax.jit(op)(x).block_until_ready(), median over `runs` runs.
bandwidth: a chain of `length` ops over a large array; GB/s counts the bytes
           each op reads and writes, median over `runs` runs.
All after warm-up runs, which also compile.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclass
class Config:
    n: int = 4096             # elements in the latency tests
    chain_length: int = 100
    chain_repeats: int = 5
    chain_runs: int = 5
    single_runs: int = 50
    warmup: int = 3
    bw_n: int = 268435456     # 1 GiB of float32
    bw_length: int = 10
    bw_runs: int = 10

    @classmethod
    def quick(cls) -> "Config":
        return cls(chain_repeats=3, chain_runs=2, single_runs=10, warmup=2,
                   bw_n=1 << 24, bw_length=5, bw_runs=3)

    @classmethod
    def cpu_smoke(cls) -> "Config":
        # Numba's simulator runs a Python thread per CUDA thread: keep it tiny.
        return cls(n=256, chain_length=4, chain_repeats=2, chain_runs=1,
                   single_runs=3, warmup=1, bw_n=512, bw_length=2, bw_runs=2)


class CheckFailed(AssertionError):
    pass


def chain_fn(op: Callable, length: int) -> Callable:
    def chain(v):
        for _ in range(length):
            v = op(v)
        return v
    return jax.jit(chain)


def reference(x: np.ndarray, times: int = 1) -> np.ndarray:
    two, one = np.float32(2), np.float32(1)
    for _ in range(times):
        x = two * x + one
    return x


def _compare(got, want, what: str) -> None:
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise CheckFailed(f"{what}: got {got.dtype}{list(got.shape)}, "
                          f"want {want.dtype}{list(want.shape)}")
    bad = ~np.isclose(got, want, rtol=1e-5, atol=1e-6)
    if bad.any():
        i = int(np.argmax(bad))
        raise CheckFailed(f"{what}: {int(bad.sum())} of {want.size} elements "
                          f"wrong, first at [{i}]: got {got[i]!r}, want {want[i]!r}")


def check(op: Callable, chain: Callable, n: int, chain_length: int,
          rng: np.random.Generator, trials: int = 2) -> None:
    """op and the chain program against numpy, on fresh random inputs (several,
    so a replayed graph still pointing at old buffers is caught)."""
    single = jax.jit(op)
    for t in range(trials):
        x = rng.standard_normal(n).astype(np.float32)
        _compare(single(jnp.asarray(x)), reference(x), f"single, trial {t}")
        x = rng.standard_normal(n).astype(np.float32)
        _compare(chain(jnp.asarray(x)), reference(x, chain_length),
                 f"chain of {chain_length}, trial {t}")


def check_on_device(op: Callable, x: jax.Array) -> None:
    """op over a large array, checked by XLA on the device (no host copy)."""
    y = jax.jit(op)(x)
    want = 2 * x + 1
    ok = bool(jnp.allclose(y, want, rtol=1e-6, atol=1e-6))
    if not ok:
        wrong = int(jnp.sum(~jnp.isclose(y, want, rtol=1e-6, atol=1e-6)))
        first = int(jnp.argmax(~jnp.isclose(y, want, rtol=1e-6, atol=1e-6)))
        raise CheckFailed(f"bandwidth array: {wrong} of {x.size} elements wrong, "
                          f"first at [{first}]")


def time_chain(chain: Callable, x: jax.Array, cfg: Config) -> dict:
    for _ in range(cfg.warmup):
        chain(x).block_until_ready()
    samples = []
    for _ in range(cfg.chain_repeats):
        t0 = time.perf_counter()
        for _ in range(cfg.chain_runs):
            chain(x).block_until_ready()
        elapsed = time.perf_counter() - t0
        samples.append(elapsed / cfg.chain_runs / cfg.chain_length * 1e6)
    return {"us_per_call": statistics.median(samples), "samples_us": samples}


def time_single(op: Callable, x: jax.Array, cfg: Config) -> dict:
    f = jax.jit(op)
    for _ in range(cfg.warmup):
        f(x).block_until_ready()
    samples = []
    for _ in range(cfg.single_runs):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        samples.append((time.perf_counter() - t0) * 1e6)
    return {"us_per_call": statistics.median(samples), "samples_us": samples}


def time_bandwidth(op: Callable, x: jax.Array, cfg: Config) -> dict:
    chain = chain_fn(op, cfg.bw_length)
    for _ in range(cfg.warmup):
        chain(x).block_until_ready()
    bytes_per_op = 2 * x.size * x.dtype.itemsize  # read x, write y
    samples = []
    for _ in range(cfg.bw_runs):
        t0 = time.perf_counter()
        chain(x).block_until_ready()
        per_op = (time.perf_counter() - t0) / cfg.bw_length
        samples.append(bytes_per_op / per_op / 1e9)
    return {"gb_per_s": statistics.median(samples), "samples_gb_per_s": samples,
            "bytes_per_op": bytes_per_op}
