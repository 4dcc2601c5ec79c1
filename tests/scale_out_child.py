"""A process with 8 fake CPU devices, for tests/test_scale_out.py.

    python tests/scale_out_child.py shardy|gspmd SEED

Every op kind (numba_cuda_kernel, numba_cuda_callable, XLACustomKernel)
with a sharding rule or batch_partitionable=True, and jax.vmap of ops
without one, under plain jax.jit over inputs sharded along the declared
axes. Prints one ``RESULT {json}``: per check, whether the results matched
numpy, which collectives the compiled program holds (all of it, and those
upstream of numbax's custom calls: what XLA gathers into them), the
shapes each call saw, the grid a kernel was launched with, and the
sharding of the result.
"""

import json
import os
import re
import sys
import threading

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from numba import cuda  # noqa: E402

import numbax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shared_kernels import affine  # noqa: E402

F32 = jnp.float32
N, J, T, D = 64, 5, 12, 3
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce",
               "reduce-scatter")

seen = []  # (label, shape of the first array) per func call
seen_lock = threading.Lock()


def note(label, shape):
    with seen_lock:
        seen.append((label, tuple(int(d) for d in shape)))


# -- kernels: each records the grid it was launched with ----------------------

@cuda.jit
def scale_rows(x, out, grid):
    """out = 2 * x, one thread per element; grid[i] = blocks launched."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = 2 * x[i]
        grid[i] = cuda.gridDim.x


@cuda.jit
def scale_rows_by(x, k, out, grid):
    """out = k * x with k passed by value (a scalar among the buffers)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = k * x[i]
        grid[i] = cuda.gridDim.x


@cuda.jit
def matvec(m, v, out, grid):
    """out = m @ v, one thread per row."""
    i = cuda.grid(1)
    if i < m.shape[0]:
        acc = 0.0
        for j in range(m.shape[1]):
            acc += m[i, j] * v[j]
        out[i] = acc
        grid[i] = cuda.gridDim.x


@cuda.jit
def gather_rows(idx, table, out):
    """out[i] = table[idx[i]], one thread per row (a lookup table every row
    reads; padding rows of uneven shards may hold any index)."""
    i = cuda.grid(1)
    if i < idx.shape[0]:
        k = idx[i]
        if 0 <= k < table.shape[0]:
            for d in range(table.shape[1]):
                out[i, d] = table[k, d]


@cuda.jit
def affine_z(x, out):
    """Reads blockIdx.z: a vmap of it launches one slice at a time."""
    i = cuda.grid(1)
    if i < x.shape[0] and cuda.blockIdx.z == 0:
        out[i] = 2 * x[i] + 1


@cuda.jit
def copy_1d(x, out):
    """out = x."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i]


# -- helpers -------------------------------------------------------------------

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%(\S+) = .*? ([a-z][\w\-]*)\((.*)$")


def upstream_collectives(text):
    """Collectives the numbax custom calls of a compiled program read from,
    directly or through other instructions (what XLA gathered into them)."""
    defs = {}
    calls = []
    for line in text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        name, opcode, rest = m.groups()
        operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
        defs[name] = (opcode, operands)
        if opcode == "custom-call" and "numbax_" in line:
            calls.append(name)
    found, stack, visited = set(), list(calls), set()
    while stack:
        name = stack.pop()
        if name in visited or name not in defs:
            continue
        visited.add(name)
        opcode, operands = defs[name]
        if opcode.removesuffix("-start") in COLLECTIVES:
            found.add(opcode)
        stack.extend(operands)
    return sorted(found), len(calls)


def run(f, args, want, *, grid_out=None):
    """Compiles and runs jit(f) on `args`; compares output 0 with `want`."""
    seen.clear()
    compiled = jax.jit(f).lower(*args).compile()
    text = compiled.as_text()
    out = jax.block_until_ready(jax.jit(f)(*args))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    got = np.asarray(outs[0])
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    upstream, n_calls = upstream_collectives(text)
    spec = getattr(outs[0].sharding, "spec", None)
    result = dict(
        ok=bool(got.shape == np.shape(want) and err < 1e-4), max_err=err,
        collectives=sorted({c for c in COLLECTIVES if c in text}),
        upstream=upstream, custom_calls=n_calls,
        seen=sorted({s for _, s in seen}), calls=len(seen),
        # jax < 0.9 spells out PartitionSpec(...) where newer ones print P(...).
        out_spec=str(spec).replace("PartitionSpec(", "P("),
        shard_rows=sorted({int(s.data.shape[0])
                           for s in outs[0].addressable_shards}),
        num_batch_dims=sorted({int(s) for s in
                        re.findall(r"num_batch_dims=\"(\d+)\"", text)}))
    if grid_out is not None:
        result["grid"] = sorted({int(g) for g in
                                 np.asarray(outs[grid_out]).ravel()})
    return result


def main():
    partitioner, seed = sys.argv[1], int(sys.argv[2])
    jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    rng = np.random.default_rng(seed)
    devices = jax.devices()
    assert len(devices) == 8, devices
    mesh = Mesh(np.array(devices), ("x",))
    rows = NamedSharding(mesh, P("x"))
    whole = NamedSharding(mesh, P())
    put = jax.device_put
    results = {}

    x = rng.standard_normal(N).astype(np.float32)
    m = rng.standard_normal((N, J)).astype(np.float32)
    v = rng.standard_normal(J).astype(np.float32)
    idx = rng.integers(0, T, N).astype(np.int32)
    table = rng.standard_normal((T, D)).astype(np.float32)

    # numba_cuda_kernel, batch_partitionable=True: 64 rows, 4 threads per
    # block: 16 blocks for the whole array, 2 for each device's 8 rows.
    outs1 = (jax.ShapeDtypeStruct((N,), F32), jax.ShapeDtypeStruct((N,), F32))
    k_rows = numbax.numba_cuda_kernel(scale_rows, outs1, launch_dims=N,
                                      threads_per_block=4,
                                      batch_partitionable=True)
    results["kernel_batch_partitionable"] = run(
        k_rows, (put(x, rows),), 2 * x, grid_out=1)
    # In place (input 0 aliased to output 0), 1-D: the unit axis numbax
    # adds at the end of the input goes on the output too.
    k_inplace = numbax.numba_cuda_kernel(
        scale_rows, outs1, launch_dims=N, threads_per_block=4,
        input_output_aliases={0: 0}, batch_partitionable=True)
    results["kernel_aliased"] = run(
        lambda a: k_inplace(a * 1), (put(x, rows),), 2 * x, grid_out=1)
    # The same op on one device: the whole grid.
    results["kernel_one_device"] = run(k_rows, (x,), 2 * x, grid_out=1)

    # numba_cuda_kernel, sharding_rule: matrix-vector, v whole on each device.
    k_mv = numbax.numba_cuda_kernel(
        matvec, outs1, launch_dims=N, threads_per_block=4,
        sharding_rule="i j, j -> i, i")
    results["kernel_rule_matvec"] = run(
        k_mv, (put(m, rows), put(v, whole)), m @ v, grid_out=1)
    # Rows that do not divide over the devices: XLA pads the shards.
    k_mv60 = numbax.numba_cuda_kernel(
        matvec, (jax.ShapeDtypeStruct((60,), F32),
                 jax.ShapeDtypeStruct((60,), F32)),
        launch_dims=60, threads_per_block=4, sharding_rule="i j, j -> i, i")
    results["kernel_rule_uneven"] = run(
        lambda a, b: k_mv60(a[:60], b), (put(m, rows), put(v, whole)),
        m[:60] @ v, grid_out=1)
    # A table every row reads ("gather"): whole on each device.
    k_gather = numbax.numba_cuda_kernel(
        gather_rows, jax.ShapeDtypeStruct((N, D), F32), launch_dims=N,
        sharding_rule="i, t d -> i d")
    results["kernel_rule_gather"] = run(
        k_gather, (put(idx, rows), put(table, whole)), table[idx])

    # A scalar passed by value between the buffers: rules, unit axes and
    # grid ties count the buffers only.
    k_by = numbax.numba_cuda_kernel(scale_rows_by, outs1, launch_dims=N,
                                    threads_per_block=4,
                                    batch_partitionable=True)
    results["kernel_scalar_partitionable"] = run(
        lambda a: k_by(a, 3.0), (put(x, rows),), 3 * x, grid_out=1)

    # numba_cuda_callable, batch_partitionable, with outs a function of the
    # arguments and a scalar passed by value.
    def by_func(a, k, out, grid, stream):
        note("callable_by", a.shape)
        scale_rows_by[(a.shape[0] + 3) // 4, 4, stream](a, k, out, grid)
    c_by = numbax.numba_cuda_callable(
        by_func, lambda a, k: (jax.ShapeDtypeStruct(a.shape, F32),
                               jax.ShapeDtypeStruct(a.shape, F32)),
        batch_partitionable=True)
    results["callable_scalar_shape_fn"] = run(
        lambda a: c_by(a, 3.0), (put(x, rows),), 3 * x)

    # numba_cuda_callable, sharding_rule.
    def mv_func(a, b, out, grid, stream):
        note("callable_mv", a.shape)
        matvec[(a.shape[0] + 3) // 4, 4, stream](a, b, out, grid)
    c_mv = numbax.numba_cuda_callable(mv_func, outs1,
                                      sharding_rule="i j, j -> i, i")
    results["callable_rule_matvec"] = run(
        c_mv, (put(m, rows), put(v, whole)), m @ v)

    def gather_func(i, t, out, stream):
        note("callable_gather", i.shape)
        gather_rows[(i.shape[0] + 31) // 32, 32, stream](i, t, out)
    c_gather = numbax.numba_cuda_callable(
        gather_func, jax.ShapeDtypeStruct((N, D), F32),
        sharding_rule="i, t d -> i d")
    results["callable_rule_gather"] = run(
        c_gather, (put(idx, rows), put(table, whole)), table[idx])

    # XLACustomKernel with a rule: its generated kernel is split.
    xk = numbax.XLACustomKernel("scale_out_matvec",
                                sharding_rule="i j, j -> i, i")

    @xk.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(matvec, outs, launch_dims=N,
                                        threads_per_block=4)
    results["custom_kernel_rule"] = run(
        lambda a, b: xk(a, b, outs=outs1), (put(m, rows), put(v, whole)),
        m @ v, grid_out=1)

    # jax.vmap of ops without any rule: the vmapped axis is split.
    xb = rng.standard_normal((16, 7)).astype(np.float32)
    k_aff = numbax.numba_cuda_kernel(affine, jax.ShapeDtypeStruct((7,), F32),
                                     launch_dims=7)
    results["vmap_kernel_folded"] = run(jax.vmap(k_aff), (put(xb, rows),),
                                        2 * xb + 1)
    k_z = numbax.numba_cuda_kernel(affine_z, jax.ShapeDtypeStruct((7,), F32),
                                   launch_dims=7)
    results["vmap_kernel_per_slice"] = run(jax.vmap(k_z), (put(xb, rows),),
                                           2 * xb + 1)
    xn = rng.standard_normal((8, 3, 7)).astype(np.float32)
    results["vmap_kernel_nested"] = run(
        jax.vmap(jax.vmap(k_aff)), (put(xn, rows),), 2 * xn + 1)
    mb = rng.standard_normal((16, N, J)).astype(np.float32)
    k_mv_plain = numbax.numba_cuda_kernel(matvec, outs1, launch_dims=N)
    results["vmap_kernel_broadcast_input"] = run(
        jax.vmap(k_mv_plain, in_axes=(0, None)), (put(mb, rows), put(v, whole)),
        mb @ v)
    results["vmap_kernel_uneven"] = run(
        lambda a: jax.vmap(k_aff)(a[:10]), (put(xb, rows),), 2 * xb[:10] + 1)

    def aff_func(a, out, stream):
        note("callable_vmap", a.shape)
        for b in range(a.shape[0]):
            affine[1, 32, stream](a[b], out[b])
    c_aff = numbax.numba_cuda_callable(
        aff_func, jax.ShapeDtypeStruct((7,), F32),
        vmap_method="broadcast_all")
    results["vmap_callable"] = run(jax.vmap(c_aff), (put(xb, rows),),
                                   2 * xb + 1)

    def mv_any(a, b, out, grid, stream):
        note("callable_vmap_expand", a.shape)
        for s in range(a.shape[0]):
            matvec[(a.shape[1] + 31) // 32, 32, stream](
                a[s], b[0], out[s], grid[s])
    c_mv_vmap = numbax.numba_cuda_callable(mv_any, outs1,
                                           vmap_method="expand_dims")
    results["vmap_callable_expand_dims"] = run(
        jax.vmap(c_mv_vmap, in_axes=(0, None)),
        (put(mb, rows), put(v, whole)), mb @ v)
    results["vmap_custom_kernel"] = run(
        jax.vmap(lambda a: xk(a, v, outs=outs1)), (put(mb, rows),), mb @ v)

    # vmap_method='sequential': one call for the batch, whose handler calls
    # func once per slice; each device calls it on its own slices, in order.
    # The second input holds each slice's index, which func reads on the
    # host (simulator) to record the order it saw the slices in.
    order = []

    def seq_func(a, k, out, tmp, stream):
        note("callable_sequential", a.shape)
        with seen_lock:
            order.append(int(k.copy_to_host()[0]))
        affine[1, 32, stream](a, tmp)  # through the scratch buffer
        copy_1d[1, 32, stream](tmp, out)
    spec7 = jax.ShapeDtypeStruct((7,), F32)
    ks = np.arange(16, dtype=np.float32)[:, None]
    for capture in (False, True):
        name = "vmap_callable_sequential" + ("_capture" if capture else "")
        c_seq = numbax.numba_cuda_callable(
            seq_func, spec7, scratch=spec7, vmap_method="sequential",
            capture=capture, name=f"seq_{int(capture)}")
        order.clear()
        results[name] = run(jax.vmap(c_seq), (put(xb, rows), put(ks, rows)),
                            2 * xb + 1)
        results[name]["order"] = list(order)  # of the run, not the compile
    xn3 = rng.standard_normal((8, 3, 7)).astype(np.float32)
    kn = np.arange(24, dtype=np.float32).reshape(8, 3, 1)
    order.clear()
    results["vmap_callable_sequential_nested"] = run(
        jax.vmap(jax.vmap(c_seq)), (put(xn3, rows), put(kn, rows)),
        2 * xn3 + 1)
    results["vmap_callable_sequential_nested"]["order"] = list(order)

    def seq_mv(a, b, out, grid, stream):
        note("callable_sequential_mv", a.shape)
        matvec[(a.shape[0] + 31) // 32, 32, stream](a, b, out, grid)
    c_seq_mv = numbax.numba_cuda_callable(seq_mv, outs1,
                                          vmap_method="sequential")
    results["vmap_callable_sequential_broadcast_input"] = run(
        jax.vmap(c_seq_mv, in_axes=(0, None)), (put(mb, rows), put(v, whole)),
        mb @ v)
    c_seq_plain = numbax.numba_cuda_callable(
        lambda a, k, out, tmp, stream: seq_func(a, k, out, tmp, stream),
        spec7, scratch=spec7, vmap_method="sequential")
    results["vmap_callable_sequential_uneven"] = run(
        lambda a, k: jax.vmap(c_seq_plain)(a[:10], k[:10]),
        (put(xb, rows), put(ks, rows)), 2 * xb[:10] + 1)

    # jax.export: the annotations are in the serialised module; the
    # deserialised program splits the same way. (Shardy only: jax 0.10
    # cannot call, under GSPMD, a sharded module it exported under GSPMD.)
    if partitioner == "shardy":
        results["export"] = run_exported(k_mv, rows, whole, m, v)
    print("RESULT " + json.dumps(results), flush=True)


def run_exported(k_mv, rows, whole, m, v):
    put = jax.device_put
    f = jax.jit(k_mv, in_shardings=(rows, whole), out_shardings=(rows, rows))
    exported = jax.export.export(
        f, disabled_checks=numbax.export_disabled_checks())(
        jax.ShapeDtypeStruct((N, J), F32, sharding=rows),
        jax.ShapeDtypeStruct((J,), F32, sharding=whole))
    module = exported.mlir_module()
    back = jax.export.deserialize(exported.serialize())
    r = run(back.call, (put(m, rows), put(v, whole)), m @ v)
    r["annotated"] = ("num_batch_dims" in module and
                      "sdy.sharding_rule" in module)
    return r


if __name__ == "__main__":
    main()
