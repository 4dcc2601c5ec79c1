"""Cold start: how long a fresh process takes to its first result, by phase.

python -m numbax.bench.cold_start [--runs N] [--profile] [--json PATH]

A spiking network (``lax.scan`` over steps, the synaptic input computed by
one op per step) runs in fresh Python processes, three ways: pure JAX
(``segment_sum``), a ``numba_cuda_kernel`` op, and a plain
``numba_cuda_callable``. Each way gets its own cache directories: JAX's
persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``) and Numba's
on-disk cache (``NUMBA_CACHE_DIR``; the kernels have ``cache=True``,
cold_kernels.py). The first process of each way starts with both empty;
the next ``--runs`` start with both warm (the median is reported). Each
process times its own phases:

- import: jax (and numbax with the kernels' module for numbax's ways);
- backend: ``jax.devices()``, the GPU client starting;
- build: the op and the inputs on the device;
- trace + lower: ``jax.jit(run).lower(*args)``: where numbax compiles (or
  loads from Numba's cache) the kernel of a ``numba_cuda_kernel`` op;
- compile: ``lowered.compile()``: XLA, or its persistent cache;
- first run: the first call to its result (a callable's kernels compile, or
  load, here: Numba compiles func's launches lazily).

``--profile`` also profiles, in the last warm process of each numbax way,
the phase where numbax's Numba work happens (a kernel op's trace + lower, a
callable's first run): cProfile's Numba and numbax functions with the most
cumulative time, then the functions with the most time of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = ("jax", "kernel", "callable")
LABELS = {"jax": "pure JAX (segment_sum)", "kernel": "numbax kernel",
          "callable": "numbax callable"}
PHASES = ("import", "backend", "build", "trace_lower", "compile", "first_run")
PHASE_LABELS = {"import": "import", "backend": "backend start",
                "build": "build op + inputs", "trace_lower": "trace + lower",
                "compile": "XLA compile", "first_run": "first run",
                "total": "total"}
NEURONS, FAN_OUT, STEPS = 100_000, 100, 200


# -- the child: one fresh process --------------------------------------------

def _load_snn():
    """snn.py, loaded by path: importing numbax.bench.snn would import
    numbax (and Numba) into the pure-JAX process before it times its
    imports."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "snn.py")
    spec = importlib.util.spec_from_file_location("numbax_bench_snn", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _child(variant: str, profile: bool, size=(NEURONS, FAN_OUT, STEPS)) -> dict:
    t = {}
    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp
    import numpy as np
    if variant != "jax":
        import numbax
        from numbax.bench import cold_kernels
    t1 = time.perf_counter()
    t["import"] = t1 - t0
    jax.devices()
    t2 = time.perf_counter()
    t["backend"] = t2 - t1

    (n, k, steps), tpb = size, 256
    snn = _load_snn()
    post, weight, drive, v0 = snn.network(n, k, 0)
    if variant == "jax":
        syn_input = snn.segment_sum_input(n)
    elif variant == "kernel":
        op = numbax.numba_cuda_kernel(
            cold_kernels.spike_scatter_into,
            jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n,
            input_output_aliases={3: 0})

        def syn_input(spikes, post, weight):
            return op(spikes, post, weight, jnp.zeros(n, jnp.float32))
    else:
        blocks = -(-n // tpb)

        def launch(spikes, post, weight, syn, stream):
            cold_kernels.zero_fill[blocks, tpb, stream](syn)
            cold_kernels.spike_scatter[blocks, tpb, stream](
                spikes, post, weight, syn)
        syn_input = numbax.numba_cuda_callable(
            launch, jax.ShapeDtypeStruct((n,), jnp.float32))
    jitted = snn.simulate(syn_input, steps)

    args = [jax.device_put(a) for a in (v0, drive, post, weight)]
    jax.block_until_ready(args)
    t3 = time.perf_counter()
    t["build"] = t3 - t2
    # numbax's Numba work: a kernel op's at trace time, a callable's when
    # func first launches.
    profiler = None
    if profile:
        import cProfile
        profiler = cProfile.Profile()
    if profiler is not None and variant == "kernel":
        profiler.enable()
    lowered = jitted.lower(*args)
    if profiler is not None:
        profiler.disable()
    t4 = time.perf_counter()
    t["trace_lower"] = t4 - t3
    compiled = lowered.compile()
    t5 = time.perf_counter()
    t["compile"] = t5 - t4
    if profiler is not None and variant == "callable":
        profiler.enable()
    counts = np.asarray(compiled(*args))
    if profiler is not None:
        profiler.disable()
    t6 = time.perf_counter()
    t["first_run"] = t6 - t5
    t["total"] = t6 - t0
    out = {"variant": variant, "phases": t,
           "spikes": int(counts.sum())}
    if profiler is not None:
        import io
        import pstats
        buf = io.StringIO()
        stats = pstats.Stats(profiler, stream=buf)
        stats.sort_stats("cumulative").print_stats(r"numba|numbax|cuda", 45)
        stats.sort_stats("tottime").print_stats(20)
        out["profile"] = buf.getvalue()
    return out


# -- the parent: fresh processes, empty then warm caches ----------------------

def _spawn(variant: str, cache_dir: str, size, profile: bool = False,
           timeout: float = 600) -> dict:
    env = dict(os.environ)
    env.update({
        "JAX_COMPILATION_CACHE_DIR": os.path.join(cache_dir, "jax"),
        # Every program is cached, however quick its compile.
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
        "NUMBA_CACHE_DIR": os.path.join(cache_dir, "numba"),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    })
    # The file itself, not `-m numbax.bench...`: that would import numbax
    # (and with it jax and numba) before the child's clock starts.
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant,
           "--size", ",".join(map(str, size))]
    if profile:
        cmd.append("--profile")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{variant} process failed (status "
                           f"{proc.returncode}): " + " | ".join(tail))
    result = json.loads(lines[-1])
    result["wall_s"] = wall
    return result


def measure(runs: int = 3, variants=VARIANTS, profile: bool = False,
            size=(NEURONS, FAN_OUT, STEPS), log=print) -> list[dict]:
    """One row per (variant, caches): phase seconds (warm: medians over
    `runs` processes). Rows of a variant whose process failed say so."""
    rows: list[dict] = []
    spikes = {}
    with tempfile.TemporaryDirectory(prefix="numbax-cold-") as tmp:
        for variant in variants:
            cache_dir = os.path.join(tmp, variant)
            try:
                empty = _spawn(variant, cache_dir, size)
                warm = [_spawn(variant, cache_dir, size,
                               profile=profile and variant != "jax"
                               and i == runs - 1) for i in range(runs)]
            except Exception as exc:  # noqa: BLE001 - reported in the row
                rows.append({"variant": variant, "caches": "empty",
                             "status": f"FAILED: {exc}"})
                log(f"[cold start] {variant}: FAILED: {exc}")
                continue
            spikes[variant] = {empty["spikes"], *(w["spikes"] for w in warm)}
            rows.append({"variant": variant, "caches": "empty", "status": "ok",
                         "runs": 1, "phases": empty["phases"],
                         "wall_s": empty["wall_s"]})
            med = {p: statistics.median(w["phases"][p] for w in warm)
                   for p in warm[0]["phases"]}
            rows.append({"variant": variant, "caches": "warm", "status": "ok",
                         "runs": runs, "phases": med,
                         "wall_s": statistics.median(w["wall_s"] for w in warm)})
            for w in warm:
                if "profile" in w:
                    rows[-1]["profile"] = w["profile"]
            log(f"[cold start] {variant}: total {empty['phases']['total']:.2f} s "
                f"empty, {med['total']:.2f} s warm")
    # Every way computes the same network: a disagreement is a wrong result.
    counts = {v: s for v, s in spikes.items()}
    if len({frozenset(s) for s in counts.values()}) > 1 or any(
            len(s) > 1 for s in counts.values()):
        for r in rows:
            if r.get("status") == "ok":
                r["status"] = f"FAILED: spike counts differ {counts}"
    return rows


def format_table(rows: list[dict]) -> str:
    """A row per (way, caches), a column per phase (seconds)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    out = []
    if ok:
        out += ["| way | caches | " + " | ".join(
                    PHASE_LABELS[p] for p in PHASES + ("total",)) + " |",
                "|---|---|" + "---:|" * (len(PHASES) + 1)]
        for r in ok:
            out.append(f"| {LABELS[r['variant']]} | {r['caches']} | " + " | ".join(
                f"{r['phases'][p]:.2f}" for p in PHASES + ("total",)) + " |")
        warm = {r["variant"]: r["phases"] for r in ok if r["caches"] == "warm"}
        if "jax" in warm and "kernel" in warm:
            d = warm["kernel"]["trace_lower"] - warm["jax"]["trace_lower"]
            out.append(f"\nwarm caches, trace + lower: numbax kernel {d:+.2f} s "
                       "against pure JAX")
    for r in rows:
        if r.get("status") != "ok":
            name = r.get("variant", r.get("name", "cold start"))
            out.append(f"{LABELS.get(name, name)}: {r.get('status')}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m numbax.bench.cold_start",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3,
                   help="processes with warm caches per way (default 3)")
    p.add_argument("--only", default=None,
                   help="comma-separated ways, of: " + ", ".join(VARIANTS))
    p.add_argument("--profile", action="store_true",
                   help="profile trace + lower of the kernel op (warm caches)")
    p.add_argument("--size", default=f"{NEURONS},{FAN_OUT},{STEPS}",
                   metavar="N,K,STEPS",
                   help="neurons, synapses per neuron, steps (default "
                   "%(default)s)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        size = tuple(int(v) for v in args.size.split(","))
        if len(size) != 3 or min(size) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--size: three positive integers N,K,STEPS, got {args.size!r}")
    if args.child:
        print(json.dumps(_child(args.child, args.profile, size)), flush=True)
        return 0
    if args.runs < 1:
        p.error("--runs must be >= 1")
    variants = VARIANTS
    if args.only:
        variants = tuple(v.strip() for v in args.only.split(",") if v.strip())
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            p.error(f"--only: unknown {bad}; known: {list(VARIANTS)}")
    rows = measure(args.runs, variants, args.profile, size)
    for r in rows:
        if "profile" in r:
            phase = ("trace + lower" if r["variant"] == "kernel"
                     else "the first run")
            print(f"== profile: {phase} of the {LABELS[r['variant']]} "
                  "op, warm caches")
            print(r["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(format_table(rows))
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
