#!/usr/bin/env python3
"""numbax under jax.distributed: two processes on one host, one GPU each.

    python scripts/multiprocess_check.py [--mode both|visible|local]
                                         [--repeats 20] [--timeout 300]
    python scripts/multiprocess_check.py --cpu     # simulator dry run

Starts two worker processes (this file with --worker), a coordinator on
127.0.0.1 at a free port. Each calls

    jax.distributed.initialize("127.0.0.1:PORT", num_processes=2,
                               process_id=i, local_device_ids=[...])

builds a global 1-D mesh over both processes' devices and runs, under
jax.shard_map on global arrays, a plain numba_cuda_callable, a capture=True
one and a numba_cuda_kernel, --repeats times on fresh random data (the same
seed in both processes). Each process checks its own shards against numpy,
and that each func ran on the process's own GPU (the func writes
cuda.get_current_device().id into an output); then a jitted global sum of
the result, which needs both processes, is compared with numpy's.

Modes (default: both, one after the other):
  visible  CUDA_VISIBLE_DEVICES=i per process, local_device_ids=[0]
  local    every GPU visible to both, local_device_ids=[i]: process 1 runs
           on CUDA device 1, so numbax must bind the ordinal XLA gives it.

Prints a PASS/FAIL table and exits non-zero if any process fails, hangs
(--timeout) or exits early. --cpu runs one CPU device per process through
Numba's CUDA simulator (gloo collectives).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["both", "visible", "local", "cpu"],
                   default="both")
    p.add_argument("--repeats", type=int, default=None,
                   help="iterations per process (default 20; 5 with --cpu)")
    p.add_argument("--n", type=int, default=None,
                   help="elements per shard (default 65536; 256 with --cpu)")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds a worker may take, start-up included")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.repeats is None:
        args.repeats = 5 if args.cpu else 20
    if args.n is None:
        args.n = 256 if args.cpu else 1 << 16
    return args


# ---------------------------------------------------------------------------
# Parent

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(args, mode, i):
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS="0")
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.pop("XLA_FLAGS", None)
    if args.cpu:
        env.update(JAX_PLATFORMS="cpu", NUMBA_ENABLE_CUDASIM="1")
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        if mode == "visible":
            env["CUDA_VISIBLE_DEVICES"] = str(i)
    return env


def run_mode(args, mode):
    port, seed = free_port(), int.from_bytes(os.urandom(4), "little")
    procs, logs = [], []
    for i in range(2):
        cmd = [sys.executable, HERE, "--worker", str(i), "--port", str(port),
               "--mode", mode, "--repeats", str(args.repeats),
               "--n", str(args.n), "--seed", str(seed),
               "--timeout", str(args.timeout)] + (["--cpu"] if args.cpu else [])
        log = tempfile.TemporaryFile("w+")  # a file, not a pipe: never blocks
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=worker_env(args, mode, i),
                                      stdout=log, stderr=subprocess.STDOUT,
                                      text=True))
    print(f"== mode {mode}: coordinator 127.0.0.1:{port}, workers "
          f"{[p.pid for p in procs]}", flush=True)
    deadline = time.monotonic() + args.timeout + 30
    notes = ["", ""]
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if any(p.returncode not in (None, 0) for p in procs):
            # One worker failed: the other may wait forever on it.
            deadline = min(deadline, now + 30)
        if now > deadline:
            for i, p in enumerate(procs):  # ours: started above, ended by pid
                if p.poll() is None:
                    p.kill()
                    notes[i] = "\n[killed: no end before the timeout]"
            break
        time.sleep(0.5)
    rows = []
    for i, p in enumerate(procs):
        p.wait()
        logs[i].seek(0)
        text = logs[i].read() + notes[i]
        logs[i].close()
        lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
        result = json.loads(lines[-1][len("RESULT "):]) if lines else None
        ok = p.returncode == 0 and result is not None and result.get("ok")
        if not ok:
            print(f"-- {mode} process {i} (exit {p.returncode}), last output:")
            print("\n".join(text.splitlines()[-40:]))
        rows.append((mode, i, ok, p.returncode, result))
    return rows


def parent(args):
    modes = (["cpu"] if args.cpu else
             ["visible", "local"] if args.mode == "both" else [args.mode])
    rows = []
    for mode in modes:
        rows.extend(run_mode(args, mode))
    print("\n== table")
    for mode, i, ok, code, result in rows:
        if result is None:
            detail = f"no result (exit {code})"
        else:
            ran_on = result.get("ran_on")
            where = ("the simulator" if ran_on == [-1]
                     else f"CUDA device {ran_on}")
            detail = (f"devices {result.get('global_devices')}, ran on "
                      f"{where}, "
                      f"{result.get('iterations')} iterations, global sum "
                      f"{'ok' if result.get('global_sum_ok') else 'WRONG'}")
            if result.get("failures"):
                detail += "; " + "; ".join(result["failures"][:3])
        print(f"{mode:<8} process {i}  {'PASS' if ok else 'FAIL'}  {detail}")
    failed = sum(1 for r in rows if not r[2])
    print(f"\n{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# Worker

cuda = None  # numba.cuda, imported by the worker only (after its env is set)


# Kernel bodies, compiled with cuda.jit in the worker. They live at module
# level: Numba's simulator swaps the module global `cuda` while it runs them.
def _affine(x, out):
    k = cuda.grid(1)
    if k < x.shape[0]:
        out[k] = 2 * x[k] + 1


def _fill(out, value):
    k = cuda.grid(1)
    if k < out.shape[0]:
        out[k] = value


def _square_tag(x, tag_in, out, tag_out):
    k = cuda.grid(1)
    if k < x.shape[0]:
        out[k] = x[k] * x[k] - 3
    if k < tag_out.shape[0]:
        tag_out[k] = tag_in[k]


def worker(args):
    import faulthandler
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    i, sim = args.worker, args.cpu
    import jax
    if sim:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {}
    if not sim:
        kwargs["local_device_ids"] = [0] if args.mode == "visible" else [i]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                               num_processes=2, process_id=i,
                               initialization_timeout=int(args.timeout), **kwargs)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    global cuda  # the kernels below read it as a module global
    from numba import cuda

    import numbax

    affine_kernel = cuda.jit(_affine)
    fill_kernel = cuda.jit(_fill)
    square_tag_kernel = cuda.jit(_square_tag)

    failures = []

    def fail(msg):
        if len(failures) < 8:
            failures.append(msg)
        print(f"[{i}] FAIL {msg}", flush=True)

    local = jax.local_devices()
    devices = jax.devices()
    print(f"[{i}] jax {jax.__version__}: process {jax.process_index()} of "
          f"{jax.process_count()}, local {local}, global {devices}", flush=True)
    if jax.process_count() != 2 or len(devices) != 2 or len(local) != 1:
        fail(f"expected 2 processes with one device each, got "
             f"{jax.process_count()} processes, devices {devices}")

    def hardware_id(d):
        if sim:
            return -1
        hw = getattr(d, "local_hardware_id", None)
        return int(d.id if hw is None else hw)

    def current_device_id():
        return -1 if sim else int(cuda.get_current_device().id)

    def affine_tagged(x, y, dev, stream):
        affine_kernel[(x.shape[0] + 255) // 256, 256, stream](x, y)
        fill_kernel[1, 32, stream](dev, current_device_id())

    n = args.n
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    tag = jax.ShapeDtypeStruct((1,), jnp.int32)
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

    mesh = Mesh(np.array(devices), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")),
                               out_specs=P("x")))
    total = jax.jit(lambda y: jnp.sum(y, dtype=jnp.float32))
    devtag = jax.make_array_from_single_device_arrays(
        (len(devices),), sharding,
        [jax.device_put(np.array([hardware_id(d)], np.int32), d)
         for d in local])
    ran_on, sum_ok, done = set(), True, 0
    t0 = time.monotonic()
    for it in range(args.repeats):
        # The same global data in both processes; each holds its own half.
        x = np.random.default_rng([args.seed, it]).standard_normal(
            len(devices) * n).astype(np.float32)
        xg = jax.make_array_from_callback(x.shape, sharding,
                                          lambda idx, x=x: x[idx])
        outs = fn(xg, devtag)
        w1 = 2 * x + 1
        w2 = 2 * w1 + 1
        w3 = w2 * w2 - 3
        for name, out, want, tagout in zip(("plain", "capture", "kernel"),
                                           outs[:3], (w1, w2, w3), outs[3:]):
            for s, t in zip(out.addressable_shards, tagout.addressable_shards):
                got = np.asarray(s.data)
                if not np.allclose(got, want[s.index], 1e-5, 1e-5):
                    fail(f"iteration {it} {name}: wrong values on {s.device}")
                dev_id = int(np.asarray(t.data)[0])
                ran_on.add(dev_id)
                if dev_id != hardware_id(s.device):
                    fail(f"iteration {it} {name}: shard on {s.device} (CUDA "
                         f"device {hardware_id(s.device)}) ran on {dev_id}")
        # Needs both processes: the global array is coherent.
        got_sum = float(total(outs[2]))
        want_sum = float(np.sum(w3, dtype=np.float64))
        if not np.isclose(got_sum, want_sum, rtol=1e-3):
            sum_ok = False
            fail(f"iteration {it}: global sum {got_sum} != {want_sum}")
        done += 1
    ok = not failures and done == args.repeats and sum_ok
    print(f"[{i}] {done} iterations in {time.monotonic() - t0:.1f}s, ran on "
          f"{sorted(ran_on)}", flush=True)
    print("RESULT " + json.dumps(dict(
        ok=ok, process=i, iterations=done, ran_on=sorted(ran_on),
        global_devices=[str(d) for d in devices], global_sum_ok=sum_ok,
        failures=failures)), flush=True)
    try:
        jax.distributed.shutdown()
    except Exception as exc:  # reported, not fatal: the checks are done
        print(f"[{i}] shutdown: {type(exc).__name__}: {exc}", flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 0 if ok else 1


if __name__ == "__main__":
    ARGS = parse_args()
    sys.exit(worker(ARGS) if ARGS.worker is not None else parent(ARGS))
