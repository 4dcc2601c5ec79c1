"""The numbax benchmark suite: op(x) = 2*x + 1 (float32) through every bridge.

Builds the native reference FFI handler with nvcc, checks every
implementation against numpy, then times chain / single, the moving-buffers
programs (moving / donated / single_moving) and bandwidth as
docs/benchmarks.md describes, interleaved: each round measures every
implementation once and the table reports the median over rounds, so drift
of the machine during the run hits every row alike. Writes JSON if asked,
draws a chart with --plot, and prints the table last.

It measures GPU paths. Where JAX sees no GPU it runs the CPU rows instead
(numbax.numba_kernel against a C++ XLA FFI CPU handler, buffer_callback,
pure_callback, jnp and brainevent's numba_kernel: numbax.bench.cpu), or
--cpu asks for them anywhere; with Numba's CUDA simulator on (or
--cpu-smoke) it runs the tiny smoke configuration of the GPU paths.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from .measure import (measure_bandwidth, measure_latency, measure_moving,
                      prepare)
from .mode import EXIT_NO_GPU, SIMULATOR_NOTE

NAMES = ["native", "native_cmdbuf", "numbax_kernel", "numbax_callable",
         "numbax_callable_numba", "numbax_capture", "numbax_kernel_mlir",
         "numbax_callable_mlir", "buffer_callback", "buffer_callback_cmdbuf",
         "pure_callback"]
BASELINES = ["native", "native_cmdbuf"]
#: The CPU rows' names (numbax.bench.cpu.NAMES), for --only on a CPU run.
CPU_NAMES = ["native", "native_empty", "numba_kernel", "numba_kernel_empty",
             "numba_kernel_xla", "buffer_callback", "pure_callback", "jnp", "brainevent"]
SIMULATOR_ENV = {"JAX_PLATFORMS": "cpu", "NUMBA_ENABLE_CUDASIM": "1"}


def build_parser(prog: str, default_json: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="fewer rounds and a 64 MiB bandwidth array (smoke runs)")
    p.add_argument("--json", default=default_json, metavar="PATH",
                   help="where to write the results as JSON; its directory "
                   "must exist (default: " + (default_json or "not written")
                   + ")")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated implementations to run, of: "
                   + ", ".join(NAMES) + " (the native baselines always run: "
                   "the ratios need them)")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help="interleaved measurement rounds (default: 10; "
                   "--quick 4; --cpu-smoke 2)")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="skip the bandwidth benchmark")
    p.add_argument("--no-moving", action="store_true",
                   help="skip the moving-buffers measurements (a chain of 20 "
                   "ops over 64 rotating inputs, the same chain with its "
                   "input donated, one op over the 64 inputs)")
    p.add_argument("--no-workloads", action="store_true",
                   help="skip the workload benchmarks (vmap of a kernel, the "
                   "spiking network, launch cost, cold start)")
    p.add_argument("--no-cold-start", action="store_true",
                   help="skip the cold-start rows (fresh processes, empty and "
                   "warm caches, by phase: about a minute; --no-workloads "
                   "skips them too)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw the results as a bar chart into this PNG "
                   "file (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is drawn on stderr only when "
                   "stderr is a terminal anyway)")
    p.add_argument("--build-dir", default=None,
                   help="where nvcc writes the native library (default: a new temp dir)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the check inputs, 0 to 2**63 - 1 (default: "
                   "random, recorded in the JSON)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="no GPU: JAX on CPU with Numba's CUDA simulator, a handful "
                   "of iterations; GPU-only rows report 'skipped (no GPU)'. "
                   "Chosen by itself when NUMBA_ENABLE_CUDASIM=1 and JAX sees "
                   "no GPU")
    p.add_argument("--cpu", action="store_true",
                   help="the CPU rows (numbax.numba_kernel against a C++ XLA "
                   "FFI CPU handler, ...) even where JAX sees a GPU: JAX on "
                   "its CPU backend. Chosen by itself where JAX sees no GPU "
                   "and the simulator is off")
    p.add_argument("--tiny", action="store_true",
                   help="CPU rows at tiny sizes and one round: checks every "
                   "row end to end in seconds; no target is judged")
    p.add_argument("--plot-from", default=None, metavar="JSON",
                   help="run nothing: draw the chart of a saved JSON record "
                   "(--json) into --plot PNG (default: the JSON's path with .png); "
                   "needs no GPU")
    p.epilog = ("exit status: 0 every row ran or was skipped; 1 a row failed;\n"
                "  2 bad command line (checked before anything runs), or the\n"
                "  simulator on while JAX runs on a GPU or cannot start;\n"
                f"  {EXIT_NO_GPU} JAX could not start a backend and the simulator "
                "is off (nothing ran)")
    return p


#: Options that only mean something for a run (--plot-from runs nothing).
_RUN_OPTIONS = ("quick", "only", "rounds", "no_bandwidth", "no_moving",
                "build_dir", "seed", "cpu_smoke", "no_cold_start", "cpu",
                "tiny")


#: The largest --seed: numpy and JAX take seeds up to a signed 64-bit int.
MAX_SEED = 2**63 - 1


def _refuse(p: argparse.ArgumentParser, message: str) -> None:
    """Exit status 2 with one line, ``PROG: error: message`` (no usage)."""
    p.exit(2, f"{p.prog}: error: {message}\n")


def output_path_problem(path: str) -> str | None:
    """Why the suite could not write a file at `path`, or None.

    Missing directories are not created: a mistyped path would otherwise
    leave a stray tree behind (as root, anywhere). Root passes
    ``os.access`` everywhere, so the checks that hold for root come first.
    """
    full = os.path.abspath(path)
    parent = os.path.dirname(full)
    if os.path.isdir(full):
        return "is a directory; give a file name in it"
    if not os.path.exists(parent):
        # The nearest ancestor that exists says which of the two it is.
        ancestor = parent
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            return (f"{ancestor} is not a directory, so nothing can be "
                    "written below it; pick another path")
        return (f"the directory {parent} does not exist; create it first "
                f"(mkdir -p {parent}) or pick another path")
    if not os.path.isdir(parent):
        return (f"{parent} is not a directory, so nothing can be written "
                "below it; pick another path")
    if os.path.exists(full) and not os.access(full, os.W_OK):
        return "the file exists and is not writable; pick another path"
    if not os.access(parent, os.W_OK | os.X_OK):
        return (f"the directory {parent} is not writable; pick another "
                "path")
    return None


def parse_args(argv: Sequence[str] | None = None, *,
               prog: str = "python -m numbax bench",
               default_json: str | None = None) -> argparse.Namespace:
    p = build_parser(prog, default_json)
    args = p.parse_args(argv)
    if args.only is not None:
        wanted = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in NAMES + CPU_NAMES]
        if unknown:
            p.error(f"--only: unknown implementation(s) {unknown}; known: "
                    f"{NAMES} (GPU), {CPU_NAMES} (CPU)")
        args.cpu_only = wanted
        args.only = BASELINES + [s for s in wanted if s not in BASELINES]
    else:
        args.cpu_only = None
    if args.cpu and args.cpu_smoke:
        p.error("--cpu (the CPU rows) and --cpu-smoke (the GPU paths through "
                "the simulator) are two different runs: give one")
    if args.rounds is not None and args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    # Checked here, before anything runs: a bad --seed or output path found
    # after the suite would end a run of minutes in a traceback.
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        _refuse(p, f"--seed must be an int from 0 to 2**63 - 1 (numpy's and "
                f"JAX's seeds are unsigned), got {args.seed}")
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        problem = None if path is None else output_path_problem(path)
        if problem:
            _refuse(p, f"{option} {path}: {problem}")
    # The chart must never replace the record it is drawn from.
    record = args.plot_from if args.plot_from is not None else args.json
    chart = args.plot
    if chart is None and args.plot_from is not None:
        chart = default_chart_path(args.plot_from)
    if record and chart and os.path.realpath(record) == os.path.realpath(chart):
        _refuse(p, f"the chart {chart} would overwrite the record {record} "
                "it is drawn from; give --plot another path")
    if args.plot_from is not None:
        given = [o for o in _RUN_OPTIONS if getattr(args, o) not in (None, False)]
        if given:
            p.error("--plot-from draws a saved record and runs nothing: leave out "
                    + ", ".join("--" + o.replace("_", "-") for o in given))
    return args


def _enter_cpu() -> None:
    """--cpu: JAX on its CPU backend (before any backend starts: importing
    jax starts none)."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:
        import jax
        jax.config.update("jax_platforms", "cpu")


def _enter_cpu_smoke(allow_reexec: bool) -> None:
    """Puts JAX on the CPU and Numba in simulator mode, which both read their
    settings when first imported: re-executes the command with the settings
    in the environment if they were imported too early (``python -m numbax``
    imports jax before it parses the command line)."""
    if all(os.environ.get(k) == v for k, v in SIMULATOR_ENV.items()):
        return
    early = [m for m in ("jax", "numba") if m in sys.modules]
    if not early:
        os.environ.update(SIMULATOR_ENV)
        return
    if allow_reexec:
        env = dict(os.environ, **SIMULATOR_ENV)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    raise SystemExit(
        f"--cpu-smoke: {' and '.join(early)} was imported before the simulator "
        "could be switched on; run the command with JAX_PLATFORMS=cpu "
        "NUMBA_ENABLE_CUDASIM=1 in its environment")


def _startup_rows(key: str, smoke: bool, log, measure) -> list[dict]:
    """The launch-cost or cold-start rows: GPU only (the simulator has no
    launches to time, and its start says nothing of a GPU's); a failure is
    a row, never an abort."""
    if smoke:
        return [{"name": key, "status": "skipped (no GPU)"}]
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - still print the rest
        log(f"[{key}] FAILED:\n{traceback.format_exc().rstrip()}")
        return [{"name": key, "status": f"FAILED: {type(exc).__name__}: {exc}"}]


def default_chart_path(json_path: str) -> str:
    """--plot-from's chart without --plot: the JSON's path with .png."""
    return os.path.splitext(json_path)[0] + ".png"


def plot_from(json_path: str, png_path: str | None, prog: str) -> int:
    """``--plot-from``: the chart of a saved record, without running anything
    (no GPU, no JAX needed). Returns the exit status."""
    import json

    from . import plot
    out = png_path or default_chart_path(json_path)
    try:
        with open(json_path) as f:
            record = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"{prog}: error: --plot-from: cannot read {json_path}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(record, dict) or not isinstance(record.get("results"), list):
        print(f"{prog}: error: --plot-from: {json_path} is not a record of this "
              "suite (no 'results' list); write one with --json", file=sys.stderr)
        return 2
    try:
        plot.save_chart(record, out)
    except Exception as exc:  # noqa: BLE001 - one line, no traceback
        print(f"{prog}: error: could not draw {out} from {json_path}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m numbax bench",
         default_json: str | None = None, allow_reexec: bool = False) -> int:
    """Runs the suite; returns the exit status: 0, 1 if any row failed (or
    the chart could not be drawn), 2 for a bad command line or environment,
    ``mode.EXIT_NO_GPU`` (3) when JAX cannot start a backend and the
    simulator is off. Where JAX runs on the CPU (no GPU, or ``--cpu``) it
    runs the CPU rows (:func:`numbax.bench.cpu.run`).

    ``allow_reexec`` lets ``--cpu-smoke`` restart the process with the
    simulator switched on when jax or numba was imported already (command
    line entry points only).
    """
    args = parse_args(argv, prog=prog, default_json=default_json)
    from . import plot
    if args.plot or args.plot_from:
        try:
            plot.require_matplotlib()
        except plot.PlotUnavailable as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
    if args.plot_from:
        return plot_from(args.plot_from, args.plot, prog)
    if args.cpu_smoke:
        _enter_cpu_smoke(allow_reexec)
    if args.cpu:
        _enter_cpu()

    from ..runtime.numba_bridge import simulator_enabled
    from .mode import Refused, jax_backend, select
    try:
        mode = select(cpu_smoke=args.cpu_smoke, simulator=simulator_enabled(),
                      backend=jax_backend(), prog=prog, cpu=args.cpu)
    except Refused as exc:
        print(str(exc), file=sys.stderr)
        return exc.status
    if args.tiny and not mode.cpu:
        print(f"{prog}: error: --tiny sizes the CPU rows, and this run times "
              "the GPU paths (see --cpu)", file=sys.stderr)
        return 2
    if mode.cpu:
        if args.plot:
            print(f"{prog}: error: --plot draws the GPU suite's chart; the CPU "
                  "rows have none (their table is printed, --json keeps them)",
                  file=sys.stderr)
            return 2
        from . import cpu
        seed = args.seed if args.seed is not None else int.from_bytes(
            os.urandom(4), "little")
        return cpu.run(quick=args.quick, tiny=args.tiny, rounds=args.rounds,
                       only=args.cpu_only, seed=seed, json_path=args.json,
                       build_dir=args.build_dir,
                       workloads=not args.no_workloads, header=mode.header,
                       argv=sys.argv[1:] if argv is None else list(argv),
                       log=(lambda m: print(m, file=sys.stderr, flush=True)))

    import jax
    import numpy as np

    from . import cold_start, impls, launch_cost, report, timing
    from .native import build_and_register
    from .progress import Progress

    if mode.header:
        print(mode.header, flush=True)
    if mode.smoke:
        cfg = timing.Config.cpu_smoke()
    elif args.quick:
        cfg = timing.Config.quick()
    else:
        cfg = timing.Config()
    if args.rounds is not None:
        cfg.rounds = args.rounds
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)

    selected = [i for i in impls.all_impls(impls.Env(on_gpu=False))
                if args.only is None or i.name in args.only]
    progress = Progress(len(selected), "build + check",
                        enabled=False if args.no_progress else None)
    log = progress.write

    device = jax.devices()[0]
    on_gpu = device.platform == "gpu"
    env = impls.Env(on_gpu=on_gpu)
    log(f"device: {getattr(device, 'device_kind', device)} ({device.platform}); "
        f"config: {cfg}")

    if on_gpu:
        try:
            cc = getattr(device, "compute_capability", None)
            t0 = time.perf_counter()
            env.native = build_and_register(cc, args.build_dir)
            log(f"native: built {env.native.library} in "
                f"{time.perf_counter() - t0:.1f} s ({' '.join(env.native.command)})")
        except Exception as exc:  # noqa: BLE001
            env.native_error = f"{type(exc).__name__}: {exc}"
            log(f"native: build FAILED:\n{traceback.format_exc().rstrip()}")
        try:
            impls.warm_numba_kernel(env)
        except Exception:  # noqa: BLE001 - the rows using it will report it
            log(f"numba kernel warm-up FAILED:\n{traceback.format_exc().rstrip()}")

    x = jax.device_put(rng.uniform(-1, 1, cfg.n).astype(np.float32))

    rows, prepared = [], []
    for impl in impls.all_impls(env):
        if args.only is not None and impl.name not in args.only:
            continue
        row, ready = prepare(impl, cfg, rng, x, timing, impls.Unavailable, log)
        rows.append(row)
        if ready is not None:
            prepared.append(ready)
        progress.advance()

    measure_latency(prepared, cfg, x, timing, progress, log)
    if not args.no_moving:
        measure_moving(prepared, cfg, rng, timing, progress, log)
    if not args.no_bandwidth:
        bw_x = jax.random.uniform(jax.random.key(seed), (cfg.bw_n,), np.float32,
                                  -1.0, 1.0)
        bw_x.block_until_ready()
        measure_bandwidth(prepared, cfg, bw_x, timing, progress, log)
        del bw_x
    progress.close()
    del prepared
    # Simulator timings say nothing about speed: ratios of them would read as
    # performance figures, so every ratio stays empty (whatever the rows).
    report.add_ratios(rows, comparable=not mode.smoke)
    workload_rows: dict[str, list] = {"vmap": [], "snn": []}
    if not args.no_workloads:
        from . import workloads
        wcfg = (workloads.WorkloadConfig.cpu_smoke() if mode.smoke else
                workloads.WorkloadConfig.quick() if args.quick else
                workloads.WorkloadConfig())
        for key, run_rows in (
                ("vmap", lambda: workloads.run_vmap(wcfg, rng, timing, log)),
                ("snn", lambda: workloads.run_snn(wcfg, seed, timing, log))):
            try:
                workload_rows[key] = run_rows()
            except Exception as exc:  # noqa: BLE001 - still print the rest
                workload_rows[key] = [{"name": key, "status": "FAILED: "
                                       f"{type(exc).__name__}: {exc}"}]
                log(f"[{key}] FAILED:\n{traceback.format_exc().rstrip()}")
        if mode.smoke:  # the same rule as the main table: no simulator ratios
            for r in workload_rows["vmap"]:
                r.pop("x_flat", None)
        workload_rows["launch_cost"] = _startup_rows(
            "launch_cost", mode.smoke, log,
            lambda: launch_cost.measure(rounds=max(cfg.rounds, 5), log=log))
    if not args.no_workloads and not args.no_cold_start:
        workload_rows["cold_start"] = _startup_rows(
            "cold_start", mode.smoke, log,
            lambda: cold_start.measure(runs=2 if args.quick else 3, log=log))

    record: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "mode": {"smoke": mode.smoke, "header": mode.header},
        "seed": seed,
        "method": (f"interleaved: median over {cfg.rounds} rounds (latency"
                   + ("" if args.no_moving else " and moving buffers")
                   + f") and {cfg.bw_rounds} rounds (bandwidth), after "
                   f"{cfg.warmup_rounds} unrecorded round(s); each round "
                   "measures every implementation once"),
        "config": vars(cfg),
        "environment": report.environment(device, env.native),
        "native_build_error": env.native_error,
        "results": rows,
        "workloads": workload_rows,
    }
    # The paths were checked before the run; what can still fail here (a
    # full disk, a directory removed meanwhile) is one line and status 1.
    write_failed = False
    if args.json:
        try:
            report.write_json(args.json, record)
            print(f"wrote {args.json}", flush=True)
        except Exception as exc:  # noqa: BLE001 - still print the table
            write_failed = True
            print(f"could not write {args.json}: {type(exc).__name__}: {exc}",
                  flush=True)
    plot_failed = False
    if args.plot:
        try:
            plot.save_chart(record, args.plot)
            print(f"wrote {args.plot}", flush=True)
        except Exception as exc:  # noqa: BLE001 - still print the table
            plot_failed = True
            print(f"could not draw {args.plot}: {type(exc).__name__}: {exc}",
                  flush=True)

    env_info = record["environment"]
    v = env_info["versions"]
    if not args.no_workloads:  # before the main table, which comes last
        from .workloads import format_tables
        print(format_tables([r for r in workload_rows["vmap"] if "B" in r],
                            [r for r in workload_rows["snn"]
                             if "neurons" in r]), flush=True)
    for key, module in (("launch_cost", launch_cost),
                        ("cold_start", cold_start)):
        part = workload_rows.get(key)
        if part:
            print(f"\n== {key.replace('_', ' ')}")
            print(module.format_table(part), flush=True)
    print()
    print("== table")
    print(f"{env_info['device']} | jax {v['jax']} jaxlib {v['jaxlib']} | numba "
          f"{v['numba']} numba-cuda {v['numba-cuda']} | n={cfg.n}, chain of "
          f"{cfg.chain_length}, median of {cfg.rounds} interleaved rounds, "
          + ("no moving run, " if args.no_moving else
             f"moving: chain of {cfg.moving_length} over {cfg.moving_inputs} "
             "inputs, ")
          + ("no bandwidth run" if args.no_bandwidth
             else f"bandwidth over {plot.size(cfg.bw_n * 4)}"))
    if mode.smoke:
        print("cpu smoke run: Numba's CUDA simulator, not performance figures")
    print(report.format_table(rows, note=SIMULATOR_NOTE if mode.smoke else None,
                              moving=not args.no_moving), flush=True)
    failed = any(r["status"].startswith("FAILED") for r in rows) or any(
        r.get("status", "ok").startswith("FAILED")
        for part in workload_rows.values() for r in part)
    return 1 if failed or plot_failed or write_failed else 0


if __name__ == "__main__":
    sys.exit(main(allow_reexec=True))
