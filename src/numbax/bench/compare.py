"""Before/after comparison of benchmark runs on one machine.

    python -m numbax.bench.compare BEFORE.json [...] -- AFTER.json [...]

Each JSON is one ``python -m numbax bench --json`` run. For every row
(table rows: chain, single, the moving-buffers measurements moving, donated
and single_moving, bandwidth; vmap, spiking-network, launch-cost
and cold-start rows) it
prints the median of each side over its runs, their ranges and after/before
(for bandwidth before/after, so > 1 is always "after is slower"). A row is
marked ``slower`` only when each side has at least two runs, every after
run is slower than every before run, and the medians differ by more than
``--tolerance`` (default 3%): single runs of one-op programs move by 10-20%
between runs, so a median alone would flag noise. A row measured on one
side only (failed or missing on the other) is listed and fails the
comparison, except for a moving-buffers measurement that a side did not
take at all (a suite from before them, or --no-moving): that is said in
one line. The controls (native handlers, pure JAX) show how much of
a difference the run order and the machine cause by themselves.
scripts/ab_bench.sh makes the runs, alternating the order (ABBA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence

# (row, metric) -> list of values; "bw" is higher-is-better.
Samples = dict[tuple[str, str], list[float]]

# The moving-buffers measurements of a table row (absent from older runs,
# and from runs with --no-moving: then measured on one side only).
MOVING_METRICS = ("moving", "donated", "single_moving")

# Rows numbax does not take part in: what run order and drift cost alone.
CONTROL_ROWS = {"native", "native_cmdbuf", "pure_callback"}


def is_control(row: str) -> bool:
    """The native handlers, pure_callback, vmap's jnp rows and the spiking
    network's pure-JAX row (row names as samples() makes them)."""
    return (row in CONTROL_ROWS or row.endswith(": jnp")
            or row.startswith("snn: (a) pure JAX")
            or row.startswith(LAUNCH_CONTROLS)
            or row.startswith("cold start: jax "))


# Launch-cost rows that are Numba's or the driver's alone.
LAUNCH_CONTROLS = ("launch: configure", "launch: driver_", "launch: numba")


def samples(runs: Sequence[dict]) -> Samples:
    out: Samples = {}

    def add(key, value):
        if isinstance(value, (int, float)):
            out.setdefault(key, []).append(float(value))

    for run in runs:
        for row in run.get("results", []):
            if row.get("status") != "ok":
                continue
            for metric in ("chain", "single", *MOVING_METRICS):
                add((row["name"], metric), (row.get(metric) or {}).get("us_per_call"))
            add((row["name"], "bw"), (row.get("bandwidth") or {}).get("gb_per_s"))
        workloads = run.get("workloads") or {}
        for row in workloads.get("vmap", []):
            if row.get("status") == "ok":
                add((f"vmap {row['B']}x{row['n']}: {row['name']}", "us"),
                    row.get("us_per_call"))
        for row in workloads.get("snn", []):
            add((f"snn: {row.get('name')}", "us/step"), row.get("us_per_step"))
        for row in workloads.get("launch_cost", []):
            add((f"launch: {row.get('name')}", "us"), row.get("us_per_launch"))
        for row in workloads.get("cold_start", []):
            if row.get("status") == "ok":
                for phase in ("trace_lower", "first_run", "total"):
                    add((f"cold start: {row['variant']} {row['caches']} "
                         f"caches {phase}", "s"),
                        (row.get("phases") or {}).get(phase))
    return out


def untaken_metrics(before: Samples, after: Samples) -> set[str]:
    """The moving-buffers metrics one side has no row of at all."""
    return {m for m in MOVING_METRICS
            if not any(k[1] == m for k in before)
            or not any(k[1] == m for k in after)}


MIN_RUNS = 2  # per side, before a row can be flagged


def compare(before: Samples, after: Samples, tolerance: float = 0.03) -> list[dict]:
    rows = []
    for key, b in before.items():
        a = after.get(key)
        if not a:
            continue
        enough = len(a) >= MIN_RUNS and len(b) >= MIN_RUNS
        higher_is_better = key[1] == "bw"
        mb, ma = statistics.median(b), statistics.median(a)
        slowdown = (mb / ma) if higher_is_better else (ma / mb)
        if higher_is_better:
            separated = max(a) < min(b)
        else:
            separated = min(a) > max(b)
        rows.append({
            "row": key[0], "metric": key[1], "before": mb, "after": ma,
            "before_range": (min(b), max(b)), "after_range": (min(a), max(a)),
            "slowdown": slowdown,
            "control": is_control(key[0]),
            "slower": enough and separated and slowdown > 1 + tolerance,
        })
    return rows


def markdown(rows: list[dict], n_before: int, n_after: int) -> str:
    lines = [f"| row | metric | before ({n_before} runs) | after ({n_after} runs) "
             "| after/before | |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        mark = "slower" if r["slower"] else ("control" if r["control"] else "")
        lines.append(
            f"| {r['row']} | {r['metric']} | {r['before']:.2f} "
            f"({r['before_range'][0]:.1f}-{r['before_range'][1]:.1f}) | "
            f"{r['after']:.2f} ({r['after_range'][0]:.1f}-{r['after_range'][1]:.1f}) "
            f"| {r['slowdown']:.2f} | {mark} |")
    return "\n".join(lines)


def _load(path: str) -> dict:
    with open(path) as f:
        run = json.load(f)
    if not isinstance(run, dict) or "results" not in run:
        raise ValueError(f"{path} is not a `numbax bench --json` run")
    return run


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m numbax.bench.compare")
    p.add_argument("before", nargs="+")
    p.add_argument("--tolerance", type=float, default=0.03)
    opts = p.parse_args(argv[:cut])
    after_files = argv[cut + 1:]
    if not after_files:
        print("no after runs (the JSON files after --)", file=sys.stderr)
        return 2
    try:
        runs_b = [_load(f) for f in opts.before]
        runs_a = [_load(f) for f in after_files]
    except (OSError, ValueError) as exc:
        print(f"cannot read a benchmark run: {exc}", file=sys.stderr)
        return 2
    before, after = samples(runs_b), samples(runs_a)
    rows = compare(before, after, opts.tolerance)
    print(markdown(rows, len(runs_b), len(runs_a)))
    flagged = [r for r in rows if r["slower"] and not r["control"]]
    print(f"\nslower beyond the spread of runs (>{opts.tolerance:.0%}): "
          + (", ".join(f"{r['row']} {r['metric']}" for r in flagged) or "none"))
    if min(len(runs_b), len(runs_a)) < MIN_RUNS:
        print(f"(fewer than {MIN_RUNS} runs on a side: nothing is flagged)")
    untaken = untaken_metrics(before, after)
    if untaken:
        print("not compared: " + ", ".join(sorted(untaken)) + " (not measured "
              "on one side: a suite from before them, or --no-moving)")
    one_sided = sorted(k for k in set(before) ^ set(after) if k[1] not in untaken)
    for row, metric in one_sided:
        side = "before" if (row, metric) in before else "after"
        print(f"measured {side} only: {row} {metric}")
    return 1 if flagged or one_sided else 0


if __name__ == "__main__":
    sys.exit(main())
