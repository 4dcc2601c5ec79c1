"""Run the numbax benchmark suite: python -m benchmarks.run [--quick] [--json PATH] [--only NAMES]

Builds the native reference FFI handler with nvcc, checks every implementation
of op(x) = 2*x + 1 against numpy, times chain / single / bandwidth as
/work/shared/ANCHORS.md describes, writes JSON and prints the table last.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "results.json")
NAMES = ["native", "native_cmdbuf", "numbax_kernel", "numbax_callable",
         "numbax_capture", "buffer_callback", "buffer_callback_cmdbuf",
         "pure_callback"]
BASELINES = ["native", "native_cmdbuf"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="fewer repeats and a 64 MiB bandwidth array (smoke runs)")
    p.add_argument("--json", default=DEFAULT_JSON, metavar="PATH",
                   help="where to write the results (default: %(default)s)")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated implementations to run, of: "
                   + ", ".join(NAMES) + " (the native baselines always run: "
                   "the ratios need them)")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="skip the bandwidth benchmark")
    p.add_argument("--build-dir", default=None,
                   help="where nvcc writes the native library (default: a new temp dir)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the check inputs (default: random, recorded in the JSON)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="no GPU: JAX on CPU with Numba's CUDA simulator, a handful "
                   "of iterations; GPU-only rows report 'skipped (no GPU)'")
    args = p.parse_args(argv)
    if args.only is not None:
        wanted = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in NAMES]
        if unknown:
            p.error(f"--only: unknown implementation(s) {unknown}; known: {NAMES}")
        args.only = BASELINES + [s for s in wanted if s not in BASELINES]
    return args


def _log(msg: str) -> None:
    print(msg, flush=True)


def _failed(row: dict, phase: str, exc: BaseException) -> None:
    row["status"] = f"FAILED ({phase})"
    row.setdefault("errors", {})[phase] = f"{type(exc).__name__}: {exc}"
    _log(f"[{row['name']}] {phase} FAILED:")
    traceback.print_exc()
    sys.stderr.flush()


def run_impl(impl, cfg, rng, x, bw_x, timing, Unavailable) -> dict:
    """Check and time one implementation; never raises."""
    row = {"name": impl.name, "label": impl.label, "compare_to": impl.compare_to,
           "status": "ok", "chain": None, "single": None, "bandwidth": None}
    try:
        op = impl.make(cfg.n)
    except Unavailable as u:
        row["status"] = "skipped (no GPU)" if u.status == "skipped" else u.status
        row["note"] = u.reason
        _log(f"[{impl.name}] {row['status']}: {u.reason}")
        return row
    except Exception as exc:  # noqa: BLE001
        _failed(row, "build", exc)
        return row

    chain = timing.chain_fn(op, cfg.chain_length)
    try:
        timing.check(op, chain, cfg.n, cfg.chain_length, rng)
        _log(f"[{impl.name}] output matches numpy (single and chain of "
             f"{cfg.chain_length})")
    except Exception as exc:  # noqa: BLE001
        _failed(row, "check", exc)
        return row

    for phase, measure, arg in (("chain", timing.time_chain, chain),
                                ("single", timing.time_single, op)):
        try:
            row[phase] = measure(arg, x, cfg)
            _log(f"[{impl.name}] {phase}: {row[phase]['us_per_call']:.2f} us/call")
        except Exception as exc:  # noqa: BLE001
            _failed(row, phase, exc)

    if impl.bandwidth and bw_x is not None and row["status"] == "ok":
        try:
            bw_op = impl.make(cfg.bw_n)
            timing.check_on_device(bw_op, bw_x)
            row["bandwidth"] = timing.time_bandwidth(bw_op, bw_x, cfg)
            _log(f"[{impl.name}] bandwidth: {row['bandwidth']['gb_per_s']:.1f} GB/s")
        except Exception as exc:  # noqa: BLE001
            _failed(row, "bandwidth", exc)
        finally:
            gc.collect()
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        if "numba" in sys.modules or "jax" in sys.modules:
            raise SystemExit("--cpu-smoke must be set before numba/jax are imported")
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

    import jax
    import numpy as np

    from . import impls, report, timing
    from .native import build_and_register

    if args.cpu_smoke:
        cfg = timing.Config.cpu_smoke()
    elif args.quick:
        cfg = timing.Config.quick()
    else:
        cfg = timing.Config()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)

    device = jax.devices()[0]
    on_gpu = device.platform == "gpu"
    env = impls.Env(on_gpu=on_gpu)
    _log(f"device: {getattr(device, 'device_kind', device)} ({device.platform}); "
         f"config: {cfg}")

    if on_gpu:
        try:
            cc = getattr(device, "compute_capability", None)
            t0 = time.perf_counter()
            env.native = build_and_register(cc, args.build_dir)
            _log(f"native: built {env.native.library} in "
                 f"{time.perf_counter() - t0:.1f} s ({' '.join(env.native.command)})")
        except Exception as exc:  # noqa: BLE001
            env.native_error = f"{type(exc).__name__}: {exc}"
            _log("native: build FAILED:")
            traceback.print_exc()
    if on_gpu:
        try:
            impls.warm_numba_kernel(env)
        except Exception:  # noqa: BLE001 - the rows using it will report it
            _log("numba kernel warm-up FAILED:")
            traceback.print_exc()

    x = jax.device_put(rng.uniform(-1, 1, cfg.n).astype(np.float32))
    bw_x = None
    if not args.no_bandwidth:
        bw_x = jax.random.uniform(jax.random.key(seed), (cfg.bw_n,), np.float32,
                                  -1.0, 1.0)
        bw_x.block_until_ready()

    rows = []
    for impl in impls.all_impls(env):
        if args.only is not None and impl.name not in args.only:
            continue
        rows.append(run_impl(impl, cfg, rng, x, bw_x, timing, impls.Unavailable))
    del bw_x
    report.add_ratios(rows)

    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "seed": seed,
        "config": vars(cfg),
        "environment": report.environment(device, env.native),
        "native_build_error": env.native_error,
        "results": rows,
    }
    try:
        report.write_json(args.json, record)
        _log(f"wrote {args.json}")
    except Exception:  # noqa: BLE001 - still print the table
        _log(f"could not write {args.json}:")
        traceback.print_exc()

    env_info = record["environment"]
    v = env_info["versions"]
    print()
    print(f"{env_info['device']} | jax {v['jax']} jaxlib {v['jaxlib']} | numba "
          f"{v['numba']} numba-cuda {v['numba-cuda']} | n={cfg.n}, chain of "
          f"{cfg.chain_length}, bandwidth over {cfg.bw_n * 4 / 2**20:g} MiB")
    print(report.format_table(rows), flush=True)
    return 0 if all(not r["status"].startswith("FAILED") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
