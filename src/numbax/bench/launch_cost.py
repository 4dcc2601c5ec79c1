"""What one kernel launch inside a plain callable's func costs, and the
driver's own floor beside it.

python -m numbax.bench.launch_cost [--rounds N] [--json PATH]

A plain ``numba_cuda_callable`` whose func makes 200 launches of
``y = 2x + 1`` (4096 float32) back to back on the stream numbax gives it,
timing them itself (host time per launch; no synchronisation inside). Rows,
per launch, medians over interleaved rounds (each round runs every row
once, so the host's drift hits every row alike):

- ``kernel[grid, block, stream](x, y)``: numbax's fast launch, as users
  write it (configuration and launch);
- the configuration alone (``kernel[grid, block, stream]``), Numba's;
- a configuration bound once, then ``cfg(x, y)``: numbax's hook and the
  driver call;
- the hook alone: the same with the driver call left out (a dry run);
- the same parameters sent to ``cuLaunchKernel`` by a C++ loop with no
  Python between launches: with the GIL held (the driver's floor), with the
  GIL released around each launch (as the fast path does), as one
  parameter buffer, and only 20 back to back (were 200 enough to fill the
  stream's queue, the host would wait for the GPU, and this row would be
  lower);
- Numba's own launch (``fast_launch=False``), for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

PER_CALL = 200
SHORT = 20
N = 4096
ROWS = (
    ("fast", "kernel[grid, block, stream](x, y): numbax fast launch"),
    ("configure", "kernel[grid, block, stream] alone (Numba's configuration)"),
    ("bound", "cfg(x, y), cfg bound once: numbax hook + driver"),
    ("hook", "cfg(x, y) dry run: numbax hook, no driver call"),
    ("driver_gil", "cuLaunchKernel from a C++ loop, GIL held (floor)"),
    ("driver_nogil", "cuLaunchKernel from a C++ loop, GIL released per launch"),
    ("driver_buffer", "cuLaunchKernel from a C++ loop, one parameter buffer"),
    ("driver_short", f"cuLaunchKernel from a C++ loop, GIL held, {SHORT} "
     "back to back (queue filling up?)"),
    ("numba", "Numba's launch (fast_launch=False)"),
)
_DRIVER_MODES = {"driver_gil": 0, "driver_nogil": 1, "driver_buffer": 2,
                 "driver_short": 0}


def measure(rounds: int = 15, log=print) -> list[dict]:
    """One dict per row: us per launch (median over rounds, min, max)."""
    import jax
    import jax.numpy as jnp

    import numbax
    from numbax import _core

    from .kernels import affine

    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    blocks = -(-N // 256)
    samples: dict[str, list[float]] = {name: [] for name, _ in ROWS}
    state = {"row": "fast"}

    def func(x, y, s):
        row = state["row"]
        if row in ("fast", "numba"):
            t0 = time.perf_counter()
            for _ in range(PER_CALL):
                affine[blocks, 256, s](x, y)
        elif row == "configure":
            t0 = time.perf_counter()
            for _ in range(PER_CALL):
                affine[blocks, 256, s]
        elif row in ("bound", "hook"):
            cfg = affine[blocks, 256, s]
            cfg(x, y)  # the plan exists (recorded on the first call)
            if row == "hook":
                _core.set_fast_launch_dry_run(True)
            try:
                t0 = time.perf_counter()
                for _ in range(PER_CALL):
                    cfg(x, y)
                dt = time.perf_counter() - t0
            finally:
                _core.set_fast_launch_dry_run(False)
            samples[row].append(dt / PER_CALL * 1e6)
            return
        else:
            # The words the fast path packs for this very call's buffers.
            cfg = affine[blocks, 256, s]
            cfg(x, y)
            _core.set_fast_launch_dry_run(True)
            try:
                cfg(x, y)
            finally:
                _core.set_fast_launch_dry_run(False)
            last: dict = _core.last_fast_launch()  # type: ignore[assignment]
            count = SHORT if row == "driver_short" else PER_CALL
            seconds = _core.time_driver_launches(
                last["function"], last["grid"], last["block"], last["words"],
                int(s.handle), count, _DRIVER_MODES[row])
            if seconds < 0:
                raise RuntimeError(f"cuLaunchKernel failed: CUresult "
                                   f"{int(-seconds)}")
            samples[row].append(seconds / count * 1e6)
            return
        samples[row].append((time.perf_counter() - t0) / PER_CALL * 1e6)

    fast_op = jax.jit(numbax.numba_cuda_callable(func, spec))
    numba_op = jax.jit(numbax.numba_cuda_callable(func, spec,
                                                  fast_launch=False))
    v = jnp.ones(N, jnp.float32)
    want = 2 * v + 1
    for r in range(rounds + 1):  # round 0 warms up and is dropped
        for name, _ in ROWS:
            state["row"] = name
            out = (numba_op if name == "numba" else fast_op)(v)
            out.block_until_ready()
            if name in ("fast", "numba", "bound") and not bool(
                    jnp.all(out == want)):
                raise AssertionError(f"launch_cost: row {name} computed a "
                                     "wrong result")
            if r == 0:
                samples[name].clear()
    rows = []
    for name, label in ROWS:
        s = samples[name]
        rows.append({"name": name, "label": label,
                     "us_per_launch": statistics.median(s),
                     "min": min(s), "max": max(s), "rounds": len(s)})
        log(f"[launch cost] {label}: {rows[-1]['us_per_launch']:.2f} us")
    return rows


def format_table(rows: list[dict]) -> str:
    timed = [r for r in rows if "us_per_launch" in r]
    by = {r["name"]: r for r in timed}
    out = []
    if timed:
        out += [f"| one launch inside func, {PER_CALL} back to back | us | "
                "min-max |", "|---|---:|---:|"]
    for r in timed:
        out.append(f"| {r['label']} | {r['us_per_launch']:.2f} | "
                   f"{r['min']:.2f}-{r['max']:.2f} |")
    for r in rows:
        if "us_per_launch" not in r:
            out.append(f"launch cost: {r.get('status')}")
    if "fast" in by and "driver_nogil" in by:
        over = by["fast"]["us_per_launch"] - by["driver_nogil"]["us_per_launch"]
        out.append(f"\nnumbax's fast launch over the driver's (GIL released): "
                   f"{over:+.2f} us per launch")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m numbax.bench.launch_cost",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)
    import jax
    if jax.devices()[0].platform != "gpu":
        print("launch_cost measures launches on a GPU; JAX sees none")
        return 3
    rows = measure(max(1, args.rounds))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
