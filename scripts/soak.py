#!/usr/bin/env python3
"""Soak test: many calls of each numbax op kind, with memory flat after warm-up.

    python3 scripts/soak.py --calls 1000000      # on a GPU machine
    python3 scripts/soak.py                      # no GPU: a short simulator run

Runs `--calls` calls each of a plain numba_cuda_callable, a capture-mode
callable (capture=True) and a numba_cuda_kernel, and prints host memory (RSS)
and device memory (XLA's bytes in use, and the device's free memory as the
CUDA driver reports it) after warm-up and at the end. Exits 1 if, between
warm-up and the end of any op, RSS grew by more than --rss-limit-mib
(default 64 MiB) or XLA's device bytes in use by more than --device-limit-mib
(default 4 MiB).

To amortise JAX's per-dispatch cost (tens of microseconds, far more than a
numbax call) each jitted program chains --chain calls of the op (default 100
on a GPU), so 1,000,000 calls are 10,000 program runs per op. The bridge's
counters are printed too: a plain callable runs Python once per call, a
captured one replays a CUDA graph, a kernel never enters Python.

Without a GPU (or with --simulator) it runs on JAX's CPU backend through
Numba's CUDA simulator, with a small default count: a smoke test of the
script, not a soak. numbax must be importable (scripts/gpu_check.sh installs
it into /tmp/numbax-site, which this script adds to sys.path if needed).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import time


# numba.cuda, imported by main() once the environment chose GPU or simulator.
# A module global: the simulator swaps a kernel's global `cuda` for its own.
cuda = None


def make_kernel():
    @cuda.jit
    def affine(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] * 0.5 + 1.0  # converges to 2: bounded forever
    return affine


def gpu_available() -> bool:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    return count.value > 0


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=None,
                   help="calls per op (default 1,000,000 on a GPU, 300 on "
                        "the simulator)")
    p.add_argument("--chain", type=int, default=None,
                   help="op calls per jitted program (default 100 on a GPU, "
                        "10 on the simulator)")
    p.add_argument("--size", type=int, default=None,
                   help="elements per array (default 1024 on a GPU, 32 on "
                        "the simulator, which runs a Python thread per CUDA "
                        "thread)")
    p.add_argument("--ops", default="plain,capture,kernel",
                   help="comma-separated subset of plain,capture,kernel")
    p.add_argument("--warmup", type=float, default=0.05,
                   help="fraction of the calls run before the baseline")
    p.add_argument("--rss-limit-mib", type=float, default=64.0)
    p.add_argument("--device-limit-mib", type=float, default=4.0)
    p.add_argument("--max-seconds", type=float, default=450.0,
                   help="time budget for all ops; an op that would overrun "
                        "its share stops early (reported, not a failure)")
    p.add_argument("--simulator", action="store_true",
                   help="run on the CPU simulator even if there is a GPU")
    p.add_argument("--json", default=None, help="also write the figures here")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    simulator = args.simulator or not gpu_available()
    if simulator:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        os.environ["JAX_PLATFORMS"] = "cpu"
    else:
        os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    calls = args.calls or (300 if simulator else 1_000_000)
    chain = args.chain or (10 if simulator else 100)

    try:
        import numbax  # noqa: F401
    except ImportError:
        if os.path.isdir("/tmp/numbax-site"):
            sys.path.insert(0, "/tmp/numbax-site")
        import numbax  # noqa: F401
    import jax
    import jax.numpy as jnp
    import numpy as np
    from numba import cuda as numba_cuda

    import numbax

    global cuda
    cuda = numba_cuda
    n = args.size or (32 if simulator else 1024)
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    affine = make_kernel()
    threads = 256
    blocks = (n + threads - 1) // threads

    def launch(x, out, stream):
        affine[blocks, threads, stream](x, out)

    ops = {
        "plain": lambda: numbax.numba_cuda_callable(launch, spec),
        "capture": lambda: numbax.numba_cuda_callable(launch, spec,
                                                      capture=True),
        "kernel": lambda: numbax.numba_cuda_kernel(affine, spec,
                                                   launch_dims=n),
    }
    chosen = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = set(chosen) - set(ops)
    if unknown:
        print(f"soak.py: unknown ops {sorted(unknown)}", file=sys.stderr)
        return 2

    device = jax.devices()[0]

    def device_bytes():
        stats = device.memory_stats() or {}
        value = stats.get("bytes_in_use")
        return None if value is None else value / 2**20

    def driver_free():
        if simulator:
            return None
        try:
            free, _total = cuda.current_context().get_memory_info()
            return free / 2**20
        except Exception:
            return None

    def fmt(v):
        return "n/a" if v is None else f"{v:.1f}"

    print(f"soak: {'SIMULATOR (smoke run)' if simulator else device} | "
          f"jax {jax.__version__} | {calls:,} calls per op | {chain} calls "
          f"per jitted program | {n} float32 | limits: RSS +"
          f"{args.rss_limit_mib} MiB, device +{args.device_limit_mib} MiB",
          flush=True)

    results = {}
    failed = []
    budget = args.max_seconds / max(1, len(chosen))
    x0 = jnp.zeros(n, jnp.float32)
    for name in chosen:
        op = ops[name]()

        @jax.jit
        def program(v, op=op):
            for _ in range(chain):
                v = op(v)
            return v

        runs = max(1, calls // chain)
        warm_runs = max(2, int(runs * args.warmup))
        counters0 = numbax.bridge_counters()
        v = x0
        for _ in range(warm_runs):
            v = program(v)
        v.block_until_ready()
        gc.collect()
        base = {"rss": rss_mib(), "device": device_bytes(),
                "free": driver_free()}
        t0 = time.perf_counter()
        done = 0
        stopped = False
        for r in range(runs - warm_runs):
            v = program(v)
            done += 1
            if r % 50 == 49:
                v.block_until_ready()
                if time.perf_counter() - t0 > budget:
                    stopped = True
                    break
        v.block_until_ready()
        elapsed = time.perf_counter() - t0
        gc.collect()
        end = {"rss": rss_mib(), "device": device_bytes(),
               "free": driver_free()}
        counters1 = numbax.bridge_counters()
        total_calls = (warm_runs + done) * chain
        final = np.asarray(v)
        correct = bool(np.allclose(final, 2.0, atol=1e-3))
        rss_growth = end["rss"] - base["rss"]
        dev_growth = (None if base["device"] is None
                      else end["device"] - base["device"])
        per_call_us = elapsed / max(1, done * chain) * 1e6
        python_calls = counters1["calls"] - counters0["calls"]
        print(f"{name:8s} {total_calls:>10,} calls in {elapsed:6.1f}s "
              f"({per_call_us:.2f} us/call){' STOPPED EARLY (time budget)' if stopped else ''}\n"
              f"         RSS after warm-up {base['rss']:.1f} MiB, end "
              f"{end['rss']:.1f} MiB (+{rss_growth:.2f})\n"
              f"         XLA device bytes in use {fmt(base['device'])} -> "
              f"{fmt(end['device'])} MiB; driver free {fmt(base['free'])} -> "
              f"{fmt(end['free'])} MiB\n"
              f"         Python calls {python_calls:,}, bridge errors "
              f"{counters1['errors'] - counters0['errors']}, graph hits "
              f"{counters1['graph_hits'] - counters0['graph_hits']}, result "
              f"{'correct' if correct else 'WRONG'}", flush=True)
        results[name] = {
            "calls": total_calls, "seconds": elapsed,
            "us_per_call": per_call_us, "stopped_early": stopped,
            "rss_mib": [base["rss"], end["rss"]],
            "device_mib": [base["device"], end["device"]],
            "driver_free_mib": [base["free"], end["free"]],
            "python_calls": python_calls, "correct": correct,
        }
        if not correct:
            failed.append(f"{name}: wrong result")
        if counters1["errors"] != counters0["errors"]:
            failed.append(f"{name}: bridge errors")
        if rss_growth > args.rss_limit_mib:
            failed.append(f"{name}: RSS grew {rss_growth:.1f} MiB")
        if dev_growth is not None and dev_growth > args.device_limit_mib:
            failed.append(f"{name}: device bytes grew {dev_growth:.1f} MiB")
        del program, op, v
        gc.collect()

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"simulator": simulator, "device": str(device),
                       "results": results, "failed": failed}, f, indent=2)
    if failed:
        print("soak FAILED: " + "; ".join(failed), flush=True)
        return 1
    print("soak passed: memory flat after warm-up", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
