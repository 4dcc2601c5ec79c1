#!/usr/bin/env python3
"""numbax on every local GPU of one host: shard_map, sharded jit, threads.

    python scripts/multigpu_check.py [--repeats 200] [--threads 8]
    python scripts/multigpu_check.py --cpu [--devices 2]   # simulator dry run

Checks, each against numpy on fresh random data, shard by shard:

  shard_map/*      a plain numba_cuda_callable, a capture=True one and a
                   numba_cuda_kernel under jax.shard_map over all local
                   devices, --repeats times. Each callable's func also writes
                   the id of the CUDA device it runs on into an output
                   (cuda.get_current_device().id), which must be the device
                   XLA put the shard on, distinct per shard; the kernel copies
                   a per-device input holding that device's id.
  sharded_jit/*    jax.jit with inputs sharded along axis 0 and no shard_map:
                   without the declaration (XLA gathers; correct result), and
                   with batch_partitionable=True (no all-gather in the
                   compiled program, each device's func sees its own rows and
                   reports its own device id), plain and capture.
  threads/*        --threads Python threads at once, each bound to one local
                   device in turn, calling jitted plain, capture and kernel
                   ops; and two funcs that sleep on two devices must overlap
                   in time (numbax holds no lock across calls, and the GIL is
                   free while a func sleeps).

Prints a PASS/FAIL table and exits non-zero if any check failed; a hang is
ended by a watchdog (--timeout seconds) that prints every thread's stack.
Run it on a machine with 2 or more GPUs after building numbax there (see
docs/multi_gpu.md). --cpu runs the same code on fake CPU devices through
Numba's CUDA simulator, where device ids are not real and funcs run one at a
time, so those two checks are skipped.
"""

import argparse
import faulthandler
import os
import sys
import threading
import time
import traceback


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=None,
                   help="shard_map iterations (default 200; 10 with --cpu)")
    p.add_argument("--jit-repeats", type=int, default=None,
                   help="sharded-jit iterations (default 50; 5 with --cpu)")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--thread-iterations", type=int, default=None,
                   help="calls per thread (default 50; 5 with --cpu)")
    p.add_argument("--n", type=int, default=1 << 16,
                   help="elements per shard (default 65536; 256 with --cpu)")
    p.add_argument("--timeout", type=float, default=540,
                   help="watchdog for the whole run, seconds")
    p.add_argument("--cpu", action="store_true",
                   help="fake CPU devices and Numba's CUDA simulator")
    p.add_argument("--devices", type=int, default=2,
                   help="fake CPU devices with --cpu (default 2)")
    args = p.parse_args()
    cpu = args.cpu
    if args.repeats is None:
        args.repeats = 10 if cpu else 200
    if args.jit_repeats is None:
        args.jit_repeats = 5 if cpu else 50
    if args.thread_iterations is None:
        args.thread_iterations = 5 if cpu else 50
    if cpu and args.n == 1 << 16:
        args.n = 256
    return args


ARGS = parse_args()
if ARGS.cpu:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") +
        f" --xla_force_host_platform_device_count={ARGS.devices}")
else:
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

faulthandler.dump_traceback_later(ARGS.timeout, exit=True)

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from numba import cuda

    import numbax
except Exception:  # say what is missing, plainly
    traceback.print_exc()
    print("FAIL: cannot import jax, numba or numbax; build numbax first "
          "(docs/multi_gpu.md)")
    sys.exit(2)

F32, I32 = jnp.float32, jnp.int32
SIM = ARGS.cpu
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce",
               "reduce-scatter")


# ---------------------------------------------------------------------------
# Kernels and funcs

@cuda.jit
def affine_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = 2 * x[i] + 1


@cuda.jit
def fill_kernel(out, value):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = value


@cuda.jit
def square_tag_kernel(x, tag_in, out, tag_out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * x[i] - 3
    if i < tag_out.shape[0]:
        tag_out[i] = tag_in[i]


@cuda.jit
def rows_kernel(m, s, out):
    i = cuda.grid(1)
    if i < m.shape[0]:
        for j in range(m.shape[1]):
            out[i, j] = m[i, j] * s[i] + j


def blocks(n, threads=256):
    return max(1, (n + threads - 1) // threads)


def current_device_id():
    """The CUDA device of the context numbax made current (-1: simulator)."""
    return -1 if SIM else int(cuda.get_current_device().id)


calls_lock = threading.Lock()
calls = []  # (label, device id, first input's shape)


def record(label, shape):
    with calls_lock:
        calls.append((label, current_device_id(), tuple(shape)))


def affine_tagged(x, y, dev, stream):
    """y = 2x + 1, and dev[:] = the id of the device this call runs on."""
    if not SIM:
        record("affine", x.shape)
    affine_kernel[blocks(x.shape[0]), 256, stream](x, y)
    fill_kernel[blocks(dev.shape[0]), 256, stream](dev, current_device_id())


def rows_tagged(m, s, out, dev, stream):
    """out = m * s[:, None] + column; dev[i] = device id, for every row."""
    record("rows", m.shape)
    rows_kernel[blocks(m.shape[0]), 256, stream](m, s, out)
    fill_kernel[blocks(dev.shape[0]), 256, stream](dev, current_device_id())


def hardware_id(device):
    if SIM:
        return -1
    hw = getattr(device, "local_hardware_id", None)
    return int(device.id if hw is None else hw)


# ---------------------------------------------------------------------------
# Bookkeeping

class Check:
    def __init__(self, name):
        self.name, self.failures, self.detail, self.skipped = name, [], "", None
        self.t0 = time.monotonic()

    def fail(self, message):
        if len(self.failures) < 5:
            self.failures.append(message)
        else:
            self.failures[-1] = f"... and more (last: {message})"

    def expect_close(self, what, got, want, rtol=1e-5, atol=1e-5):
        got = np.asarray(got)
        if got.shape != np.shape(want) or not np.allclose(got, want, rtol, atol):
            err = (float(np.max(np.abs(got - want)))
                   if got.shape == np.shape(want) else "shape")
            self.fail(f"{what}: wrong values (max err {err})")
            return False
        return True

    def expect(self, cond, message):
        if not cond:
            self.fail(message)
        return cond


CHECKS = []


def check(name):
    def wrap(fn):
        def run(*a, **k):
            c = Check(name)
            CHECKS.append(c)
            print(f"-- {name}", flush=True)
            try:
                fn(c, *a, **k)
            except Exception as exc:
                c.fail(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
                traceback.print_exc()
            c.seconds = time.monotonic() - c.t0
            status = ("SKIP" if c.skipped else "FAIL" if c.failures else "PASS")
            print(f"   {status} {c.detail} {c.skipped or ''} "
                  f"{'; '.join(c.failures)}", flush=True)
        return run
    return wrap


def shard_values(array):
    """[(device, index, numpy value)] of every addressable shard."""
    return [(s.device, s.index, np.asarray(s.data))
            for s in array.addressable_shards]


# ---------------------------------------------------------------------------
# shard_map

def build_shard_map(mesh, n):
    spec = jax.ShapeDtypeStruct((n,), F32)
    tag = jax.ShapeDtypeStruct((1,), I32)
    plain = numbax.numba_cuda_callable(affine_tagged, (spec, tag))
    captured = numbax.numba_cuda_callable(affine_tagged, (spec, tag),
                                          capture=True)
    kernel = numbax.numba_cuda_kernel(square_tag_kernel, (spec, tag),
                                      launch_dims=n)

    def body(x, devtag):
        y1, d1 = plain(x)
        y2, d2 = captured(y1)
        y3, d3 = kernel(y2, devtag)
        return y1, y2, y3, d1, d2, d3
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")),
                                 out_specs=P("x")))


def run_shard_map(devices):
    mesh = Mesh(np.array(devices), ("x",))
    ndev, n = len(devices), ARGS.n
    fn = build_shard_map(mesh, n)
    sharding = NamedSharding(mesh, P("x"))
    ids = np.array([hardware_id(d) for d in devices], np.int32)
    devtag = jax.device_put(ids, sharding)
    rng = np.random.default_rng()
    names = ("plain", "capture", "kernel")
    checks = {k: Check(f"shard_map/{k}") for k in names}
    for c in checks.values():
        CHECKS.append(c)
    print(f"-- shard_map over {ndev} devices, {ARGS.repeats} iterations, "
          f"{n} elements per shard", flush=True)
    seen_ids = {k: set() for k in names}
    try:
        for it in range(ARGS.repeats):
            x = rng.standard_normal(ndev * n).astype(np.float32)
            want1 = 2 * x + 1
            want2 = 2 * want1 + 1
            want3 = want2 * want2 - 3
            outs = fn(jax.device_put(x, sharding), devtag)
            for k, out, want, tag in zip(names, outs[:3], (want1, want2, want3),
                                         outs[3:]):
                c = checks[k]
                for (dev, idx, val), (tdev, _, tval) in zip(
                        shard_values(out), shard_values(tag)):
                    c.expect_close(f"iteration {it} shard on {dev}", val,
                                   want[idx])
                    c.expect(dev == tdev, f"tag shard on {tdev}, data on {dev}")
                    c.expect(int(tval[0]) == hardware_id(dev),
                             f"iteration {it}: shard on {dev} (CUDA device "
                             f"{hardware_id(dev)}) ran on device {int(tval[0])}")
                    seen_ids[k].add(int(tval[0]))
    except Exception as exc:
        traceback.print_exc()
        for c in checks.values():
            c.fail(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    for k, c in checks.items():
        c.seconds = time.monotonic() - c.t0
        if not SIM:
            c.expect(seen_ids[k] == set(ids.tolist()) and len(ids) == ndev
                     and len(set(ids.tolist())) == ndev,
                     f"devices seen {sorted(seen_ids[k])}, expected "
                     f"{sorted(ids.tolist())}, one per shard")
            c.detail = (f"{ARGS.repeats} iterations, devices "
                        f"{sorted(seen_ids[k])}")
        else:
            c.detail = f"{ARGS.repeats} iterations (device ids: GPU only)"
        print(f"   {c.name}: {'FAIL' if c.failures else 'PASS'} {c.detail} "
              f"{'; '.join(c.failures)}", flush=True)


# ---------------------------------------------------------------------------
# jax.jit with sharded inputs, no shard_map

def run_sharded_jit(devices):
    mesh = Mesh(np.array(devices), ("x",))
    ndev = len(devices)
    rows, cols = 256 * ndev, 8
    specs = (jax.ShapeDtypeStruct((rows, cols), F32),
             jax.ShapeDtypeStruct((rows,), I32))
    variants = {
        "gathered": numbax.numba_cuda_callable(rows_tagged, specs),
        "partitioned": numbax.numba_cuda_callable(
            rows_tagged, specs, batch_partitionable=True),
        "partitioned_capture": numbax.numba_cuda_callable(
            rows_tagged, specs, batch_partitionable=True, capture=True),
    }
    sharding = NamedSharding(mesh, P("x"))
    rng = np.random.default_rng()
    for name, op in variants.items():
        _sharded_jit_variant(name, op, sharding, rows, cols, ndev, rng)


def _sharded_jit_variant(name, op, sharding, rows, cols, ndev, rng):
    @check(f"sharded_jit/{name}")
    def body(c):
        fn = jax.jit(op)
        m0 = jax.device_put(np.zeros((rows, cols), np.float32), sharding)
        s0 = jax.device_put(np.zeros(rows, np.float32), sharding)
        text = fn.lower(m0, s0).compile().as_text()
        found = sorted({k for k in COLLECTIVES if k in text})
        partitioned = name != "gathered"
        if partitioned:
            c.expect(not found, f"collectives in the compiled program: {found}")
        for it in range(ARGS.jit_repeats):
            m = rng.standard_normal((rows, cols)).astype(np.float32)
            s = rng.standard_normal(rows).astype(np.float32)
            with calls_lock:
                calls.clear()
            out, dev = fn(jax.device_put(m, sharding),
                          jax.device_put(s, sharding))
            want = m * s[:, None] + np.arange(cols, dtype=np.float32)
            c.expect_close(f"iteration {it}", np.asarray(out), want)
            if partitioned:
                for d, idx, val in shard_values(dev):
                    c.expect(np.all(val == hardware_id(d)),
                             f"iteration {it}: rows {idx[0]} on {d} ran on "
                             f"devices {sorted(set(val.tolist()))}")
                c.expect(str(out.sharding.spec) in ("P('x',)", "P('x')"),
                         f"result sharded as {out.sharding.spec}")
            with calls_lock:
                shapes = sorted({s for label, _, s in calls})
            if partitioned and "capture" not in name:
                c.expect(shapes == [(rows // ndev, cols)],
                         f"func saw shapes {shapes}, expected its own "
                         f"{rows // ndev} rows")
        c.detail = (f"{ARGS.jit_repeats} iterations, collectives "
                    f"{found or 'none'}")
    body()


# ---------------------------------------------------------------------------
# Threads

def run_threads(devices):
    @check("threads/several_devices")
    def many(c):
        n = ARGS.n
        spec = jax.ShapeDtypeStruct((n,), F32)
        tag = jax.ShapeDtypeStruct((1,), I32)
        plain = numbax.numba_cuda_callable(affine_tagged, (spec, tag))
        captured = numbax.numba_cuda_callable(affine_tagged, (spec, tag),
                                              capture=True)
        kernel = numbax.numba_cuda_kernel(square_tag_kernel, (spec, tag),
                                          launch_dims=n)

        @jax.jit
        def program(x, devtag):
            y1, d1 = plain(x)
            y2, d2 = captured(y1)
            y3, d3 = kernel(y2, devtag)
            return y1, y2, y3, d1, d2, d3

        errors, done = [], {}
        barrier = threading.Barrier(ARGS.threads)

        def worker(t):
            device = devices[t % len(devices)]
            rng = np.random.default_rng()
            devtag = jax.device_put(np.array([hardware_id(device)], np.int32),
                                    device)
            try:
                barrier.wait(60)
                for it in range(ARGS.thread_iterations):
                    x = rng.standard_normal(n).astype(np.float32)
                    y1, y2, y3, d1, d2, d3 = program(
                        jax.device_put(x, device), devtag)
                    w1 = 2 * x + 1
                    w2 = 2 * w1 + 1
                    for what, got, want in (("plain", y1, w1),
                                            ("capture", y2, w2),
                                            ("kernel", y3, w2 * w2 - 3)):
                        if not np.allclose(np.asarray(got), want, 1e-5, 1e-5):
                            errors.append(f"thread {t} it {it}: {what} wrong")
                    for what, d in (("plain", d1), ("capture", d2),
                                    ("kernel", d3)):
                        if int(np.asarray(d)[0]) != hardware_id(device):
                            errors.append(
                                f"thread {t} it {it}: {what} ran on device "
                                f"{int(np.asarray(d)[0])}, not "
                                f"{hardware_id(device)}")
                    if y1.devices() != {device}:
                        errors.append(f"thread {t}: result on {y1.devices()}")
                done[t] = ARGS.thread_iterations
            except Exception as exc:
                errors.append(f"thread {t}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]}")

        threads = [threading.Thread(target=worker, args=(t,), daemon=True)
                   for t in range(ARGS.threads)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + max(60.0, ARGS.timeout / 3)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        c.expect(not hung, f"deadlock? threads still running: {hung}")
        for e in errors[:5]:
            c.fail(e)
        c.expect(len(done) == ARGS.threads, f"{len(done)} of {ARGS.threads} "
                 "threads finished")
        c.detail = (f"{ARGS.threads} threads x {ARGS.thread_iterations} calls "
                    f"over {len(devices)} devices")
    many()

    @check("threads/funcs_overlap")
    def overlap(c):
        if SIM:
            c.skipped = "(the simulator runs one func at a time)"
            return
        spans = {}

        def sleepy(x, y, stream):
            t0 = time.monotonic()
            time.sleep(0.3)  # releases the GIL
            affine_kernel[blocks(x.shape[0]), 256, stream](x, y)
            spans.setdefault(current_device_id(), []).append(
                (t0, time.monotonic()))
        op = jax.jit(numbax.numba_cuda_callable(
            sleepy, jax.ShapeDtypeStruct((1024,), F32)))
        pair = devices[:2] if len(devices) >= 2 else devices * 2
        xs = [jax.device_put(np.ones(1024, np.float32), d) for d in pair]
        for x in xs:  # compile and warm up on each device
            op(x).block_until_ready()
        spans.clear()
        barrier = threading.Barrier(2)
        outs = [None, None]

        def go(i):
            barrier.wait(30)
            outs[i] = np.asarray(op(xs[i]))
        ts = [threading.Thread(target=go, args=(i,), daemon=True)
              for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        c.expect(all(o is not None and np.allclose(o, 3.0) for o in outs),
                 "wrong results")
        allspans = sorted(s for v in spans.values() for s in v)
        c.expect(len(allspans) == 2, f"expected 2 func calls, saw {allspans}")
        if len(allspans) == 2:
            (a0, a1), (b0, b1) = allspans
            c.expect(b0 < a1, f"the funcs ran one after the other "
                     f"({a1 - a0:.2f}s then {b1 - b0:.2f}s): serialised")
            c.detail = (f"devices {sorted(spans)}; overlap "
                        f"{max(0.0, a1 - b0):.2f}s of 0.30s")
    overlap()


# ---------------------------------------------------------------------------

def main():
    import importlib.metadata as md
    devices = jax.local_devices()
    print(f"jax {jax.__version__}, numba-cuda {md.version('numba-cuda')}, "
          f"numbax {numbax.__version__}, python {sys.version.split()[0]}")
    print(f"devices: {devices}")
    if SIM:
        print("mode: --cpu (fake CPU devices, Numba's CUDA simulator)")
    else:
        hw = [hardware_id(d) for d in devices]
        print(f"mode: GPU; CUDA device ids {hw}; numba sees "
              f"{len(cuda.gpus)} GPUs")
        if devices[0].platform != "gpu" and devices[0].platform != "cuda":
            print("FAIL: JAX found no GPU (use --cpu for a dry run)")
            return 2
    if len(devices) < 2:
        print("WARNING: fewer than 2 local devices: the multi-device checks "
              "prove little")
    run_shard_map(devices)
    run_sharded_jit(devices)
    run_threads(devices)

    print("\n== table")
    width = max(len(c.name) for c in CHECKS)
    for c in CHECKS:
        status = "SKIP" if c.skipped else "FAIL" if c.failures else "PASS"
        extra = c.skipped or ("; ".join(c.failures) if c.failures else c.detail)
        print(f"{c.name:<{width}}  {status}  {getattr(c, 'seconds', 0):6.1f}s  "
              f"{extra}")
    failed = [c.name for c in CHECKS if c.failures]
    passed = sum(1 for c in CHECKS if not c.failures and not c.skipped)
    print(f"\n{passed} passed, {len(failed)} failed"
          + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    sys.exit(code)
