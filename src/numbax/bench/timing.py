"""The measurements (method in docs/benchmarks.md), and the output checks.

chain:     one jax.jit program applying op `length` times in sequence; per-call
           time = program time / length.
single:    jax.jit(op)(x).block_until_ready().
bandwidth: a chain of `length` ops over a large array; GB/s counts the bytes
           each op reads and writes.

The moving-buffers measurements (XLA hands the ops new buffer addresses, as a
program fed a fresh batch each step sees):

moving:        a chain of `moving_length` ops called on the next of
               `moving_inputs` device arrays made beforehand (call k takes
               input k % moving_inputs); per-op time as chain.
donated:       the same chain as ``y = f(y)`` with y donated, the state
               carried from call to call (:class:`Carried`).
single_moving: jax.jit(op) over the rotating inputs; per-call time as single.

Every measurement is taken in *rounds*, interleaved across implementations:
round r takes one sample of every implementation (chain: the mean of
``chain_runs`` program runs; single: the median of ``single_runs`` calls;
bandwidth: one program run) before round r + 1 starts, and the reported value
is the median over rounds. Timings on a shared GPU host drift by tens of
percent over a run; interleaving spreads that drift over every implementation
alike instead of charging it to whichever one ran last. The starting
implementation rotates from round to round so none is always measured first.
All after warm-up runs, which also compile, and after ``warmup_rounds``
interleaved rounds that are not recorded (the first executions of a program
after other programs ran can still pay for instantiating CUDA graphs).
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclass
class Config:
    n: int = 4096             # elements in the latency tests
    chain_length: int = 100
    rounds: int = 10          # interleaved rounds of chain and single samples
    warmup_rounds: int = 1    # interleaved rounds run first and not recorded
    chain_runs: int = 3       # chain program runs per round (one sample: mean)
    single_runs: int = 5      # single-op calls per round (one sample: median)
    warmup: int = 3
    bw_n: int = 268435456     # 1 GiB of float32
    bw_length: int = 10
    bw_rounds: int = 10       # interleaved rounds of one bandwidth run each
    moving_length: int = 20   # ops in the moving and donated programs
    moving_inputs: int = 64   # device arrays the moving calls rotate over
    moving_runs: int = 16     # calls per round of each moving measurement

    @classmethod
    def quick(cls) -> Config:
        return cls(rounds=4, chain_runs=2, single_runs=3, warmup=2,
                   bw_n=1 << 24, bw_length=5, bw_rounds=3, moving_runs=8)

    @classmethod
    def cpu_smoke(cls) -> Config:
        # Numba's simulator runs a Python thread per CUDA thread: keep it tiny.
        return cls(n=256, chain_length=4, rounds=2, chain_runs=1,
                   single_runs=2, warmup=1, bw_n=512, bw_length=2, bw_rounds=2,
                   moving_length=2, moving_inputs=3, moving_runs=1)


class CheckFailed(AssertionError):
    pass


def chain_fn(op: Callable, length: int, donate: bool = False) -> Callable:
    """jax.jit of `length` ops in sequence; ``donate``: its input donated."""
    def chain(v: jax.Array) -> jax.Array:
        for _ in range(length):
            v = op(v)
        return v
    return jax.jit(chain, donate_argnums=0 if donate else ())


def reference(x: np.ndarray, times: int = 1) -> np.ndarray:
    two, one = np.float32(2), np.float32(1)
    for _ in range(times):
        x = two * x + one
    return x


def _compare(got: Any, want: np.ndarray, what: str) -> None:
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise CheckFailed(f"{what}: got {got.dtype}{list(got.shape)}, "
                          f"want {want.dtype}{list(want.shape)}")
    bad = ~np.isclose(got, want, rtol=1e-5, atol=1e-6)
    if bad.any():
        i = int(np.argmax(bad))
        raise CheckFailed(f"{what}: {int(bad.sum())} of {want.size} elements "
                          f"wrong, first at [{i}]: got {got[i]!r}, want {want[i]!r}")


def check(single: Callable, chain: Callable, n: int, chain_length: int,
          rng: np.random.Generator, trials: int = 2) -> None:
    """The jitted op and the chain program against numpy, on fresh random
    inputs (several, so a replayed graph still pointing at old buffers is
    caught)."""
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


def warm_up(fn: Callable, x: jax.Array, runs: int) -> None:
    for _ in range(runs):
        fn(x).block_until_ready()


# ---------------------------------------------------------------------------
# One sample of each measurement (what a round takes per implementation).

def call_times(call: Callable[[], jax.Array], runs: int,
               setup: Callable[[], None] | None = None) -> list[float]:
    """Microseconds of each of `runs` calls ``call().block_until_ready()``;
    ``setup()``, when given, runs before each call, untimed."""
    times = []
    for _ in range(runs):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        call().block_until_ready()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def chain_sample(chain: Callable, x: jax.Array, runs: int, length: int) -> float:
    """Microseconds per op: the mean over `runs` runs of a `length`-op program."""
    return statistics.fmean(call_times(lambda: chain(x), runs)) / length


def single_sample(single: Callable, x: jax.Array, runs: int) -> float:
    """Microseconds per call: the median of `runs` single-op calls."""
    return statistics.median(call_times(lambda: single(x), runs))


def bandwidth_sample(chain: Callable, x: jax.Array, length: int) -> float:
    """GB/s of one run of a `length`-op program: bytes read + written per op
    / time per op."""
    bytes_per_op = 2 * x.size * x.dtype.itemsize  # read x, write y
    t0 = time.perf_counter()
    chain(x).block_until_ready()
    per_op = (time.perf_counter() - t0) / length
    return bytes_per_op / per_op / 1e9


# ---------------------------------------------------------------------------
# The moving-buffers measurements: each has ``warm(runs)``, ``sample(runs)``
# (one round's sample, microseconds per op) and ``check(what)`` (against
# numpy; run before and after the rounds).

#: The most ops a check's input goes through: 2*x + 1 doubles the values at
#: every op, and float32 holds inputs in [-1, 1] through about 125 ops (the
#: chain's own check runs 100).
MAX_CHECKED_OPS = 100


class Inputs:
    """The `count` inputs of the moving measurements: device arrays made
    beforehand and kept alive, and their host copies for the checks."""

    def __init__(self, rng: np.random.Generator, count: int, n: int):
        self.host = [rng.uniform(-1, 1, n).astype(np.float32)
                     for _ in range(count)]
        self.device = jax.block_until_ready([jax.device_put(h) for h in self.host])

    def check(self, fn: Callable, length: int, what: str) -> None:
        """fn on the first, middle and last input (three buffers) against
        ``reference(x_k, length)``."""
        last = len(self.device) - 1
        for k in sorted({0, last // 2, last}):
            _compare(fn(self.device[k]), reference(self.host[k], length),
                     f"{what}, input {k}")


class Rotating:
    """fn called on the inputs in rotation: call k takes input k % count.

    A sample is ``stat`` (mean for programs, as chain; median for single
    ops, as single) of `runs` calls, per op of a `length`-op fn.
    """

    def __init__(self, fn: Callable, inputs: Inputs, length: int,
                 stat: Callable[[list[float]], float]):
        self.fn, self.inputs, self.length, self.stat = fn, inputs, length, stat
        self._next = functools.partial(next, itertools.cycle(inputs.device))

    def sample(self, runs: int) -> float:
        return self.stat(call_times(lambda: self.fn(self._next()), runs)) / self.length

    def warm(self, runs: int) -> None:
        """At least one call on every input."""
        self.sample(max(runs, len(self.inputs.device)))

    def check(self, what: str) -> None:
        self.inputs.check(self.fn, self.length, what)


class Carried:
    """``y = step(y)`` with y donated at every call, the state carried from
    call to call (so XLA hands the program the buffer it wrote last).

    Before a call would take the state past :data:`MAX_CHECKED_OPS` ops since
    its start values, it gets them back, untimed, in place: a jitted copy
    with the state donated keeps its buffer. ``ops`` counts the ops applied
    since, for the check. A sample is the mean of `runs` calls, per op.
    """

    def __init__(self, step: Callable, start: np.ndarray, length: int):
        self.step, self.length, self.start_host = step, length, start
        self.start = jax.device_put(start)
        self._restore = jax.jit(lambda _y, s: jnp.copy(s), donate_argnums=0,
                                keep_unused=True)
        self.y = jnp.copy(self.start)
        self.ops = 0

    def _make_room(self) -> None:
        if self.ops and self.ops + self.length > max(MAX_CHECKED_OPS, self.length):
            self.y = self._restore(self.y, self.start).block_until_ready()
            self.ops = 0

    def _call(self) -> jax.Array:
        self.y = self.step(self.y)
        self.ops += self.length
        return self.y

    def sample(self, runs: int) -> float:
        return statistics.fmean(call_times(self._call, runs, self._make_room)) / self.length

    def warm(self, runs: int) -> None:
        self.sample(runs)

    def check(self, what: str) -> None:
        _compare(self.y, reference(self.start_host, self.ops),
                 f"{what}, state after {self.ops} ops")


def moving_measures(op: Callable, single: Callable, inputs: Inputs, length: int,
                    start: np.ndarray) -> dict[str, Rotating | Carried]:
    """The moving-buffers measurements of one implementation, by name:
    chains of `length` ops over the rotating inputs, the same chain donated
    from `start`, and the jitted op alone (`single`) over the inputs."""
    return {
        "moving": Rotating(chain_fn(op, length), inputs, length, statistics.fmean),
        "donated": Carried(chain_fn(op, length, donate=True), start, length),
        "single_moving": Rotating(single, inputs, 1, statistics.median),
    }


#: The bridge counters recorded around a moving measurement.
MOVING_COUNTERS = ("calls", "graph_misses", "graph_hits", "graph_rebinds",
                   "graph_rebind_refusals")


def counter_deltas(run: Callable[[], object]) -> dict[str, int]:
    """What ``numbax.bridge_counters()`` counted during ``run()``, for
    :data:`MOVING_COUNTERS` (0 for a counter this build does not have)."""
    import numbax
    before = numbax.bridge_counters()
    run()
    after = numbax.bridge_counters()
    return {k: after.get(k, 0) - before.get(k, 0) for k in MOVING_COUNTERS}


# ---------------------------------------------------------------------------
# The interleaving scheduler.

@dataclass
class Task:
    """One measurement of one implementation: `measure()` takes one sample."""
    key: Hashable
    measure: Callable[[], float]


def interleave(tasks: Sequence[Task], rounds: int, *, warmup_rounds: int = 0,
               on_step: Callable[[int], None] | None = None,
               on_error: Callable[[Task, BaseException], None] | None = None,
               ) -> dict[Hashable, list[float]]:
    """Samples of every task, taken in interleaved rounds.

    ``warmup_rounds + rounds`` rounds run; round r measures every task still
    active once, starting at position ``r mod len(active)`` of the task list
    (so no task is always first). The samples of the first
    ``warmup_rounds`` rounds are dropped. A task whose ``measure`` raises is
    reported to ``on_error`` and dropped from later rounds; its samples so
    far are kept. ``on_step(k)`` is called after each step with the number of
    scheduled measurements it accounts for (a dropped task accounts for its
    remaining rounds at once), so a progress bar of
    ``(warmup_rounds + rounds) * len(tasks)`` steps always ends full.

    Returns ``{task.key: [sample of recorded round 0, round 1, ...]}``.
    """
    total = warmup_rounds + rounds
    samples: dict[Hashable, list[float]] = {t.key: [] for t in tasks}
    active = list(tasks)
    for r in range(total):
        if not active:
            break
        start = r % len(active)
        for task in active[start:] + active[:start]:
            try:
                value = task.measure()
            except Exception as exc:  # noqa: BLE001 - reported, run goes on
                active.remove(task)
                if on_error is not None:
                    on_error(task, exc)
                if on_step is not None:
                    on_step(total - r)
                continue
            if r >= warmup_rounds:
                samples[task.key].append(value)
            if on_step is not None:
                on_step(1)
    return samples


def summarize(samples: Sequence[float], unit: str) -> dict:
    """The JSON record of one measurement: the median over rounds, and the
    per-round samples."""
    if unit == "GB/s":
        return {"gb_per_s": statistics.median(samples),
                "samples_gb_per_s": list(samples), "rounds": len(samples)}
    return {"us_per_call": statistics.median(samples),
            "samples_us": list(samples), "rounds": len(samples)}
