"""The CPU rows of the suite: ``numbax.numba_kernel`` against a hand-written
C++ XLA FFI CPU handler and the other ways to run an ``@njit`` kernel from JAX.

``python -m numbax bench`` runs these where JAX sees no GPU (and Numba's CUDA
simulator is off), or anywhere with ``--cpu``. The workload is the GPU
suite's, ``y = 2x + 1`` over 4096 float32:

- **chain**: one jitted program of 100 ops in sequence, time / 100;
- **single**: ``jax.jit(op)(x)``, one op per call;
- **vmap**: ``jax.vmap`` of the op over 64 x 4096, one jitted call;
- **large**: one op over 4M elements with ``parallel='xla'`` against the
  same kernel compiled with ``@njit(parallel=True)`` (``prange``) and the
  serial kernel: alone, four independent ops in one program ("at once") and
  the same four ops over the same buffers made to run one after another
  ("in a row"), each sample after 10 ms of quiet (the threads a parallel
  row leaves spinning would slow the next). It runs in a child process: Numba's
  ``workqueue`` threading layer aborts the process when several
  ``parallel=True`` kernels run at once, and an abort must cost a row, not
  the run.

Every row is checked against numpy on fresh random data before it is timed
(the empty rows, which write nothing, excepted). Timings are interleaved
rounds, as the GPU suite's: each round takes one sample of every row, the
first row rotating, and the table reports the median over rounds. A sample
is the fastest of ``chain_runs`` program runs (chain) or ``single_runs``
calls (single and vmap), back to back: the rows differ by tenths of a
microsecond per op, less than what one preemption of a small shared machine
adds to a run, and the fastest run is the one nothing interrupted (the GPU
suite, timing launches of microseconds on a quiet host, takes the mean).
The report ends with the targets of issue 44 and whether this run meets
each.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# The report (targets, tables, the record's environment) is cpu_report.py;
# its names are re-exported here, the suite's one CPU module for callers.
from .cpu_report import NOTE_TINY  # noqa: F401 - re-exported
from .timing import reference  # the GPU suite's numpy answer, the same op
from .cpu_report import (LABELS, environment, format_table, load_average,
                         targets)
from .cpu_report import cpu_name as _cpu_name
from .cpu_report import fmt_load as _fmt_load

#: The rows of the chain / single / vmap table, in table order.
NAMES = ["native", "native_empty", "numba_kernel", "numba_kernel_empty",
         "numba_kernel_xla", "buffer_callback", "pure_callback", "jnp", "brainevent"]
#: Rows that always run: the targets are ratios to them.
BASELINES = ["native", "native_empty"]
#: The large-op rows: (name, label).
LARGE = [("serial", "numba_kernel, serial @njit"),
         ("xla", "numba_kernel, parallel='xla'"),
         ("prange", "numba_kernel, @njit(parallel=True)")]



class Unavailable(Exception):
    """A row that cannot run here (not a failure): ``str(exc)`` says why."""


@dataclass
class CpuConfig:
    n: int = 4096
    chain_length: int = 100
    batch: int = 64
    rounds: int = 10
    warmup_rounds: int = 1
    chain_runs: int = 5
    single_runs: int = 7
    large_n: int = 1 << 22
    large_runs: int = 5
    # Seconds of quiet before each sample of a large program: a parallel
    # row leaves threads spinning for a while (OpenMP's do, for up to
    # milliseconds), which would slow whichever program runs next.
    large_gap_s: float = 0.01
    tiny: bool = False

    @classmethod
    def quick(cls) -> CpuConfig:
        return cls(rounds=4, chain_runs=3, single_runs=5, large_runs=3)

    @classmethod
    def tiny_sizes(cls) -> CpuConfig:
        return cls(n=64, chain_length=4, batch=3, rounds=1, warmup_rounds=0,
                   chain_runs=1, single_runs=1, large_n=1024, large_runs=1,
                   large_gap_s=0.0,
                   tiny=True)


# ---------------------------------------------------------------------------
# The kernels. Module level, so Numba compiles each once per process.

_kernels: dict[str, Any] = {}


def kernels() -> dict[str, Any]:
    """The @njit kernels of the rows (imported and compiled lazily)."""
    if _kernels:
        return _kernels
    import numba

    @numba.njit
    def affine(x, y):
        for i in range(x.size):
            y[i] = np.float32(2) * x[i] + np.float32(1)

    @numba.njit
    def empty(x, y):
        pass

    # With launch_dims, numba_kernel hands the kernel a part [begin, end) of
    # range(launch_dims) first (uint64: signed indices over a sub-range stop
    # LLVM vectorising the loop); parallel='xla' spreads the parts over
    # XLA's intra-op pool.
    @numba.njit
    def affine_range(begin, end, x, y):
        for i in range(begin, end):
            y[i] = np.float32(2) * x[i] + np.float32(1)

    @numba.njit(parallel=True)
    def affine_prange(x, y):
        for i in numba.prange(x.size):
            y[i] = np.float32(2) * x[i] + np.float32(1)

    _kernels.update(affine=affine, empty=empty, affine_range=affine_range,
                    affine_prange=affine_prange)
    return _kernels


# ---------------------------------------------------------------------------
# The rows. Each maker returns op(x) for arrays of any shape the row takes:
# (n,) for chain and single; the vmap rows get (batch, n) through jax.vmap.

@dataclass
class Env:
    native: Any = None          # NativeCpuTargets, or None
    native_error: str | None = None


def _spec(x):
    import jax
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _numba_kernel_fn():
    import numbax
    fn = getattr(numbax, "numba_kernel", None)
    if fn is None:
        raise Unavailable("numbax.numba_kernel is not in this numbax")
    return fn


def make_op(name: str, env: Env, *, vmapped: bool = False) -> Callable:
    """op(x) of row `name`. ``vmapped``: the op jax.vmap will batch (rows
    choose how they batch: see docs/benchmarks.md)."""
    import jax
    import jax.numpy as jnp

    if name in ("native", "native_empty"):
        if env.native is None:
            raise Unavailable(f"no C++ handler: {env.native_error}")
        target = env.native.affine if name == "native" else env.native.empty
        # Under vmap: the batch as one call over the (batch, n) array, the
        # baseline "one C++ handler call over the whole batch" (the handler
        # loops over every element whatever the rank).
        method = "broadcast_all" if vmapped else None
        return lambda x: jax.ffi.ffi_call(target, _spec(x),
                                          vmap_method=method)(x)
    if name in ("numba_kernel", "numba_kernel_empty"):
        numba_kernel = _numba_kernel_fn()
        kernel = kernels()["affine" if name == "numba_kernel" else "empty"]
        return lambda x: numba_kernel(kernel, _spec(x))(x)
    if name == "numba_kernel_xla":
        # The same kernel with parallel='xla' and no launch_dims: one call
        # runs inline (its range is one index), a vmapped call spreads its
        # slices over XLA's intra-op pool.
        numba_kernel = _numba_kernel_fn()
        return lambda x: numba_kernel(kernels()["affine"], _spec(x),
                                      parallel="xla")(x)
    if name == "buffer_callback":
        try:
            from jax.experimental.buffer_callback import buffer_callback
        except ImportError as exc:
            raise Unavailable(f"no jax.experimental.buffer_callback: {exc}") \
                from exc
        affine = kernels()["affine"]

        def callback(ctx, out, x):
            affine(np.asarray(x).reshape(-1), np.asarray(out).reshape(-1))
        method = "broadcast_all" if vmapped else None
        return lambda x: buffer_callback(callback, _spec(x),
                                         vmap_method=method)(x)
    if name == "pure_callback":
        two, one = np.float32(2), np.float32(1)

        def host(x):
            return two * np.asarray(x, np.float32) + one
        method = "broadcast_all" if vmapped else None
        return lambda x: jax.pure_callback(host, _spec(x), x,
                                           vmap_method=method)
    if name == "jnp":
        return lambda x: 2 * x + jnp.float32(1)
    if name == "brainevent":
        try:
            import brainevent
        except ImportError as exc:
            raise Unavailable("brainevent is not installed") from exc
        affine = kernels()["affine"]
        # The reference refuses vmap without a vmap_method; 'sequential' is
        # the one that runs its kernel unchanged (an XLA loop over slices).
        method = "sequential" if vmapped else None
        return lambda x: brainevent.numba_kernel(
            affine, _spec(x), vmap_method=method)(x)
    raise ValueError(f"unknown CPU row {name!r}; known: {NAMES}")


# ---------------------------------------------------------------------------
# Timing.

def _block(out):
    import jax
    jax.block_until_ready(out)
    return out


def _time_once(fn, *args) -> float:
    t0 = time.perf_counter()
    _block(fn(*args))
    return (time.perf_counter() - t0) * 1e6


def _check(got, want, what: str) -> None:
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what}: got {got.dtype}{list(got.shape)}, "
                             f"want {want.dtype}{list(want.shape)}")
    bad = ~np.isclose(got, want, rtol=1e-5, atol=1e-6)
    if bad.any():
        i = int(np.argmax(bad.reshape(-1)))
        raise AssertionError(f"{what}: {int(bad.sum())} of {want.size} "
                             f"elements wrong, first at flat [{i}]: got "
                             f"{got.reshape(-1)[i]!r}, want "
                             f"{want.reshape(-1)[i]!r}")


@dataclass
class Prepared:
    name: str
    row: dict
    # what one sample of each measurement runs: (program, args, calls, per)
    programs: dict[str, tuple[Callable, tuple, int, int]] = field(
        default_factory=dict)


def prepare(name: str, env: Env, cfg: CpuConfig, rng, vmap: bool,
            log) -> tuple[dict, Prepared | None]:
    """Builds and checks one row; returns its row and what to time (None
    when it cannot run: its row says why)."""
    import jax
    import jax.numpy as jnp

    row: dict[str, Any] = {"name": name, "label": LABELS[name], "status": "ok"}
    p = Prepared(name, row)
    phase = "build"
    try:
        op = make_op(name, env)
        single = jax.jit(op)

        def chain_body(v):
            for _ in range(cfg.chain_length):
                v = op(v)
            return v
        chain = jax.jit(chain_body)
        vm = None
        if vmap:
            vm = jax.jit(jax.vmap(make_op(name, env, vmapped=True)))
        phase = "check"
        checked = not name.endswith("empty")
        for t in range(2):
            x = rng.uniform(-1, 1, cfg.n).astype(np.float32)
            s, c = single(jnp.asarray(x)), chain(jnp.asarray(x))
            if checked:
                _check(s, reference(x), f"single, trial {t}")
                _check(c, reference(x, cfg.chain_length),
                       f"chain of {cfg.chain_length}, trial {t}")
            if vm is not None:
                xb = rng.uniform(-1, 1, (cfg.batch, cfg.n)).astype(np.float32)
                v = vm(jnp.asarray(xb))
                if checked:
                    _check(v, reference(xb), f"vmap {cfg.batch}x{cfg.n}, "
                           f"trial {t}")
        row["checked"] = checked
        x = jax.device_put(rng.uniform(-1, 1, cfg.n).astype(np.float32))
        p.programs["chain"] = (chain, (x,), cfg.chain_runs, cfg.chain_length)
        p.programs["single"] = (single, (x,), cfg.single_runs, 1)
        if vm is not None:
            xb = jax.device_put(
                rng.uniform(-1, 1, (cfg.batch, cfg.n)).astype(np.float32))
            p.programs["vmap"] = (vm, (xb,), cfg.single_runs, 1)
        for fn, args, _, _ in p.programs.values():   # compile and warm up
            for _ in range(2):
                _block(fn(*args))
    except Unavailable as exc:
        row["status"] = f"skipped ({exc})"
        log(f"[{name}] skipped: {exc}")
        return row, None
    except Exception as exc:  # noqa: BLE001 - a row fails, the run goes on
        row["status"] = f"FAILED ({phase}): {type(exc).__name__}: {exc}"
        log(f"[{name}] FAILED ({phase}):\n{traceback.format_exc().rstrip()}")
        return row, None
    return row, p


def measure(prepared: list[Prepared], cfg: CpuConfig, log) -> None:
    """Interleaved rounds over every prepared row; fills each row's
    ``chain``/``single``/``vmap`` with the median over rounds, in us per op
    (chain: per op of the program)."""
    samples: dict[tuple[str, str], list[float]] = {}
    for r in range(cfg.warmup_rounds + cfg.rounds):
        k = r % max(len(prepared), 1)
        for p in prepared[k:] + prepared[:k]:
            for key, (fn, args, runs, per) in p.programs.items():
                try:
                    t = min(_time_once(fn, *args) for _ in range(runs))
                except Exception as exc:  # noqa: BLE001
                    p.row["status"] = (f"FAILED (timing): {type(exc).__name__}: "
                                       f"{exc}")
                    log(f"[{p.name}] FAILED (timing):\n"
                        f"{traceback.format_exc().rstrip()}")
                    p.programs = {}
                    break
                if r >= cfg.warmup_rounds:
                    samples.setdefault((p.name, key), []).append(t / per)
    for p in prepared:
        for key in ("chain", "single", "vmap"):
            got = samples.get((p.name, key))
            if got and p.row["status"] == "ok":
                p.row[key] = {"us": statistics.median(got), "samples": got}


# ---------------------------------------------------------------------------
# The large op, in a child process.

def large_rows(cfg: CpuConfig, seed: int) -> list[dict]:
    """Runs :func:`_large_child` in a fresh process; an abort or a crash
    there is a FAILED row with the child's last lines."""
    cmd = [sys.executable, "-m", "numbax.bench.cpu", "--large",
           json.dumps({"cfg": asdict(cfg), "seed": seed})]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=1800)
    except subprocess.TimeoutExpired:
        return [{"name": "large", "status": "FAILED: timed out after 1800 s"}]
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)["rows"]
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
    return [{"name": "large", "status": f"FAILED: the child exited "
             f"{proc.returncode}: {tail}"}]


def _large_child(cfg: CpuConfig, seed: int) -> list[dict]:
    import jax
    rng = np.random.default_rng(seed)
    n = cfg.large_n
    rows = []
    ks = kernels()
    try:
        numba_kernel = _numba_kernel_fn()
    except Unavailable as exc:
        return [{"name": name, "label": label, "status": f"skipped ({exc})"}
                for name, label in LARGE]
    spec = jax.ShapeDtypeStruct((n,), np.float32)
    ops = {
        "serial": lambda: numba_kernel(ks["affine"], spec),
        "xla": lambda: numba_kernel(ks["affine_range"], spec, parallel="xla",
                                    launch_dims=n),
        "prange": lambda: numba_kernel(ks["affine_prange"], spec),
    }
    xs = [jax.device_put(rng.uniform(-1, 1, n).astype(np.float32))
          for _ in range(4)]
    programs: dict[str, dict[str, Callable]] = {}
    for name, label in LARGE:
        row: dict[str, Any] = {"name": name, "label": label, "status": "ok"}
        rows.append(row)
        try:
            op = ops[name]()
            alone = jax.jit(op)
            at_once = jax.jit(lambda a, b, c, d, op=op: (op(a), op(b), op(c),
                                                         op(d)))

            def in_a_row(*inputs, op=op):
                # The same four ops on the same buffers as at_once, each
                # made to wait for the one before (the barrier ties its
                # input to the previous result): only the order differs,
                # not the memory the program touches.
                outs, previous = [], None
                for a in inputs:
                    if previous is not None:
                        a, _ = jax.lax.optimization_barrier((a, previous))
                    previous = op(a)
                    outs.append(previous)
                return tuple(outs)
            row_fn = jax.jit(in_a_row)
            x = np.asarray(xs[0])
            _check(alone(xs[0]), reference(x), "alone")
            for what, f in (("four at once", at_once),
                            ("four in a row", row_fn)):
                outs = f(*xs)
                for i in range(4):
                    _check(outs[i], reference(np.asarray(xs[i])),
                           f"{what}, op {i}")
            programs[name] = {"alone": lambda f=alone: f(xs[0]),
                              "at_once": lambda f=at_once: f(*xs),
                              "in_a_row": lambda f=row_fn: f(*xs)}
            for f in programs[name].values():
                _block(f())
        except Exception as exc:  # noqa: BLE001 - a row fails, the run goes on
            row["status"] = f"FAILED: {type(exc).__name__}: {exc}"
            print(traceback.format_exc(), file=sys.stderr)
    samples: dict[tuple[str, str], list[float]] = {}
    names = list(programs)
    for r in range(cfg.warmup_rounds + cfg.rounds):
        k = r % max(len(names), 1)
        for name in names[k:] + names[:k]:
            for key, f in programs[name].items():
                time.sleep(cfg.large_gap_s)
                t = statistics.median(_time_once(f)
                                      for _ in range(cfg.large_runs))
                if r >= cfg.warmup_rounds:
                    samples.setdefault((name, key), []).append(t)
    for row in rows:
        for key in ("alone", "at_once", "in_a_row"):
            got = samples.get((row["name"], key))
            if got:
                row[key] = {"us": statistics.median(got), "samples": got}
    return rows


def run(*, quick: bool, tiny: bool, rounds: int | None, only: list[str] | None,
        seed: int, json_path: str | None, build_dir: str | None,
        workloads: bool, header: str | None, argv: list[str],
        log: Callable[[str], None] = print) -> int:
    """The CPU run; returns the exit status (0, or 1 when a row failed or
    the JSON could not be written)."""
    import jax

    from .native import build_cpu_and_register
    if header:
        print(header, flush=True)
    cfg = (CpuConfig.tiny_sizes() if tiny else CpuConfig.quick() if quick
           else CpuConfig())
    if rounds is not None:
        cfg.rounds = rounds
    rng = np.random.default_rng(seed)
    env = Env()
    load_start = load_average()
    log(f"device: {jax.devices()[0]} ({_cpu_name()}, {os.cpu_count()} cores); "
        f"config: {cfg}")
    try:
        t0 = time.perf_counter()
        env.native = build_cpu_and_register(build_dir)
        how = "found in the cache" if env.native.cached else \
            f"built in {time.perf_counter() - t0:.1f} s"
        log(f"C++ handler: {env.native.library} {how}")
    except FileNotFoundError as exc:
        env.native_error = str(exc)
        log(f"C++ handler: skipped ({exc})")
    except Exception as exc:  # noqa: BLE001
        env.native_error = f"{type(exc).__name__}: {exc}"
        log(f"C++ handler: build FAILED:\n{traceback.format_exc().rstrip()}")

    names = [n for n in NAMES if only is None or n in only or n in BASELINES]
    rows, prepared = [], []
    for name in names:
        row, p = prepare(name, env, cfg, rng, workloads, log)
        rows.append(row)
        if p is not None:
            prepared.append(p)
    measure(prepared, cfg, log)
    large = large_rows(cfg, seed) if workloads and (
        only is None or "numba_kernel" in only) else []
    record: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": argv,
        "mode": {"cpu": True, "tiny": tiny, "header": header},
        "tiny": tiny,
        "seed": seed,
        "method": (f"interleaved: median over {cfg.rounds} rounds after "
                   f"{cfg.warmup_rounds} unrecorded; chain sample: fastest "
                   f"of {cfg.chain_runs} runs; single and vmap: fastest of "
                   f"{cfg.single_runs} calls; large: median of "
                   f"{cfg.large_runs} calls after {cfg.large_gap_s * 1e3:g} ms "
                   "of quiet, in a child process"),
        "config": asdict(cfg),
        "environment": dict(environment(env.native),
                            load_average_start=load_start),
        "native_build_error": env.native_error,
        "results": rows,
        "large": large,
    }
    record["targets"] = [] if tiny else targets(rows, large)
    failed = any(r["status"].startswith("FAILED") for r in rows + large)
    if json_path:
        try:
            from .report import write_json
            write_json(json_path, record)
            print(f"wrote {json_path}", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"could not write {json_path}: {type(exc).__name__}: {exc}")
            failed = True
    v = record["environment"]["versions"]
    print()
    print("== cpu table")
    print(f"{record['environment']['cpu']}, {os.cpu_count()} cores | jax "
          f"{v['jax']} jaxlib {v['jaxlib']} | numba {v['numba']} | "
          f"brainevent {v['brainevent'] or 'not installed'} | load average "
          f"{_fmt_load(load_start)} at the start, "
          f"{_fmt_load(record['environment']['load_average_end'])} at the end")
    print(format_table(record), flush=True)
    return 1 if failed else 0


def _child_main(arg: str) -> int:
    spec = json.loads(arg)
    cfg = CpuConfig(**spec["cfg"])
    rows = _large_child(cfg, spec["seed"])
    print(json.dumps({"rows": rows}), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--large":
        sys.exit(_child_main(sys.argv[2]))
    # Only the suite's child runs this module as a script: importing run.py
    # here would close a circle (run.py imports this module).
    print("python -m numbax.bench.cpu runs a child of the CPU rows "
          "(--large SPEC); time the rows with: python -m numbax bench --cpu",
          file=sys.stderr)
    sys.exit(2)
