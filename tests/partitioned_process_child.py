"""One of the two processes of tests/test_scale_out.py's jax.distributed test.

    python tests/partitioned_process_child.py PROCESS PORT SEED TIMEOUT

Joins jax.distributed (coordinator 127.0.0.1:PORT, 2 processes), builds a
global 1-D mesh over both processes' devices and, with no shard_map, runs
under plain jax.jit on global arrays sharded along their rows: a
numba_cuda_kernel with a sharding rule (a matrix-vector product, the vector
whole on each device), a numba_cuda_callable with batch_partitionable=True,
and jax.vmap of a kernel without a rule. Checks its own shards against
numpy, that the compiled programs hold no collective, and a jitted global
sum that needs both processes. Prints one ``RESULT {json}``. Under the
simulator (NUMBA_ENABLE_CUDASIM=1) each process has one CPU device and the
collectives go through gloo; on GPUs (CUDA_VISIBLE_DEVICES=PROCESS) one GPU.
"""

import faulthandler
import json
import os
import sys

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce",
               "reduce-scatter")


def main(i, port, seed, timeout):
    faulthandler.dump_traceback_later(timeout, exit=True)
    import jax
    if SIM:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=2, process_id=i,
                               initialization_timeout=int(timeout))
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import numbax
    # Kernels of a module of their own: the simulator runs a kernel with
    # its module's globals swapped, which a closure's `cuda` escapes.
    from shared_kernels import affine, matvec, row_scale

    def rows_func(x, s, out, stream):
        row_scale[(x.shape[0] + 31) // 32, 32, stream](x, s, out)

    devices = jax.devices()
    failures = []
    if jax.process_count() != 2 or len(devices) != 2:
        failures.append(f"expected 2 processes of one device each, got "
                        f"{jax.process_count()} processes, devices {devices}")
    n, cols = 16, 5
    mesh = Mesh(np.array(devices), ("x",))
    rows = NamedSharding(mesh, P("x"))
    whole = NamedSharding(mesh, P())
    rng = np.random.default_rng(seed)  # the same data in both processes
    m = rng.standard_normal((n, cols)).astype(np.float32)
    v = rng.standard_normal(cols).astype(np.float32)
    xb = rng.standard_normal((n, 7)).astype(np.float32)
    sb = rng.standard_normal(n).astype(np.float32)

    def global_array(value, sharding):
        return jax.make_array_from_callback(value.shape, sharding,
                                            lambda idx: value[idx])

    f32 = jnp.float32
    k_mv = numbax.numba_cuda_kernel(
        matvec, jax.ShapeDtypeStruct((n,), f32), launch_dims=n,
        sharding_rule="i j, j -> i")
    c_rows = numbax.numba_cuda_callable(
        rows_func, jax.ShapeDtypeStruct((n, 7), f32), batch_partitionable=True)
    k_aff = numbax.numba_cuda_kernel(affine, jax.ShapeDtypeStruct((7,), f32),
                                     launch_dims=7)
    checks = {
        "kernel_rule": (k_mv, (global_array(m, rows), global_array(v, whole)),
                        m @ v),
        "callable_batch_partitionable": (
            c_rows, (global_array(xb, rows), global_array(sb, rows)),
            xb * sb[:, None] + np.arange(7, dtype=np.float32)),
        "vmap_kernel": (jax.vmap(k_aff), (global_array(xb, rows),),
                        2 * xb + 1),
    }
    collectives, shard_rows = {}, {}
    total = jax.jit(lambda y: jnp.sum(y, dtype=jnp.float32))
    sum_ok = True
    for name, (f, args, want) in checks.items():
        text = jax.jit(f).lower(*args).compile().as_text()
        collectives[name] = sorted(c for c in COLLECTIVES if c in text)
        out = jax.jit(f)(*args)
        shard_rows[name] = sorted({int(s.data.shape[0])
                                   for s in out.addressable_shards})
        for s in out.addressable_shards:
            if not np.allclose(np.asarray(s.data), want[s.index], 1e-5, 1e-5):
                failures.append(f"{name}: wrong values on {s.device}")
        got = float(total(out))
        if not np.isclose(got, float(np.sum(want, dtype=np.float64)),
                          rtol=1e-3, atol=1e-3):
            sum_ok = False
            failures.append(f"{name}: global sum {got}")
    print("RESULT " + json.dumps(dict(
        ok=not failures and sum_ok, process=i, failures=failures,
        collectives=collectives, shard_rows=shard_rows,
        global_devices=[str(d) for d in devices])), flush=True)
    try:
        jax.distributed.shutdown()
    except Exception as exc:  # reported, not fatal: the checks are done
        print(f"[{i}] shutdown: {type(exc).__name__}: {exc}", flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 0 if not failures else 1


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(main(int(a[0]), int(a[1]), int(a[2]), float(a[3])))
