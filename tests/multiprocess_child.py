"""One of the two processes of tests/test_multiprocess.py.

    python tests/multiprocess_child.py PROCESS PORT MODE SEED REPEATS N TIMEOUT

Joins jax.distributed (coordinator 127.0.0.1:PORT, 2 processes), builds a
global 1-D mesh over both processes' devices and runs, under jax.shard_map
on global arrays, a plain numba_cuda_callable, a capture=True one and a
numba_cuda_kernel REPEATS times on fresh random data (SEED: the same data in
both processes, N elements per shard). It checks its own shards against
numpy, that each func ran on the process's own GPU (the func writes TAG +
cuda.get_current_device().id into an output), and a jitted global sum of
the result, which needs both processes. Prints one ``RESULT {json}``.

MODE: `visible` (the parent set CUDA_VISIBLE_DEVICES=PROCESS;
local_device_ids=[0]) or `local` (every GPU visible; local_device_ids=
[PROCESS], so numbax must bind the ordinal XLA gives it). Under the
simulator (NUMBA_ENABLE_CUDASIM=1) each process has one CPU device and the
collectives go through gloo.
"""

import faulthandler
import json
import os
import sys
import time

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def main(i, port, mode, seed, repeats, n, timeout):
    faulthandler.dump_traceback_later(timeout, exit=True)
    import jax
    if SIM:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {}
    if not SIM:
        kwargs["local_device_ids"] = [0] if mode == "visible" else [i]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=2, process_id=i,
                               initialization_timeout=int(timeout), **kwargs)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    # The ops (tests/tagged_ops.py, beside this file) import Numba: only now.
    from tagged_ops import TAG, hardware_id, tagged_ops

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

    body = tagged_ops(n)

    mesh = Mesh(np.array(devices), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")),
                               out_specs=P("x")))
    total = jax.jit(lambda y: jnp.sum(y, dtype=jnp.float32))
    devtag = jax.make_array_from_single_device_arrays(
        (len(devices),), sharding,
        [jax.device_put(np.array([TAG + hardware_id(d)], np.int32), d)
         for d in local])
    ran_on, sum_ok, done = set(), True, 0
    t0 = time.monotonic()
    for it in range(repeats):
        # The same global data in both processes; each holds its own half.
        x = np.random.default_rng([seed, it]).standard_normal(
            len(devices) * n).astype(np.float32)
        xg = jax.make_array_from_callback(x.shape, sharding,
                                          lambda idx, x=x: x[idx])
        ys, tags = fn(xg, devtag)
        w1 = 2 * x + 1
        w2 = 2 * w1 + 1
        w3 = w2 * w2 - 3
        for name, out, want, tagout in zip(("plain", "capture", "kernel"),
                                           ys, (w1, w2, w3), tags):
            for s, t in zip(out.addressable_shards, tagout.addressable_shards):
                got = np.asarray(s.data)
                if not np.allclose(got, want[s.index], 1e-5, 1e-5):
                    fail(f"iteration {it} {name}: wrong values on {s.device}")
                dev_id = int(np.asarray(t.data)[0]) - TAG
                ran_on.add(dev_id)
                if dev_id != hardware_id(s.device):
                    fail(f"iteration {it} {name}: shard on {s.device} (CUDA "
                         f"device {hardware_id(s.device)}) ran on {dev_id}")
        # Needs both processes: the global array is coherent.
        got_sum = float(total(ys[2]))
        want_sum = float(np.sum(w3, dtype=np.float64))
        if not np.isclose(got_sum, want_sum, rtol=1e-3):
            sum_ok = False
            fail(f"iteration {it}: global sum {got_sum} != {want_sum}")
        done += 1
    ok = not failures and done == repeats and sum_ok
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
    a = sys.argv[1:]
    sys.exit(main(int(a[0]), int(a[1]), a[2], int(a[3]), int(a[4]), int(a[5]),
                  float(a[6])))
