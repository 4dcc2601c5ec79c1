"""A process with 4 fake CPU devices, for tests/test_sharding.py.

    python tests/sharding_child.py shardy|gspmd SEED

XLA_FLAGS must be set before JAX starts, hence a process of its own. Runs
every check, and prints one ``RESULT {json}``: per check, whether the
results matched numpy, which collectives the compiled program holds, and the
shapes each func call saw.
"""

import json
import os
import sys
import threading

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=4")
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import numbax  # noqa: E402
from shared_kernels import affine as affine_kernel, row_scale as row_scale_kernel  # noqa: E402

ROWS, COLS = 64, 4
F32 = jnp.float32
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce",
               "reduce-scatter")

seen = []  # (op name, shape of the first input) per func call
seen_lock = threading.Lock()


def make_rows(label):
    def rows(m, s, out, stream):
        with seen_lock:
            seen.append((label, tuple(m.shape)))
        row_scale_kernel[(m.shape[0] + 31) // 32, 32, stream](m, s, out)
    rows.__qualname__ = f"rows_{label}"
    return rows


def affine(x, out, stream):
    with seen_lock:
        seen.append(("affine", tuple(x.shape)))
    affine_kernel[(x.shape[0] + 31) // 32, 32, stream](x, out)


def rows_ref(m, s):
    return m * s[:, None] + np.arange(m.shape[1], dtype=np.float32)


def collectives(compiled_text):
    return sorted({c for c in COLLECTIVES if c in compiled_text})


def run(f, args, want):
    seen.clear()
    compiled = jax.jit(f).lower(*args).compile()
    out = jax.jit(f)(*args)
    out = jax.block_until_ready(out)
    err = float(np.max(np.abs(np.asarray(out) - want)))
    spec = getattr(out.sharding, "spec", None)
    return dict(ok=err < 1e-5, max_err=err, collectives=collectives(
        compiled.as_text()), seen=sorted(set(s for _, s in seen)),
        # jax < 0.9 spells out PartitionSpec(...) where newer ones print P(...).
        calls=len(seen), out_spec=str(spec).replace("PartitionSpec(", "P("),
        shard_rows=sorted({int(s.data.shape[0]) for s in out.addressable_shards}))


def main():
    partitioner, seed = sys.argv[1], int(sys.argv[2])
    jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    rng = np.random.default_rng(seed)
    devices = jax.devices()
    assert len(devices) == 4, devices
    mesh = Mesh(np.array(devices), ("x",))
    mesh2 = Mesh(np.array(devices).reshape(2, 2), ("a", "b"))
    m = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    s = rng.standard_normal(ROWS).astype(np.float32)
    want = rows_ref(m, s)
    out = jax.ShapeDtypeStruct((ROWS, COLS), F32)
    plain = numbax.numba_cuda_callable(make_rows("plain"), out)
    part = numbax.numba_cuda_callable(make_rows("part"), out,
                                      batch_partitionable=True)
    part_cap = numbax.numba_cuda_callable(make_rows("cap"), out, capture=True,
                                          batch_partitionable=True)
    rows_sharded = NamedSharding(mesh, P("x"))
    m_x = jax.device_put(m, rows_sharded)
    s_x = jax.device_put(s, rows_sharded)
    s_rep = jax.device_put(s, NamedSharding(mesh, P()))
    results = {}
    results["gathered"] = run(plain, (m_x, s_x), want)
    results["partitioned"] = run(part, (m_x, s_x), want)
    results["partitioned_capture"] = run(part_cap, (m_x, s_x), want)
    results["partitioned_replicated_operand"] = run(part, (m_x, s_rep), want)
    # Sharded along axis 1 too: XLA must hand func whole rows.
    m_ab = jax.device_put(m, NamedSharding(mesh2, P("a", "b")))
    results["partitioned_2d_mesh"] = run(part, (m_ab, s_x), want)
    # Followed by elementwise work: stays sharded, nothing gathered.
    results["partitioned_chain"] = run(
        lambda a, b: jnp.sin(part(a * 2, b)) + 1, (m_x, s_x),
        np.sin(rows_ref(2 * m, s)) + 1)
    # Rows that do not divide evenly over the devices (XLA pads the shards).
    odd = numbax.numba_cuda_callable(
        make_rows("odd"), jax.ShapeDtypeStruct((10, COLS), F32),
        batch_partitionable=True)
    results["partitioned_uneven"] = run(
        lambda a, b: odd(a[:10], b[:10]), (m_x, s_x), rows_ref(m[:10], s[:10]))

    # shard_map: each device runs func on its own block.
    x = rng.standard_normal(ROWS).astype(np.float32)
    block = jax.ShapeDtypeStruct((ROWS // 4,), F32)
    aff = numbax.numba_cuda_callable(affine, block)
    aff_cap = numbax.numba_cuda_callable(affine, block, capture=True)
    kern = numbax.numba_cuda_kernel(affine_kernel, block, launch_dims=ROWS // 4)
    smap = jax.shard_map(lambda v: kern(aff_cap(aff(v))), mesh=mesh,
                         in_specs=P("x"), out_specs=P("x"))
    results["shard_map"] = run(
        smap, (jax.device_put(x, rows_sharded),),
        2 * (2 * (2 * x + 1) + 1) + 1)
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
